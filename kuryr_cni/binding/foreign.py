"""Devices kuryr-daemon (kuryr-kubernetes 10.0.0, through os-vif) made for a VIF.

What that daemon leaves on a node, per VIF kind (read from its 10.0.0
sources and os-vif 3.5's; nothing of it carries an owner tag)::

    ovs         pod: <ifname> (veth, the VIF's MAC)  ====  host: tap<port[:11]>
                OVS port and Interface tap<port[:11]> on vif.bridge, external_ids
                iface-id=<port> iface-status=active attached-mac=<mac> vm-uuid=kuryr
    ovs-hybrid  pod: <ifname> (veth) ==== host: tap<port[:11]>, in bridge qbr<port[:11]>
                qbr<port[:11]> ... qvb<port[:11]> ==== qvo<port[:11]> on the integration
                bridge, external_ids as above with vm-uuid=<pod UID>
    vlan        pod: <ifname>, kind vlan on the trunk parent, the VIF's VLAN ID and MAC
    macvlan     pod: <ifname>, kind macvlan (mode bridge) on the parent, the VIF's MAC

:class:`Finder` looks for them and says, per device set, whether it is
proven the VIF's: an OVS row named as that daemon names the port's, with the
VIF's ``iface-id`` **and** ``attached-mac``, its devices in that layout, and
the pod end (a veth peer, or the nested device) with the VIF's MAC (and VLAN
ID) in the namespace looked at. A VIF naming a port is no proof on its own:
anything else is a :class:`Finding` with a ``reason`` and is left alone.

Adopting (:meth:`Finder.tag`) writes our owner tag on each device and the
owner key on the OVS row, so from then on they are judged as ours are;
:meth:`Finder.release` removes them by the names the binding record keeps
(their names are the port's, not derived from the owner). Nothing here
decides when: :mod:`kuryr_cni.adoption` does.
"""

import dataclasses

from oslo_log import log as logging

from kuryr_cni import errors
from kuryr_cni import netns
from kuryr_cni import vif as vif_model
from kuryr_cni.binding import ovs
from kuryr_cni.binding import owner_tag
from kuryr_cni.binding import podside

LOG = logging.getLogger(__name__)

SOURCE = 'kuryr-daemon'
HERE, ELSEWHERE, ORPHAN = 'here', 'elsewhere', 'orphan'   # where the pod end is
NESTED_KINDS = ('vlan', 'macvlan')


@dataclasses.dataclass(frozen=True)
class Finding:
    """Devices found for one VIF, proven its (``reason`` None) or not (why)."""

    kind: str
    port_id: str
    devices: tuple = ()         # host devices, in removal order
    ovs_port: str | None = None
    where: str | None = None    # HERE (pod end in the namespace looked at), ELSEWHERE, ORPHAN
    netns: str | None = None    # the namespace holding the pod end, when HERE
    pod_ifname: str | None = None
    reason: str | None = None   # None: proven the VIF's; else why it is left alone
    detail: str = ''

    @property
    def proven(self):
        return self.reason is None

    def describe(self):
        names = list(self.devices) + ([self.pod_ifname] if self.pod_ifname else [])
        return ', '.join(names) or (self.ovs_port or '-')


def tap_name(port_id):
    """kuryr-daemon's host end of a pod's veth (os-vif's ``vif_name``)."""
    return vif_model.hybrid_device_name('tap', port_id)


def link_view(link):
    """The few attributes of a link message the proofs read, as a plain dict."""
    return {'index': link['index'], 'ifname': link.get('ifname'),
            'address': link.get('address'), 'link': link.get('link'),
            'master': link.get('master'), 'alias': link.get('ifalias'),
            'kind': link.get(('linkinfo', 'kind')),
            'vlan_id': link.get(('linkinfo', 'data', 'vlan_id'))}


def dump(path, host=None):
    """``link_view`` of every link in namespace ``path`` (one netlink dump)."""
    with netns.open_netns(path, host=host) as fd, netns.iproute(fd) as ipr, \
            netns.kernel_errors('list the links of %s' % path):
        return [link_view(link) for link in ipr.link('dump')]


class Finder:
    """Finds, tags and removes kuryr-daemon's devices; host side in ``host_netns``."""

    def __init__(self, host_netns=None, options=None):
        self.host_netns = host_netns
        self._ovs = ovs.OvsDriver(host_netns, options)     # its OVSDB steps

    # -- finding --------------------------------------------------------------

    def probe(self, vif, views):
        """Findings for ``vif``; ``views`` maps namespace paths to their :func:`dump`,
        where a pod end is looked for (usually the one namespace of a request)."""
        if vif.kind in NESTED_KINDS:
            return [f for path, links in views.items() for f in _nested(vif, path, links)]
        if vif.kind not in ('ovs', 'ovs-hybrid'):
            return []
        return [self._locate(vif, finding, views) for finding in self._host_side(vif)]

    def foreign_iface_ids(self):
        """The ``iface-id`` of every OVS Interface row without our owner key.

        Raises :class:`ovsdb.Unavailable` (code 11) when OVSDB cannot be
        reached, :class:`errors.InvalidConfig` for a bad connection string.
        """
        rows = self._ovs.ovsdb.transact({'op': 'select', 'table': 'Interface', 'where': [],
                                         'columns': ['external_ids']})[0]['rows']
        ids = (ovs._py_map(row['external_ids']) for row in rows)
        return {i['iface-id'] for i in ids if 'iface-id' in i and ovs.OWNER_KEY not in i}

    def _host_side(self, vif):
        hybrid = vif.kind == 'ovs-hybrid'
        expected = vif_model.hybrid_device_name('qvo' if hybrid else 'tap', vif.port_id)
        findings = []
        for name, ids in sorted(self._rows(vif.port_id, expected).items()):
            if ovs.OWNER_KEY in ids:
                continue            # ours: a binding records it
            base = Finding(vif.kind, vif.port_id, ovs_port=name)
            if name != expected:
                findings.append(dataclasses.replace(
                    base, reason='not_kuryr_daemon_layout',
                    detail='OVS port %s carries iface-id %s but kuryr-daemon names it %s'
                           % (name, vif.port_id, expected)))
            elif ids.get('iface-id') != vif.port_id:
                findings.append(dataclasses.replace(
                    base, reason='iface_id_mismatch',
                    detail='OVS port %s has iface-id %r, not %s'
                           % (name, ids.get('iface-id'), vif.port_id)))
            elif ids.get('attached-mac') != vif.mac:
                findings.append(dataclasses.replace(
                    base, reason='attached_mac_mismatch',
                    detail='OVS port %s has attached-mac %r, not %s'
                           % (name, ids.get('attached-mac'), vif.mac)))
            else:
                findings.append(self._devices(vif, base, hybrid))
        return findings

    def _rows(self, port_id, expected):
        """``{name: external_ids}`` of the Interface rows naming ``port_id`` or named
        ``expected``."""
        by_id, by_name = self._ovs.ovsdb.transact(
            {'op': 'select', 'table': 'Interface', 'columns': ['name', 'external_ids'],
             'where': [['external_ids', 'includes', ovs._ovs_map({'iface-id': port_id})]]},
            {'op': 'select', 'table': 'Interface', 'columns': ['name', 'external_ids'],
             'where': [['name', '==', expected]]})
        return {row['name']: ovs._py_map(row['external_ids'])
                for row in by_id['rows'] + by_name['rows']}

    def _devices(self, vif, base, hybrid):
        """The host devices of a proven row, checked against kuryr-daemon's layout."""
        tap = tap_name(vif.port_id)
        names = (tap,) + (tuple(vif_model.hybrid_device_name(p, vif.port_id)
                                for p in ('qvb', 'qvo', 'qbr')) if hybrid else ())
        with netns.iproute(self.host_netns) as host, \
                netns.kernel_errors('look up the devices of port %s' % vif.port_id):
            links = {name: podside.get_link(host, name) for name in names}
        views = {name: link_view(link) for name, link in links.items() if link is not None}
        for name, view in views.items():
            if view['alias'] and owner_tag.parse_alias(view['alias']) is None:
                return dataclasses.replace(base, reason='tagged_by_someone_else',
                                           detail='%s has alias %r' % (name, view['alias']))
        if hybrid and names[3] in views:
            qbr = views[names[3]]['index']
            strays = [name for name in (tap, names[1]) if name in views
                      and views[name]['master'] != qbr]
            if strays:
                return dataclasses.replace(
                    base, reason='not_kuryr_daemon_layout',
                    detail='%s not in bridge %s' % (', '.join(strays), names[3]))
        found = tuple(name for name in names if name in views)
        return dataclasses.replace(base, devices=found, where=None if tap in views else ORPHAN)

    def _locate(self, vif, finding, views):
        """Find the pod end of a proven finding's tap among ``views``."""
        if not finding.proven or finding.where == ORPHAN:
            return finding
        with netns.iproute(self.host_netns) as host, \
                netns.kernel_errors('look up %s' % tap_name(finding.port_id)):
            tap = link_view(podside.get_link(host, tap_name(finding.port_id)))
        # The peer's index in its namespace, and its peer is our tap. Indexes are per
        # namespace: another namespace may hold a veth pair with the same two (every
        # pod's eth0 is index 2 or so, its host end a small index of its own host), so
        # the VIF's MAC picks the pod end among them, and two such are no proof.
        candidates = [(path, link) for path, links in sorted(views.items()) for link in links
                      if link['index'] == tap['link'] and link['link'] == tap['index']
                      and link['kind'] == 'veth']
        ends = [(path, link) for path, link in candidates if link['address'] == vif.mac]
        if len(ends) == 1:
            path, link = ends[0]
            return dataclasses.replace(finding, where=HERE, netns=path,
                                       pod_ifname=link['ifname'])
        if ends:
            return dataclasses.replace(
                finding, where=HERE, netns=ends[0][0], pod_ifname=ends[0][1]['ifname'],
                reason='pod_end_ambiguous', detail='veths with MAC %s peering %s in %s'
                % (vif.mac, tap_name(finding.port_id), ', '.join(p for p, _ in ends)))
        if candidates:
            path, link = candidates[0]
            return dataclasses.replace(
                finding, where=HERE, netns=path, pod_ifname=link['ifname'],
                reason='mac_mismatch', detail='the pod end %s has MAC %s, not %s'
                % (link['ifname'], link['address'], vif.mac))
        return dataclasses.replace(finding, where=ELSEWHERE)

    # -- taking over ----------------------------------------------------------

    def tag(self, finding, container_id, ifname):
        """Write the owner tag of (``container_id``, ``ifname``) on a proven finding's
        devices, the pod end and the OVS row."""
        owner = owner_tag.alias(container_id, ifname)
        with netns.iproute(self.host_netns) as host, \
                netns.kernel_errors('tag the devices of port %s' % finding.port_id):
            for name in finding.devices:
                link = podside.get_link(host, name)
                if link is not None:
                    host.link('set', index=link['index'], ifalias=owner)
        if finding.netns and finding.pod_ifname:
            with netns.open_netns(finding.netns, host=self.host_netns) as fd, \
                    netns.iproute(fd) as pod, \
                    netns.kernel_errors('tag %s in %s' % (finding.pod_ifname, finding.netns)):
                link = podside.get_link(pod, finding.pod_ifname)
                if link is not None:
                    pod.link('set', index=link['index'], ifalias=owner)
        if finding.ovs_port:
            self._ovs.ovsdb.transact({
                'op': 'mutate', 'table': 'Interface',
                'where': [['name', '==', finding.ovs_port]],
                'mutations': [['external_ids', 'insert', ovs._ovs_map(
                    {ovs.OWNER_KEY: owner, 'container-id': container_id})]]})

    def release(self, adopted, plug):
        """Remove what the record ``adopted`` names for ``plug``: the OVS row, the host
        devices (a veth takes its pod end along), the pod-side interface.

        Each is removed only when its tag names this plug or it has none (the
        record, written before tagging, names it: an adoption killed between
        the two). Gone already is not an error.
        """
        owner = owner_tag.alias(plug.container_id, plug.ifname)
        if adopted.ovs_port:
            self._ovs._remove_port(adopted.ovs_port, owner)
        with netns.iproute(self.host_netns) as host:
            for name in adopted.devices:
                podside.delete_owned_link(host, name, owner, 'on the host', untagged_ours=True)
        if plug.netns and netns.exists(plug.netns):
            with netns.open_netns(plug.netns, host=self.host_netns) as fd, \
                    netns.iproute(fd) as pod:
                podside.delete_owned_link(pod, plug.ifname, owner, 'in %s' % plug.netns,
                                          untagged_mac=plug.mac)

    def discard(self, finding):
        """Remove a proven finding's untagged devices and row, never adopted: a new
        sandbox of the pod evicts them, or their pod end is gone."""
        with netns.iproute(self.host_netns) as host:
            for name in finding.devices:
                podside.delete_owned_link(host, name, '', 'on the host', untagged_ours=True)
        if finding.ovs_port:
            # The row last: while it stands, a retry proves the devices again.
            self._ovs._remove_port(finding.ovs_port, None)

    def check(self, vif, plug):
        """Raise CheckFailed when an adopted interface's devices are not all in place."""
        owner = owner_tag.alias(plug.container_id, plug.ifname)
        problems = []
        with netns.iproute(self.host_netns) as host:
            for name in plug.adopted.devices:
                link = podside.get_link(host, name)
                if link is None:
                    problems.append('adopted device %s is missing' % name)
                elif link.get('ifalias') != owner:
                    problems.append('adopted device %s has alias %r, not %r'
                                    % (name, link.get('ifalias'), owner))
        if plug.adopted.ovs_port:
            port = self._ovs._port_of(plug.adopted.ovs_port)
            if port is None:
                problems.append('adopted OVS port %s is missing' % plug.adopted.ovs_port)
            elif port['external_ids'].get('iface-id') != vif.port_id:
                problems.append('adopted OVS port %s has iface-id %r, not %r' % (
                    plug.adopted.ovs_port, port['external_ids'].get('iface-id'), vif.port_id))
        with netns.open_netns(plug.netns, host=self.host_netns) as fd, netns.iproute(fd) as pod:
            link = podside.get_link(pod, plug.ifname)
        if link is None or link.get('address') != vif.mac:
            problems.append('%s with MAC %s is missing in %s' % (plug.ifname, vif.mac, plug.netns))
        if problems:
            raise errors.CheckFailed('adopted interface %s differs' % plug.ifname,
                                     '; '.join(problems))


def _nested(vif, path, links):
    """Findings of nested devices in one namespace: the VIF's MAC and kind (and VLAN ID)
    proves one; a vlan/macvlan device without it is reported."""
    findings = []
    for link in links:
        if link['kind'] not in NESTED_KINDS or owner_tag.parse_alias(link['alias']):
            continue
        base = Finding(vif.kind, vif.port_id, where=HERE, netns=path, pod_ifname=link['ifname'])
        if link['address'] != vif.mac:
            findings.append(dataclasses.replace(
                base, reason='mac_mismatch', detail='%s %s has MAC %s, not %s' % (
                    link['kind'], link['ifname'], link['address'], vif.mac)))
        elif link['kind'] != vif.kind:
            findings.append(dataclasses.replace(
                base, reason='kind_mismatch',
                detail='%s is a %s device, the VIF is %s' % (link['ifname'], link['kind'],
                                                             vif.kind)))
        elif vif.kind == 'vlan' and link['vlan_id'] != vif.vlan_id:
            findings.append(dataclasses.replace(
                base, reason='vlan_id_mismatch', detail='%s has VLAN ID %s, not %s' % (
                    link['ifname'], link['vlan_id'], vif.vlan_id)))
        else:
            findings.append(base)
    return findings
