"""kuryr-daemon's devices for the real-code state machine: a node switched from it.

The recording kernel (tests/unit/recording_kernel.py) with what
:mod:`kuryr_cni.binding.foreign` finds, tags and removes: OVS ports on br-int
that no owner tag names, each a :class:`Row` (its Interface's ``iface-id`` and
``attached-mac``, its ``tap`` veth whose pod end sits in a sandbox's namespace).
Its ``find_foreign`` gives the proofs :class:`kuryr_cni.binding.foreign.Finder`
gives (the name kuryr-daemon uses, the VIF's ``iface-id`` and ``attached-mac``,
the pod end here, elsewhere or gone), so what :mod:`kuryr_cni.adoption` decides
on them is the real code's decision. A *planted* row names no pod's VIF.

And :func:`sandbox_identities`: what :mod:`kuryr_cni.sandboxes` reads of the
node's processes (each live sandbox namespace's pause process, naming its pod's
UID and its container ID) from the machine's own records, so the start-up scan
does not look at this host's ``/proc``.
"""

import contextlib
import dataclasses

from kuryr_cni import adoption
from kuryr_cni import sandboxes
from kuryr_cni.binding import foreign
from tests.unit import recording_kernel


@dataclasses.dataclass
class Row:
    """One OVS port on br-int with its Interface's external_ids and its tap veth."""

    iface_id: str
    mac: str
    netns: str | None           # where the tap's pod end is; None once it went
    pod_ifname: str | None
    owner: tuple | None = None  # (container_id, ifname) once tagged (adopted)
    planted: bool = False       # names no pod's VIF


class ForeignKernel(recording_kernel.RecordingKernel):
    host_netns = None       # the node's devices are in the test's own namespace

    def __init__(self):
        super().__init__()
        self.rows = {}          # OVS port name -> Row

    # Building the world -------------------------------------------------------------

    def plant_row(self, name, iface_id, mac, netns=None, pod_ifname=None, planted=False):
        self.rows[name] = Row(iface_id, mac, netns, pod_ifname, planted=planted)
        if netns is not None:
            self.namespaces[netns][pod_ifname] = None

    def delete_netns(self, path):
        super().delete_netns(path)
        for row in self.rows.values():
            if row.netns == path:       # the veth pair goes with its pod end; the row stays
                row.netns = row.pod_ifname = None

    def untagged(self):
        """``{name: (iface-id, mac, pod end)}`` of the rows no one adopted."""
        return {name: (r.iface_id, r.mac, r.netns, r.pod_ifname)
                for name, r in self.rows.items() if r.owner is None}

    def ports(self):
        """``[(port name, iface-id)]`` of every port on br-int: ours and kuryr-daemon's."""
        ours = [('ours-%s-%s' % owner, vif.port_id) for (_, _), (vif, plug) in
                self.plugged.items() for owner in [(plug.container_id, plug.ifname)]
                if self.host.get(owner)]
        return ours + [(name, r.iface_id) for name, r in self.rows.items()]

    # The port: kuryr-daemon's devices ------------------------------------------------

    def foreign_iface_ids(self):
        return {r.iface_id for r in self.rows.values() if r.owner is None}

    def link_views(self, netns_paths):
        return {path: () for path in netns_paths if path in self.namespaces}

    def find_foreign(self, vif, netns_paths=(), views=None):
        looked = set(views if views is not None else self.link_views(netns_paths))
        expected = foreign.tap_name(vif.port_id)
        findings = []
        for name, row in sorted(self.rows.items()):
            if row.owner is not None or row.iface_id != vif.port_id:
                continue
            base = foreign.Finding(vif.kind, vif.port_id, ovs_port=name)
            if name != expected:
                findings.append(dataclasses.replace(base, reason='not_kuryr_daemon_layout'))
            elif row.mac != vif.mac:
                findings.append(dataclasses.replace(base, reason='attached_mac_mismatch'))
            elif row.netns is None:
                findings.append(dataclasses.replace(base, where=foreign.ORPHAN))
            elif row.netns in looked:
                findings.append(dataclasses.replace(
                    base, devices=(name,), where=foreign.HERE, netns=row.netns,
                    pod_ifname=row.pod_ifname))
            else:
                findings.append(dataclasses.replace(base, devices=(name,),
                                                    where=foreign.ELSEWHERE))
        return findings

    def tag_foreign(self, finding, container_id, ifname):
        row = self.rows[finding.ovs_port]
        row.owner = (container_id, ifname)
        if row.netns is not None:
            self.namespaces[row.netns][row.pod_ifname] = row.owner
        self.effects.append(('tag', 'foreign', finding.ovs_port, container_id))

    def discard_foreign(self, finding):
        row = self.rows.get(finding.ovs_port)
        if row is None or row.owner is not None:
            return
        self._drop_row(finding.ovs_port)

    def _drop_row(self, name):
        row = self.rows.pop(name)
        if row.netns is not None:
            self.namespaces.get(row.netns, {}).pop(row.pod_ifname, None)
            self.plugged.pop((row.netns, row.pod_ifname), None)
        self.effects.append(('remove', 'foreign', name, row.owner))

    # Adopted devices are ours from their tag on ----------------------------------------

    def disconnect(self, kind, plug):
        adopted = getattr(plug, 'adopted', None)
        if adopted is None:
            return super().disconnect(kind, plug)
        row = self.rows.get(adopted.ovs_port)
        # Only when its tag names this plug or it has none (the record came first).
        if row is not None and row.owner in (None, (plug.container_id, plug.ifname)):
            self._drop_row(adopted.ovs_port)
        return None

    def check(self, vif, plug):
        super().check(vif, plug)

    def tagged_host_devices(self):
        return sorted(set(super().tagged_host_devices())
                      | {r.owner for r in self.rows.values() if r.owner})

    def remove_tagged(self, container_id, ifname):
        super().remove_tagged(container_id, ifname)
        for name in [n for n, r in self.rows.items() if r.owner == (container_id, ifname)]:
            self._drop_row(name)


@contextlib.contextmanager
def sandbox_identities(identify):
    """:mod:`kuryr_cni.sandboxes` as the adoption sees it, from ``identify()``:
    ``{netns path: (pod UID, container ID)}`` of the live, identified sandboxes."""
    saved = adoption.sandboxes

    class Sandboxes:
        NETNS_DIRS = sandboxes.NETNS_DIRS

        @staticmethod
        def namespaces(exclude=(), netns_dirs=(), proc=None):
            return {path: sandboxes.Namespace(path, path) for path in identify()}

        @staticmethod
        def sandboxes_in(namespace, proc=None):
            uid, cid = identify().get(namespace.path, (None, None))
            return {uid: cid} if uid else {}

    adoption.sandboxes = Sandboxes
    try:
        yield
    finally:
        adoption.sandboxes = saved
