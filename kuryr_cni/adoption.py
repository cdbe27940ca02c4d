"""Taking over the pods kuryr-daemon plugged, with proof (issue 33 item 1).

A node switched from kuryr-daemon keeps its running pods, plugged with
kuryr-daemon's devices (:mod:`kuryr_cni.binding.foreign`), which no binding
records. They are adopted into bindings, so the rules of DESIGN §3 hold for
them as for our own: the owner's DEL removes everything, a stale DEL nothing,
a new sandbox evicts them. Four moments, each under the lock of the pod served:

* **the DEL of a sandbox of a pod without binding** (:meth:`Adopter.adopt_for_delete`):
  devices proven the pod's VIF whose pod end lives in the DEL's ``CNI_NETNS``
  are that sandbox's, the runtime says so: they are recorded as its binding,
  tagged, and the DEL then removes them as the owner's. Proven devices
  without a pod end any more (the namespace went with the veth; the OVS row,
  the hybrid ``qbr/qvb/qvo`` stayed) are removed. Devices whose pod end
  lives in another namespace are another sandbox's: left alone, a stale DEL.
* **the ADD of a new sandbox** (:meth:`Adopter.evict_foreign`): proven OVS
  devices of the pod's VIFs go before it plugs, so no ``iface-id`` is ever on
  two ports, as our own older sandboxes are evicted.
* **the ADD of another pod** (:meth:`Adopter.held_elsewhere`): a port whose
  proven kuryr-daemon devices are another pod's current VIF is that pod's, so
  an ADD whose VIF names it (a hostile or mistaken annotation) is refused by
  the address fence as if that pod's binding held it.
* **start-up, once the watcher has the pods' VIFs** (:meth:`Adopter.scan`, run
  once by housekeeping): every pod of the node without binding is looked for
  in every namespace; proven devices whose namespace's sandbox is identified
  (:mod:`kuryr_cni.sandboxes`) are adopted under that container ID and that
  namespace. That the sandbox is identified is what makes this safe ahead of
  any request: its CHECK, its DEL and a stale DEL are then judged by the
  record. One not identified is left to the DEL path above.

Nothing is adopted on a VIF's word: a device is taken only with the proofs
of :mod:`kuryr_cni.binding.foreign`. Nor beside another pod: an adoption
records its VIFs' port, MAC and IPs only once the address fence
(:meth:`kuryr_cni.registry.BindingTable.reserve_addresses`) says no other pod
of the node holds one of them. Refused, the scan leaves the devices alone
(``address_taken``); the DEL of their own sandbox removes them unrecorded, as
an orphan's: its runtime says they are that sandbox's and it is going.

Every finding is counted (``kuryr_cni_adoptions_total{result, reason}``),
logged, and listed for ``kuryr-cni-ctl adoptions``.
"""

import time
import uuid

from oslo_log import log as logging

from kuryr_cni import errors
from kuryr_cni import metrics
from kuryr_cni import ownership as rules
from kuryr_cni import records
from kuryr_cni import sandboxes
from kuryr_cni.binding import foreign

LOG = logging.getLogger(__name__)

ADOPTED, LEFT, REMOVED = 'adopted', 'left', 'removed'
ADDRESS_TAKEN = 'address_taken'     # another pod of the node holds the VIF's port, MAC or IP
SCAN_LOCK_TIMEOUT = 5       # seconds to wait for one pod's lock during the start-up scan
RESERVATION = 30            # seconds an adoption's addresses stay reserved if its worker dies
# Seconds a worker trusts its list of the iface-ids on OVS rows we did not tag. While
# this daemon runs no other CNI daemon plugs, so the list only shrinks: once empty it
# stays empty, and an ADD pays no OVSDB look-up for kuryr-daemon's devices any more.
FOREIGN_REFRESH = 60.0
NETWORK = 'kuryr'           # the attachment's network name kuryr's CNI config uses


class Adopter:
    """Finds and adopts kuryr-daemon's devices; ``kernel`` is :class:`kuryr_cni.kernel.Kernel`."""

    def __init__(self, kernel, registry, netns_dirs=sandboxes.NETNS_DIRS):
        self.kernel = kernel
        self.registry = registry
        self.netns_dirs = netns_dirs
        self._foreign_ids = None        # (time.monotonic(), set of iface-ids), per process

    # The DEL of a sandbox of a pod without binding ---------------------------

    def adopt_for_delete(self, req, save):
        """Adopt what kuryr-daemon made for ``req``'s sandbox; returns the binding
        (persisted by ``save``) or None when nothing of it was found."""
        interfaces = self._interfaces(req.pod, req.ifname)
        paths = [req.netns] if req.netns else []
        adopted = []
        for interface in interfaces:
            if not self._may_be_foreign(interface.vif):
                continue
            for finding in self.kernel.find_foreign(interface.vif, paths):
                if finding.proven and finding.where == foreign.HERE:
                    adopted.append((interface, finding))
                elif finding.proven and finding.where == foreign.ORPHAN:
                    self.kernel.discard_foreign(finding)
                    self._note(REMOVED, 'orphan', req.pod.key, req.container_id, finding)
                else:
                    self._note(LEFT, finding.reason or _unproven_where(finding), req.pod.key,
                               req.container_id, finding)
        if not adopted:
            return None
        binding = self._adopt(req.pod.key, req.pod.uid, req.container_id, req.netns,
                              req.network, adopted, save)
        if binding is None:
            # Another pod of the node holds the port (its VIF names it too): no
            # record of ours may, yet this very sandbox is going, so its proven
            # devices go, unrecorded like an orphan's (a retried DEL proves them again).
            for _, finding in adopted:
                self.kernel.discard_foreign(finding)
                self._note(REMOVED, ADDRESS_TAKEN, req.pod.key, req.container_id, finding)
        return binding

    # The ADD of a new sandbox ------------------------------------------------------

    def evict_foreign(self, req, vifs):
        """Remove the proven OVS devices of ``vifs`` not adopted: the new sandbox
        takes the port. Nested devices are evicted only once adopted (their
        namespace is unknown until then)."""
        for vif in vifs.values():
            if vif.kind not in ('ovs', 'ovs-hybrid') or not self._may_be_foreign(vif):
                continue
            for finding in self.kernel.find_foreign(vif):
                if finding.proven:
                    LOG.info('Pod %s: sandbox %s evicts what kuryr-daemon plugged: %s',
                             req.pod.key, req.container_id, finding.describe())
                    self.kernel.discard_foreign(finding)
                    self._note(REMOVED, 'evicted', req.pod.key, req.container_id, finding)
                else:
                    self._note(LEFT, finding.reason, req.pod.key, req.container_id, finding)

    def held_elsewhere(self, pod_key, vifs):
        """``{'port <id>': pod}`` for each OVS port of ``vifs`` on which kuryr-daemon's
        devices are proven the current VIF of another pod of the node.

        The address fence of an ADD (:meth:`kuryr_cni.ownership.Ownership._admit`)
        counts them as that pod's: kuryr-daemon plugged them for it, and a second
        port of the same ``iface-id`` would let OVN bind either. The port named by
        ``pod_key``'s VIF with another MAC is no proof of its own (a hostile or
        mistaken annotation), so the pod whose VIF the devices prove keeps it.
        """
        ports = {vif.port_id for vif in vifs.values()
                 if vif.kind in ('ovs', 'ovs-hybrid') and self._may_be_foreign(vif)}
        if not ports:
            return {}       # the usual case: no look-up beyond the cached iface-ids
        held = {}
        for key, record in sorted(self.registry.pods.snapshot().items()):
            if key == pod_key:
                continue
            for vif in (_vifs(record) or {}).values():
                if vif.port_id in ports and any(
                        finding.proven for finding in self.kernel.find_foreign(vif)):
                    held.setdefault('port ' + vif.port_id, key)
        return held

    def _may_be_foreign(self, vif):
        """Whether kuryr-daemon's devices of ``vif`` may exist: always for nested kinds
        (in the pod's namespace, looked at anyway), for OVS kinds only while an OVS
        row we did not tag carries its port (see FOREIGN_REFRESH).

        OVSDB out of reach counts as no row: nothing can be proven, and a DEL must
        not fail for as long as it is (a node with no Open vSwitch at all, a VIF
        refused by policy); what kuryr-daemon left is found later (a new sandbox's
        ADD, the next start)."""
        if vif.kind in foreign.NESTED_KINDS:
            return True
        cached = self._foreign_ids
        if cached is None or (cached[1] and time.monotonic() - cached[0] > FOREIGN_REFRESH):
            ids = self.kernel.foreign_iface_ids()
            if ids is None:
                return False
            cached = self._foreign_ids = (time.monotonic(), ids)
        return vif.port_id in cached[1]

    # Start-up ----------------------------------------------------------------

    def scan(self, ownership):
        """Adopt every identified sandbox's devices of every pod without binding;
        returns ``(adopted, left)`` counts."""
        pods = self.registry.pods.snapshot()
        iface_ids = self.kernel.foreign_iface_ids() or set()    # None: no OVS to look at
        wanted = {}
        for key, record in sorted(pods.items()):
            vifs = _vifs(record)
            if vifs and any(v.kind in foreign.NESTED_KINDS or v.port_id in iface_ids
                            for v in vifs.values()):
                wanted[key] = (record, vifs)
        if not wanted:
            return 0, 0
        spaces = sandboxes.namespaces(exclude=self._host_paths(), netns_dirs=self.netns_dirs)
        # {path: {pod UID: sandbox container ID}}: one read of each process's cgroup.
        owners = {space.path: sandboxes.sandboxes_in(space) for space in spaces.values()}
        views = self.kernel.link_views(owners)      # one dump of each namespace
        counts = [0, 0]
        for key, (record, vifs) in wanted.items():
            try:
                with ownership.locks.hold(key, time.monotonic() + SCAN_LOCK_TIMEOUT) \
                        as remove_lock:
                    if ownership.store.load(key) is None:
                        self._scan_pod(ownership, key, record, vifs, owners, views, counts)
                    if ownership.store.load(key) is None:
                        remove_lock()   # nothing adopted: the pod has no binding to lock
            except (errors.TryAgainLater, errors.UnreadableState) as exc:
                LOG.info('Adoption scan skips pod %s: %s', key, exc.msg)
            except errors.CNIError as exc:
                LOG.warning('Adoption scan of pod %s failed: %s %s', key, exc.msg, exc.details)
        LOG.info('Adoption scan: adopted %d devices of kuryr-daemon, left %d alone', *counts)
        return tuple(counts)

    def _scan_pod(self, ownership, key, record, vifs, owners, views, counts):
        """Adopt the devices of one pod: a veth's pod end is found in any namespace
        (its index pair and the VIF's MAC prove it); a nested device only in a namespace whose
        processes name this pod, which is then the pod's (others hold other pods)."""
        uid = record.get('uid')
        own = [path for path, pods in owners.items() if uid and uid in pods]
        by_sandbox = {}
        for interface in rules.pod_interfaces(vifs, rules.PRIMARY_IFNAME):
            nested = interface.vif.kind in foreign.NESTED_KINDS
            looked = {path: views[path] for path in (own if nested else views) if path in views}
            for finding in self.kernel.find_foreign(interface.vif, views=looked):
                cid = None
                if finding.proven and finding.where == foreign.HERE:
                    cid = owners[finding.netns].get(uid) if uid else None
                if cid is None:
                    self._note(LEFT, finding.reason or _unproven_where(finding), key, None,
                               finding)
                    counts[1] += 1
                    continue
                by_sandbox.setdefault((cid, finding.netns), []).append((interface, finding))
        for (cid, path), adopted in by_sandbox.items():
            if self._adopt(key, uid, cid, path, NETWORK, adopted, ownership._save) is None:
                for _, finding in adopted:
                    self._note(LEFT, ADDRESS_TAKEN, key, cid, finding)
                counts[1] += len(adopted)
            else:
                counts[0] += len(adopted)

    def _host_paths(self):
        return [path for path in ('/proc/self/ns/net', self.kernel.host_netns) if path]

    # Shared ---------------------------------------------------------------------

    def _adopt(self, pod_key, uid, cid, netns, network, adopted, save):
        """Record, then tag, ``adopted`` [(interface, finding)] as ``cid``'s attachment;
        returns the binding, or None when another pod of the node holds one of their
        addresses (nothing changed then)."""
        addresses = {a for interface, _ in adopted
                     for a in records.vif_addresses(interface.vif)}
        # The fence's reservation, as an ADD's: no other pod's ADD may take these
        # addresses between this check and the record, which holds them from then on.
        token = 'adoption-' + uuid.uuid4().hex
        taken = self.registry.bindings.reserve_addresses(
            cid, pod_key, addresses, time.monotonic() + RESERVATION, token)
        if taken:
            LOG.warning('Pod %s: not adopting sandbox %s from kuryr-daemon: %s', pod_key, cid,
                        ', '.join('%s is bound to pod %s' % item for item in sorted(taken.items())))
            return None
        try:
            return self._record_and_tag(pod_key, uid, cid, netns, network, adopted, save)
        finally:
            self.registry.bindings.add_finished(token)

    def _record_and_tag(self, pod_key, uid, cid, netns, network, adopted, save):
        interfaces = []
        for interface, finding in adopted:
            interfaces.append(records.Interface(
                finding.pod_ifname or interface.ifname, interface.vif,
                interface.default_route,
                records.Adopted(foreign.SOURCE, finding.devices, finding.ovs_port)))
        ifname = interfaces[0].ifname
        attachment = records.Attachment(network, ifname, interfaces, state=records.READY,
                                        added_at=time.time())
        sandbox = records.Sandbox(cid, netns, uid, {attachment.key: attachment})
        binding = records.Binding(pod_key, owner=cid, uid=uid, sandboxes={cid: sandbox})
        save(binding)       # durable before any device changes: the record names them all
        for interface, (_, finding) in zip(interfaces, adopted):
            self.kernel.tag_foreign(finding, cid, interface.ifname)
            self._note(ADOPTED, 'proven', pod_key, cid, finding)
        LOG.info('Pod %s: adopted sandbox %s in %s from kuryr-daemon: %s', pod_key, cid, netns,
                 '; '.join(f.describe() for _, f in adopted))
        return binding

    def _interfaces(self, pod, cni_ifname):
        """The pod's interfaces from the watcher's record, if it is this incarnation's."""
        record = self.registry.pods.get(pod.key)
        if not record or (pod.uid and record.get('uid') not in (None, pod.uid)):
            return []
        vifs = _vifs(record)
        return rules.pod_interfaces(vifs, cni_ifname) if vifs else []

    def _note(self, result, reason, pod_key, cid, finding):
        metrics.adoption(result, reason)
        entry = {'time': time.time(), 'pod': pod_key, 'container_id': cid,
                 'result': result, 'reason': reason, 'kind': finding.kind,
                 'port_id': finding.port_id, 'devices': finding.describe(),
                 'netns': finding.netns, 'detail': finding.detail}
        if result == LEFT:
            LOG.warning('Pod %s: left alone devices of port %s (%s): %s %s', pod_key,
                        finding.port_id, finding.describe(), reason, finding.detail)
        log = getattr(self.registry, 'adoptions', None)
        if log is not None:
            log.record(entry)


def _unproven_where(finding):
    """Why proven devices are not adopted: their pod end is in another namespace
    (another sandbox's), in one whose sandbox is not identified, or gone."""
    return {foreign.HERE: 'sandbox_unknown', foreign.ORPHAN: 'orphan'}.get(
        finding.where, 'pod_end_elsewhere')


def _vifs(record):
    try:
        return rules.published_vifs(record or {})
    except errors.CNIError:
        return None
