"""Hybrid Open vSwitch binding: the port's own Linux bridge between the pod and OVS.

What ML2/OVS with the iptables_hybrid firewall expects (kuryr-controller
writes such a port as a ``VIFBridge`` of plugin ``ovs`` whose ``bridge_name``
is ``qbr…``; :mod:`kuryr_cni.osvif` reads it as kind ``ovs-hybrid``), wired
as os-vif's OVS plugin wires it::

    host namespace                                                    pod namespace
    OVS integration_bridge          qbr<port> (Linux bridge, up, no address)
      Port/Interface qvo<port> ==== qvb<port>
      external_ids: iface-id=<port_id>       kc<hash> ================ <plug.ifname>
        attached-mac iface-status=active                                MAC, MTU, IPs, routes
        container-id kuryr-cni-owner

``qbr``, ``qvb`` and ``qvo`` are named after the port ID (cut to 14
characters) as Neutron and os-vif name them, so the agent's firewall finds
the bridge; Neutron marks the port ACTIVE once ``qvo`` is on the integration
bridge with its ``iface-id``. The pod's veth pair is made as the ``bridge``
driver makes it, its host end in the ``qbr``. All four devices carry the
owner tag (``IFLA_IFALIAS``) and the OVS row the owner key, so they are
judged and removed as every host-side device is: by the DEL of their owner,
by eviction, never by a stale DEL (DESIGN §3). The names are the port's,
not the sandbox's, so a second sandbox of the pod can plug only once the
first one's devices are evicted. A device of the port's names that carries
no owner tag may be anyone's: another port's qbr left by kuryr-daemon, a
Nova instance's (iptables_hybrid), or what a plug of this port left before it
could tag it. It is replaced only when something proves it this port's
(:func:`_proven_ours`): the qvo's OVS row naming this very VIF (``iface-id``
and ``attached-mac``, as os-vif and this driver write them), or, for the
qvb/qvo pair, sitting in a qbr tagged for this owner. Otherwise the plug is
refused and nothing is touched: a VIF naming a port ID is no proof.

The ``qbr`` bridge is created with the port and removed with it, whatever
``[binding] bridges`` says of other bridges; the integration bridge must
exist. Per connect, besides the ``ovs`` driver's work: the ``qbr`` and the
pair are created, then each of the three is tagged with IPv6 address
generation off, then brought up (two requests each); per disconnect the pod
veth's host end (its master), or else the host's ``qbr…`` devices read one
by one, lead to the owner's qbr: never a dump of every link, which costs
~1 ms a link on a node of many pods.
"""

import errno

from oslo_log import log as logging
from pyroute2.netlink.exceptions import NetlinkError

from kuryr_cni import errors
from kuryr_cni import netns
from kuryr_cni import vif as vif_model
from kuryr_cni.binding import base
from kuryr_cni.binding import bridge
from kuryr_cni.binding import ovs
from kuryr_cni.binding import ovsdb
from kuryr_cni.binding import owner_tag
from kuryr_cni.binding import podside

LOG = logging.getLogger(__name__)


def device_names(port_id):
    """``(qbr, qvb, qvo)`` of port ``port_id``, as Neutron and os-vif name them."""
    return tuple(vif_model.hybrid_device_name(prefix, port_id)
                 for prefix in ('qbr', 'qvb', 'qvo'))


class HybridDriver(ovs.OvsDriver):
    """Connects ``ovs-hybrid`` VIFs: pod veth into the port's qbr, qbr to OVS by qvb/qvo."""

    kind = 'ovs-hybrid'
    host_side = True
    installed_signal = False    # ML2/OVS's firewall: no ovn-controller sets ovn-installed

    def connect(self, vif, plug):
        """Make the qbr and the qvb/qvo pair, add qvo to OVS, then the pod's veth into the qbr.

        What this plug, or an untagged plug of this port, left before is
        replaced; a device of this port tagged for another owner makes the
        call fail untouched. A failure removes everything this call made.
        """
        owner = owner_tag.alias(plug.container_id, plug.ifname)
        qbr, qvb, qvo = device_names(vif.port_id)
        self._ensure_bridge_exists(vif.integration_bridge)
        with self._namespaces(plug) as (host, pod_fd):
            self._remove_leftovers_of_port(host, vif, (qbr, qvb, qvo), owner)
            made = []           # what this call created, to undo (qvb takes qvo with it)
            try:
                qbr_index = self._make_qbr(host, qbr, owner, made)
                self._make_uplink(host, qvb, qvo, qbr_index, owner, vif.mtu, made)
                self._add_port(qvo, owner, vif, plug, vif.integration_bridge)
                self._plug_veth(host, pod_fd, qbr_index, vif, plug)
            except BaseException:
                if made:
                    self._forget_port(qvo, owner, unowned_ours=False)
                for name in reversed(made):
                    _forget_device(host, name, owner)
                raise

    def disconnect(self, plug):
        """Remove qvo's OVS row, the qbr and the qvb/qvo pair if tagged for this plug, then
        the pod's veth as ``bridge`` does.

        The devices are found by their owner tag (a DEL knows no port ID).
        OVSDB being unreachable fails the call (code 11) before any device is
        touched, so a retry finds them all.
        """
        owner = owner_tag.alias(plug.container_id, plug.ifname)
        names = self._tagged(plug.container_id, plug.ifname)
        if names:
            self._remove_port(names[2], owner, unowned_ours=False)
            self._delete_devices(names, owner)
        bridge.BridgeDriver.disconnect(self, plug)

    def remove_host_side(self, container_id, ifname):
        """As :meth:`disconnect`, but a node without a reachable OVSDB only loses the devices."""
        owner = owner_tag.alias(container_id, ifname)
        names = self._tagged(container_id, ifname)
        if names:
            try:
                self._remove_port(names[2], owner, unowned_ours=False)
            except (ovsdb.Unavailable, errors.InvalidConfig) as exc:
                LOG.debug('No OVS port removed for %s: %s', names[2], exc.msg)
            self._delete_devices(names, owner)
        bridge.BridgeDriver.disconnect(self, base.Plug(container_id, '', ifname, False))

    # -- connect steps --------------------------------------------------------------

    def _remove_leftovers_of_port(self, host, vif, names, owner):
        """Remove this port's devices (and qvo's OVS row) left by this plug or proven the
        port's; refuse, touching nothing, when any of them is not proven ours."""
        with netns.kernel_errors('look up the devices of port %s' % vif.port_id):
            links = {name: podside.get_link(host, name) for name in names}
        for name, link in links.items():
            alias = link and link.get('ifalias')
            if alias and alias != owner:
                raise errors.BindingFailed('device %s exists and belongs to another owner'
                                           % name, 'expected alias %s, found %s'
                                           % (owner, alias))
        qvo = names[2]
        port = self._port_of(qvo)
        if port is not None and port['owner'] not in (owner, None):
            raise errors.BindingFailed('OVS port %s exists and belongs to another owner' % qvo,
                                       'expected %s=%s' % (ovs.OWNER_KEY, owner))
        row_proves = port is not None and (
            port['external_ids'].get('iface-id') == vif.port_id
            and port['external_ids'].get('attached-mac') == vif.mac)
        ours = _proven_ours(names, links, owner, row_proves)
        unproven = [name for name, link in links.items()
                    if link is not None and name not in ours]
        if unproven or (port is not None and port['owner'] is None and not row_proves):
            raise errors.BindingFailed(
                'devices of port %s exist that this daemon did not tag: %s'
                % (vif.port_id, ', '.join(unproven or [qvo + ' (OVS row)'])),
                'nothing proves them this port\'s (no owner tag, and no OVS row of %s with '
                'iface-id %s and attached-mac %s): they may be another port\'s, a Nova '
                'instance\'s or another daemon\'s, and are left alone; if they are '
                'leftovers, delete them' % (qvo, vif.port_id, vif.mac))
        if port is not None:
            self._remove_port(qvo, owner)
        leftovers = [name for name, link in links.items() if link is not None]
        if leftovers:
            LOG.info('Replacing what %s left of port %s: %s', owner, vif.port_id,
                     ', '.join(leftovers))
            for name in leftovers:
                podside.delete_owned_link(host, name, owner, 'on the host', untagged_ours=True)

    def _make_qbr(self, host, name, owner, made):
        """Create the port's bridge: tagged, without IPv6 addresses, up; return its index."""
        with netns.kernel_errors('create bridge %s' % name):
            reply = host.link('add', ifname=name, kind='bridge')
            made.append(name)
            index = _index_of(host, reply, name)
            _tag_and_raise(host, index, owner)
        return index

    def _make_uplink(self, host, qvb, qvo, qbr_index, owner, mtu, made):
        """Create the qvb/qvo pair, qvb in the qbr; both tagged, without IPv6 addresses, up."""
        with netns.kernel_errors('create veth %s and %s' % (qvb, qvo)):
            reply = host.link('add', ifname=qvb, kind='veth', mtu=mtu, master=qbr_index,
                              peer={'ifname': qvo, 'mtu': mtu})
            made.append(qvb)
            for name in (qvb, qvo):
                _tag_and_raise(host, _index_of(host, reply if name == qvb else None, name), owner)

    # -- disconnect steps -----------------------------------------------------------

    def _tagged(self, container_id, ifname):
        """``(qbr, qvb, qvo)`` of the hybrid port whose qbr is tagged for this owner, or ().

        The qbr is the anchor: made first, removed last. Found through the
        pod veth's host end when it is still there (its master), else among
        the host's ``qbr…`` devices, read one by one; never by a dump of every
        link, which a node of many pods pays ~1 ms a link for.
        """
        owner = owner_tag.alias(container_id, ifname)
        with netns.iproute(self.host_netns) as host, \
                netns.kernel_errors('look up the hybrid devices of %s' % container_id):
            end = podside.get_link(host, owner_tag.host_ifname(container_id, ifname))
            if end is not None and end.get('ifalias') == owner and end.get('master'):
                candidates = [netns.link_name(end.get('master'), self.host_netns)]
            else:
                candidates = sorted(name for name in netns.device_names(self.host_netns)
                                    if name.startswith('qbr'))
            for name in candidates:
                link = podside.get_link(host, name) if name else None
                if link is not None and link.get('ifalias') == owner:
                    return (name, 'qvb' + name[3:], 'qvo' + name[3:])
        return ()

    def _delete_devices(self, names, owner):
        """Delete the qvb/qvo pair (through qvb, or qvo if it alone is left), then the qbr.

        The pair is deleted untagged too when it sits in this owner's qbr (a plug
        stopped before tagging it).
        """
        qbr, qvb, qvo = names
        with netns.iproute(self.host_netns) as host:
            with netns.kernel_errors('look up the devices of %s' % qbr):
                ours = _proven_ours(names, {name: podside.get_link(host, name)
                                            for name in names}, owner, False)
            for name in (qvb, qvo, qbr):
                podside.delete_owned_link(host, name, owner, 'on the host',
                                          untagged_ours=name in ours)

    # -- check ------------------------------------------------------------------------

    def _check_enslaved(self, host, link, vif, plug):
        """The pod veth in the qbr, the qbr up and tagged, qvb in it, qvo on OVS."""
        owner = owner_tag.alias(plug.container_id, plug.ifname)
        qbr, qvb, qvo = device_names(vif.port_id)
        problems = []
        links = {name: podside.get_link(host, name) for name in (qbr, qvb, qvo)}
        for name, found in links.items():
            if found is None:
                problems.append('device %s is missing' % name)
            elif found.get('ifalias') != owner:
                problems.append('device %s has alias %r, not %r'
                                % (name, found.get('ifalias'), owner))
        if links[qbr] is not None:
            for name, found in ((link.get('ifname'), link), (qvb, links[qvb])):
                if found is not None and found.get('master') != links[qbr]['index']:
                    problems.append('%s is not in bridge %s' % (name, qbr))
        return problems + self._check_port(qvo, vif.integration_bridge, vif, plug)


def _proven_ours(names, links, owner, row_proves):
    """Which of ``names`` (qbr, qvb, qvo) are proven this plug's; ``links`` maps each
    to its link message or None.

    Tagged for ``owner``; or untagged and ``row_proves`` (the qvo's OVS row
    names this very VIF); or untagged qvb in a qbr tagged for ``owner``, and
    untagged qvo whose veth peer is that qvb: a plug that made the pair into
    its own qbr and stopped before tagging it. The qvb/qvo names are the
    port's, so an untagged pair is never taken on its name alone.
    """
    qbr, qvb, qvo = (links[name] for name in names)
    ours = {name for name, link in links.items()
            if link is not None and (link.get('ifalias') == owner
                                     or (row_proves and not link.get('ifalias')))}
    if qbr is not None and qbr.get('ifalias') == owner and qvb is not None \
            and qvb.get('master') == qbr['index']:
        ours.add(names[1])
        if qvo is not None and not qvo.get('ifalias') and qvo.get('link') == qvb['index']:
            ours.add(names[2])
    return ours


def _tag_and_raise(host, index, owner):
    """Tag link ``index`` with its owner, turn IPv6 addresses off, then bring it up.

    Two requests: in one, the kernel brings the link up first, and a link
    with carrier (a qvo whose qvb is up) gets its link-local address before
    address generation is turned off.
    """
    podside.set_without_ipv6_addresses(host, index, ifalias=owner)
    host.link('set', index=index, state='up')


def _forget_device(host, name, owner):
    """Best-effort removal of a half-made device of ours for an undo; never raises."""
    try:
        podside.delete_owned_link(host, name, owner, 'on the host', untagged_ours=True)
    except Exception:   # the original error matters more
        LOG.exception('Could not remove half-made device %s', name)


def _index_of(host, reply, name):
    """The index of the new link ``name``, from an echoed creation or a look-up."""
    for msg in reply or ():
        if msg.get('ifname') == name:
            return msg['index']
    link = podside.get_link(host, name)
    if link is None:
        raise NetlinkError(errno.ENODEV, '%s vanished while being set up' % name)
    return link['index']
