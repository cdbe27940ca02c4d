"""The real daemon code driven through the protocol's actions, with a crash after every
durable filesystem call (issue 32, item 2).

:class:`Protocol` is a Hypothesis ``RuleBasedStateMachine`` over one node: the
real :class:`kuryr_cni.ownership.Ownership` behind the real CNI API
(:class:`kuryr_cni.daemon.api.CNIApp`), its ``BindingStore``, ``DelQueue`` and
``PodLocks`` on real files in a temporary state dir, a real registry Manager
(a new one at every daemon restart), the real start-up recovery
(:func:`kuryr_cni.daemon.recovery.restore`) and housekeeping
(:class:`kuryr_cni.daemon.housekeeping.Housekeeper`). The kernel is a
:class:`Node` (the recording stand-in here; real namespaces and veths in
tests/model/test_real_protocol_kernel.py).

Rules are the runtime's and the watcher's moves on two pods of three sandboxes
each: ADD, DEL (queued by the shim while the daemon is down), CHECK, GC; VIFs
published, changed and made active; a pod re-created with a new UID; a
sandbox's namespace removed after its DEL; a kernel refusing one plug or
unplug; a worker killed while it waits; an ADD timing out; the daemon stopped
and restarted; housekeeping. Every request, replay and recovery may crash
after its N-th durable filesystem call (:mod:`tests.model.crashpoints`).

Invariants, as issue 32 states them:

* no DEL (or GC, replay, recovery) removes a device of a pod's owner unless it
  is that owner's DEL (or a GC that the runtime's valid list allows); no one but
  an ADD of the pod creates devices;
* an ADD answered success leaves its pod connected until a DEL of that sandbox
  or a newer sandbox's ADD is sent;
* an ADD in flight stays registered as in flight (a GC spares it);
* at the end, after every parked ADD has ended, housekeeping, a restart and
  housekeeping again ran:
  nothing of a sandbox whose DEL was answered success (or queued) remains: no
  device, record, registry entry or queued DEL, and no lock file of a pod left
  without a binding; then, after a DEL of every
  sandbox and one more restart, the node is empty: no device, binding, lock,
  temporary file, set-aside file or registry row.
"""

import atexit
import contextlib
import json
import os
import shutil
import tempfile
import time

from hypothesis import errors as hypothesis_errors
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine
from hypothesis.stateful import invariant
from hypothesis.stateful import precondition
from hypothesis.stateful import rule

from kuryr_cni import adoption
from kuryr_cni import ownership as ownership_mod
from kuryr_cni import podlock
from kuryr_cni import registry as registry_mod
from kuryr_cni import state
from kuryr_cni import vif as vif_model
from kuryr_cni.daemon import api
from kuryr_cni.daemon import housekeeping
from kuryr_cni.daemon import recovery
from tests.model import crashpoints
from tests.model import foreign_node

NETWORK = 'kuryr'
NAMESPACE = 'default'
PODS = ('%s/pod-0' % NAMESPACE, '%s/pod-1' % NAMESPACE)
SANDBOXES = tuple('p%d-s%d' % (p, s) for p in range(len(PODS)) for s in range(3))
PATHS = {command: path for path, command in api.ROUTES.items()}
REQUEST_TIMEOUT = 30
VIF_TIMEOUT = 20
VARIANTS = 3                # VIFs a pod's record may show (see vif())
MAX_CRASH_POINT = 24        # more durable calls than any one request makes

CRASH = st.none() | st.integers(min_value=0, max_value=MAX_CRASH_POINT)


def pod_of(cid):
    return PODS[int(cid[1])]


class RecordingNode:
    """The node's kernel as the recording stand-in (tests/unit/recording_kernel.py), with
    kuryr-daemon's OVS ports (tests/model/foreign_node.py): OVS VIFs on br-int."""

    bridge = 'br-int'
    vif_kind = 'ovs'
    foreign = True          # kuryr-daemon's devices may be on it: the adoption runs

    def __init__(self):
        self.kernel = foreign_node.ForeignKernel()

    def port(self):
        return self.kernel

    def make_netns(self, cid):
        path = '/run/netns/' + cid
        self.kernel.add_netns(path)
        return path

    def remove_netns(self, path):
        self.kernel.delete_netns(path)

    def netns_exists(self, path):
        return path in self.kernel.namespaces

    def devices(self):
        """Every device carrying an owner tag: ``{(container_id, ifname, where)}``."""
        found = {(cid, ifname, 'host') for cid, ifname in self.kernel.tagged_host_devices()}
        for path, links in self.kernel.namespaces.items():
            found |= {(owner[0], owner[1], path) for owner in links.values() if owner}
        return found

    def close(self):
        pass


def vif(pod_index, variant, bridge, active, kind='bridge'):
    """Variant 0 and 1: ports of the pod's own; 2: a port ID the other pod's variant 0
    also names (with the pod's own MAC and IP), as a hostile or mistaken annotation could."""
    port = 'port-%d-%d' % (pod_index, variant) if variant < 2 else 'port-%d-0' % (1 - pod_index)
    return vif_model.parse_vif({
        'kind': kind, 'port_id': port, 'bridge': bridge,
        'mac': 'fa:16:3e:00:%02x:%02x' % (pod_index, variant),
        'ips': ['10.99.0.%d/24' % (10 + 10 * pod_index + variant)], 'gateway': '10.99.0.1',
        'active': active}).to_dict()


class Protocol(RuleBasedStateMachine):
    """One node, two pods of three sandboxes, the real daemon code; see the module doc."""

    node_class = RecordingNode

    def __init__(self):
        super().__init__()
        self.node = self.node_class()
        self.port = crashpoints.FaultyPort(self.node.port())
        self.tmp = tempfile.mkdtemp(prefix='kuryr-model-', dir=_fast_tmp())
        self.state_dir = os.path.join(self.tmp, 'state')
        self.watch = crashpoints.watch_filesystem()
        self.watch.__enter__()
        self.registry = None
        self.up = False
        self.records = {}           # pod -> the watcher's record (what it publishes)
        self.variant = {}           # pod -> which of its VIFs (see vif()) the record shows
        self.generation = {p: 0 for p in PODS}
        self.netns = {}             # cid -> its namespace path (once made)
        self.uid = {}               # cid -> the pod UID it was made for
        self.add_seq = 0
        self.newest_add = {}        # pod -> seq of the last ADD sent
        self.adds = {}              # worker -> (cid, seq)
        self.results = {}           # cid -> its last successful ADD's result
        self.del_sent = set()
        self.deleted = set()        # DEL answered success (or queued by the shim)
        self.connected = set()      # ADD answered success, not since undone by the runtime
        self.shim_seq = 0
        self.kuryr_daemon_made = set()     # sandboxes kuryr-daemon plugged before the switch
        self.vif_moved = set()      # of those, whose port can no longer be proven theirs
        self.identities = foreign_node.sandbox_identities(self.identified_sandboxes)
        self.identities.__enter__()
        self.start_daemon()

    # The daemon -------------------------------------------------------------------------

    def start_daemon(self, crash_after=None):
        """Start as kuryr_cni.daemon.main does: registry, recovery, then the watcher's list."""
        registry = self.registry = fresh_registry()
        self.scheduler = crashpoints.Scheduler(registry.changes)
        self.scheduler.observe = self._observe_slice
        guarded = crashpoints.GuardedRegistry(registry, self.scheduler)
        self.ownership = ownership_mod.Ownership(
            registry=guarded, store=state.BindingStore(self.state_dir),
            locks=podlock.PodLocks(state.ensure_dir(os.path.join(self.state_dir, 'locks'))),
            kernel=self.port, vif_timeout=VIF_TIMEOUT,
            adopter=adoption.Adopter(self.port, guarded) if self.adopts() else None)
        self.queue = state.DelQueue(self.state_dir)
        self.app = api.CNIApp(self.ownership, guarded, request_timeout=REQUEST_TIMEOUT)
        worker = self.run('restore', lambda: recovery.restore(
            self.ownership, self.queue, self.ownership.locks.directory),
            crash_after=crash_after, may_remove=self._queued_may_remove())
        if worker.outcome[0] != 'ok':
            assert worker.outcome[0] == 'crash', worker.outcome
            self.stop_daemon()
            return False
        registry.replace_pods(self.records)
        registry.mark_synced(True)
        self.up = True
        return True

    def stop_daemon(self):
        if self.registry is None:
            return
        self.scheduler.kill_all()
        self._harvest()
        self.registry = None
        self.up = False

    def run(self, name, fn, crash_after=None, may_remove=None):
        worker = crashpoints.Worker(name, crash_after)
        worker.may_remove = may_remove or (lambda cid, owners: True)
        # {pod: {(port ID, MAC)}}: the VIFs its record showed while the worker lived
        worker.vifs_seen = {pod: {(v['port_id'], v['mac']) for v in r['vifs'].values()}
                            for pod, r in self.records.items()}
        worker.may_create = name.startswith('ADD')
        self.last_worker = worker
        self.scheduler.start(worker, fn)
        return worker

    def request(self, command, cid, crash_after=None, pod=True, valid=None, may_remove=None):
        body = self._body(command, cid, pod=pod, valid=valid)
        return self.run('%s %s' % (command, cid), lambda: self.app.handle(
            PATHS[command], json.dumps(body).encode()), crash_after, may_remove)

    def _body(self, command, cid, pod=True, valid=None):
        args = ['IgnoreUnknown=1']
        if pod and cid:
            namespace, _, name = pod_of(cid).partition('/')
            args += ['K8S_POD_NAMESPACE=%s' % namespace, 'K8S_POD_NAME=%s' % name,
                     'K8S_POD_UID=%s' % self.uid[cid]]
        config = {'cniVersion': '1.1.0', 'name': NETWORK, 'type': 'kuryr-cni'}
        netns = ''
        if cid and self.netns.get(cid) and self.node.netns_exists(self.netns[cid]):
            netns = self.netns[cid]
        if command == 'CHECK':
            config['prevResult'] = self.results[cid]
        if valid is not None:
            config['cni.dev/valid-attachments'] = [{'containerID': c, 'ifname': 'eth0'}
                                                   for c in sorted(valid)]
        return {'CNI_COMMAND': command, 'CNI_CONTAINERID': cid or '', 'CNI_NETNS': netns,
                'CNI_IFNAME': 'eth0' if cid else '', 'CNI_ARGS': ';'.join(args),
                'CNI_PATH': '/opt/cni/bin', 'config': config}

    # What each worker may touch ---------------------------------------------------------

    def owners(self):
        """{pod: owner sandbox} from the binding files (None: no owner)."""
        return {pod: b.owner for pod, b in self.ownership.store.load_all().items()}

    def _observe_slice(self, worker, run):
        bindings = self.ownership.store.load_all()
        owners = {pod: b.owner for pod, b in bindings.items()}
        before = self.node.devices()
        rows_before = self._rows()
        run()
        after = self.node.devices()
        adopted = self._only_proven_devices_taken(worker, rows_before, self._rows(),
                                                  _recorded_proofs(bindings))
        created = {d for d in after - before if (d[0], d[1]) not in adopted}
        assert worker.may_create or not created, (
            '%s created devices %s' % (worker.name, sorted(created)))
        touched = {cid for cid, _, _ in before - after}
        for cid in touched:
            assert worker.may_remove(cid, owners), (
                '%s removed the devices of %s, owner of %s'
                % (worker.name, cid, pod_of(cid)) + ' (owners: %s)' % owners)

    def _rows(self):
        rows = getattr(self.node.kernel, 'rows', None)
        return {} if rows is None else {name: (row.iface_id, row.mac, row.owner, row.planted)
                                        for name, row in rows.items()}

    def _only_proven_devices_taken(self, worker, before, after, recorded=None):
        """A device of kuryr-daemon's is tagged or removed only when proven the VIF of a
        pod the worker serves (any pod: recovery, housekeeping's scan); a planted one,
        naming no pod's VIF, never. Returns the owners the slice adopted.

        Proven by what the pod's record shows, or showed since the worker started (it
        acts on the VIFs it read: a Neutron port ID is never reused, so a port once
        proven a pod's stays that pod's, whatever the record says later), or by an
        adoption record written earlier (``recorded``: ``{ovs port: (iface-id, mac)}``
        of the bindings before the slice; a DEL after a crash between that record and
        the tag, or its replay, removes the port on that proof, as it must)."""
        cid = worker.name.split(' ')[-1]
        pods = [pod_of(cid)] if cid in SANDBOXES else list(self.records)
        proven = {(v['port_id'], v['mac']) for pod in pods if pod in self.records
                  for v in self.records[pod]['vifs'].values()}
        seen = getattr(worker, 'vifs_seen', {})
        proven |= {proof for pod in pods for proof in seen.get(pod, ())}
        recorded = recorded or {}
        adopted = set()
        for name, (iface_id, mac, owner, planted) in before.items():
            now = after.get(name)
            if now == (iface_id, mac, owner, planted) or owner is not None:
                continue        # unchanged, or ours since its adoption
            assert not planted and ((iface_id, mac) in proven
                                    or recorded.get(name) == (iface_id, mac)), (
                '%s %s kuryr-daemon\'s port %s (iface-id %s, attached-mac %s), which is '
                'not proven the VIF of %s' % (worker.name, 'tagged' if now else 'removed',
                                              name, iface_id, mac, pods))
            if now is not None:
                adopted.add(now[2])
                _event('adopted %s' % worker.name.split(' ')[0])
            else:
                _event('kuryr-daemon port removed by %s' % worker.name.split(' ')[0])
        return adopted

    def _queued_may_remove(self):
        """A replay may remove the owner's devices only by the owner's queued DEL."""
        queued = set()
        for name in os.listdir(os.path.join(self.state_dir, state.DEL_QUEUE)) \
                if os.path.isdir(os.path.join(self.state_dir, state.DEL_QUEUE)) else ():
            if name.endswith('.json'):
                with open(os.path.join(self.state_dir, state.DEL_QUEUE, name)) as f:
                    queued.add(json.load(f)['CNI_CONTAINERID'])
        return lambda cid, owners: cid in queued or cid not in owners.values()

    # The watcher ------------------------------------------------------------------------

    def publish(self, pod, variant, active):
        index = PODS.index(pod)
        uid = 'uid-%d-%d' % (index, self.generation[pod])
        if variant != self.variant.get(pod, variant) or \
                uid != self.records.get(pod, {}).get('uid', uid):
            # A new VIF, or a new incarnation (whose port Neutron makes anew; the model
            # reuses its name): kuryr-daemon's port is no longer proven its VIF.
            self.vif_moved |= {c for c in self.kuryr_daemon_made if pod_of(c) == pod}
        self.variant[pod] = variant
        new_vif = vif(index, variant, self.node.bridge, active,
                      getattr(self.node, 'vif_kind', 'bridge'))
        for worker in self.scheduler.workers:      # those alive may read it next
            worker.vifs_seen.setdefault(pod, set()).add((new_vif['port_id'], new_vif['mac']))
        self.records[pod] = {
            'uid': uid,
            'vifs': {'eth0': new_vif},
            'error': None, 'deleting': False}
        if self.up:
            self.registry.put_pod(pod, self.records[pod])
            self.settle()

    def settle(self):
        self.scheduler.settle()
        self._harvest()

    def _harvest(self):
        """Note the answers of the ADDs that ended."""
        for worker in [w for w in self.adds if w.done]:
            cid, seq = self.adds.pop(worker)
            if worker.outcome[0] == 'crash':
                self._worker_died()
                continue
            status, payload = worker.outcome[1]
            _event('ADD answered %s' % _code(status, payload))
            if status == 200:
                self.iface_id_on_one_port(cid)
            if status == 200 and cid not in self.del_sent \
                    and self.newest_add[pod_of(cid)] == seq:
                self.connected.add(cid)
                self.results[cid] = json.loads(payload)

    def _worker_died(self):
        if self.up:     # the parent's on_dead_worker asks housekeeping to resync the mirror
            self.registry.status.request_resync()

    def _finish(self, worker):
        if worker.outcome[0] == 'crash':
            self._worker_died()
            return None
        if worker.outcome[0] == 'error':
            raise worker.outcome[1]
        return worker.outcome[1]

    # Actions: the runtime ----------------------------------------------------------------
    # (plain methods, so that a regression test replays a shrunk sequence step by step;
    # the Hypothesis rules below draw their arguments among those that make sense)

    def addable(self):
        """Sandboxes the runtime may ADD: any it has not deleted."""
        return [cid for cid in SANDBOXES
                if cid not in self.del_sent and cid not in self.kuryr_daemon_made]

    def add(self, cid, crash_after=None):
        pod = pod_of(cid)
        if cid not in self.netns:
            self.netns[cid] = self.node.make_netns(cid)
            record = self.records.get(pod)
            self.uid[cid] = record['uid'] if record else 'uid-%d-%d' % (
                PODS.index(pod), self.generation[pod])
        self.add_seq += 1
        self.newest_add[pod] = self.add_seq
        self.connected -= {c for c in self.connected if pod_of(c) == pod}
        worker = self.request('ADD', cid, crash_after,
                              may_remove=lambda c, owners, pod=pod: pod_of(c) == pod)
        self.adds[worker] = (cid, self.add_seq)
        self.settle()

    def deletable(self):
        """Sandboxes the runtime may DEL: any it made."""
        return sorted(self.netns)

    def delete(self, cid, crash_after=None, pod_identity=True):
        """The runtime's DEL; while the daemon is down, the shim queues it."""
        self.del_sent.add(cid)
        if not pod_identity and cid in self.kuryr_daemon_made:
            # No pod, no VIF, no proof: kuryr-daemon's port is left alone (by design).
            self.vif_moved.add(cid)
        self.connected.discard(cid)
        if not self.up:
            if self._queue_del(cid, crash_after, pod_identity):
                self.deleted.add(cid)
            return

        def may_remove(c, owners):
            # Only the owner's DEL removes the owner's devices (and its pod's others').
            return c == cid or owners.get(pod_of(c)) != c or \
                (pod_of(c) == pod_of(cid) and owners.get(pod_of(c)) == cid)

        answer = self._finish(self.request('DEL', cid, crash_after, pod=pod_identity,
                                           may_remove=may_remove))
        _event('DEL answered %s' % (_code(*answer) if answer else 'crash'))
        self.settle()
        if answer is not None and answer[0] in (200, 204):
            self.deleted.add(cid)
        else:
            # Failed (or its worker died): the runtime sends it again until it succeeds,
            # whatever an earlier DEL of the sandbox answered (the wind-down does).
            self.deleted.discard(cid)

    def _queue_del(self, cid, crash_after, pod_identity):
        """The shim, unable to reach the daemon, queues the DEL and answers success."""
        self.shim_seq += 1
        name = '%d-%d.json' % (time.time_ns() + self.shim_seq, 4242)
        body = json.dumps(self._body('DEL', cid, pod=pod_identity)).encode()
        directory = state.ensure_dir(os.path.join(self.state_dir, state.DEL_QUEUE))
        worker = crashpoints.Worker('shim DEL %s' % cid, crash_after)
        worker.may_remove, worker.may_create = (lambda c, owners: False), False
        scheduler = crashpoints.Scheduler(None)
        scheduler.observe = self._observe_slice
        self.last_worker = worker
        scheduler.start(worker, lambda: state.write_atomically(directory, name, body))
        return worker.outcome[0] == 'ok'

    def checkable(self):
        return [cid for cid in sorted(self.results) if cid not in self.del_sent]

    def check(self, cid, crash_after=None):
        connected = cid in self.connected
        answer = self._finish(self.request('CHECK', cid, crash_after))
        _event('CHECK answered %s' % (_code(*answer) if answer else 'crash'))
        if connected and cid in self.connected and answer is not None:
            assert answer[0] in (200, 204), ('CHECK of connected %s: %s' % (cid, answer))

    def gc(self, crash_after=None, valid=None):
        """The runtime's GC; ``valid``: its valid attachments (default: every sandbox it
        made and has not deleted)."""
        if valid is None:
            valid = {cid for cid in self.netns if cid not in self.del_sent}
        self.connected &= valid     # what the runtime does not list, it gave up

        def may_remove(c, owners):
            return c not in valid or owners.get(pod_of(c)) != c

        self._finish(self.request('GC', None, crash_after, valid=valid, may_remove=may_remove))
        self.settle()

    def removable_netns(self):
        """After its DEL; a kuryr-daemon sandbox also before (it died: its DEL finds the
        OVS row without pod end, an orphan)."""
        return [cid for cid in sorted(self.del_sent | self.kuryr_daemon_made)
                if self.node.netns_exists(self.netns[cid])]

    def remove_netns(self, cid):
        """The runtime removes a sandbox's namespace after its DEL."""
        self.node.remove_netns(self.netns[cid])

    # Actions: the watcher -----------------------------------------------------------------

    def vifs(self, pod, variant, active):
        """The pod's VIFs appear, change or go active."""
        self.publish(pod, variant, active)

    def recreate(self, pod):
        """The pod is deleted and created again under its name: a new UID, new VIFs."""
        self.generation[pod] += 1
        self.publish(pod, 0, False)

    # Actions: kuryr-daemon's devices (a node switched from it) -------------------------

    def adopts(self):
        """Whether the node may hold kuryr-daemon's devices ([binding] adopt)."""
        return getattr(self.node, 'foreign', False)

    def identified_sandboxes(self):
        """{netns: (pod UID, container ID)}: each live sandbox's pause process, as
        kuryr_cni.sandboxes reads it. Not once its DEL was sent: containerd's
        StopPodSandbox stops the sandbox container before it tears the network down."""
        return {self.netns[cid]: (self.uid[cid], cid) for cid in sorted(self.netns)
                if self.node.netns_exists(self.netns[cid]) and cid not in self.del_sent}

    def kuryr_daemon_makeable(self):
        """Sandboxes kuryr-daemon may have plugged while this daemon was down: of a pod
        with VIFs and no binding, never made; one per pod (kuryr-daemon names its port
        after the VIF's: a second sandbox would have replaced the first's). Not of a pod
        whose record names another pod's port (variant 2 of vif()): kuryr-daemon plugged
        what kuryr-controller annotated, one Neutron port of its own per pod; the hostile
        or mistaken annotation is one our ADD's address fence meets, not one kuryr-daemon
        made a port of (it would name its tap after the other pod's port, and replace or
        stand beside that pod's own)."""
        if self.up or not self.adopts():
            return []
        bound = set(state.BindingStore(self.state_dir).load_all())
        taken = {pod_of(c) for c in self.kuryr_daemon_made}
        return [cid for cid in SANDBOXES if cid not in self.netns
                and pod_of(cid) in self.records and pod_of(cid) not in bound | taken
                and self.variant[pod_of(cid)] < 2]

    def kuryr_daemon_sandbox(self, cid):
        """kuryr-daemon plugged ``cid`` (the runtime's ADD, answered by it) before the
        switch: its OVS port tap<port> on br-int with the VIF's iface-id and
        attached-mac, untagged, and its veth's pod end eth0 in the sandbox's namespace."""
        pod = pod_of(cid)
        record = self.records[pod]
        vif_dict = record['vifs']['eth0']
        self.netns[cid] = self.node.make_netns(cid)
        self.uid[cid] = record['uid']
        self.node.kernel.plant_row(foreign_node.foreign.tap_name(vif_dict['port_id']),
                                   vif_dict['port_id'], vif_dict['mac'], self.netns[cid], 'eth0')
        self.kuryr_daemon_made.add(cid)
        self.vif_moved.discard(cid)

    def plant(self, cid=None):
        """A port on br-int that names no pod's VIF (another tool's, or hostile), its pod
        end in ``cid``'s namespace if given."""
        n = len(self.node.kernel.rows)
        netns = self.netns.get(cid) if cid else None
        if netns and not self.node.netns_exists(netns):
            netns = None
        self.node.kernel.plant_row('tapplanted%d' % n, 'port-planted-%d' % n,
                                   'fa:16:3e:ff:00:%02x' % n, netns,
                                   'eth%d' % (5 + n) if netns else None, planted=True)

    # Actions: faults and the daemon's life --------------------------------------------------

    def kernel_refuses_next(self, unplug):
        if unplug:
            self.port.fail_disconnect = True
        else:
            self.port.fail_connect = True

    def kill_waiting_worker(self, index):
        """The worker serving the ``index``-th waiting ADD is killed (SIGKILL, OOM)."""
        self.scheduler.workers[index].die()
        self.settle()

    def time_out(self, index):
        """The ``index``-th waiting ADD reaches its deadline."""
        self.scheduler.workers[index].clock_offset = REQUEST_TIMEOUT + VIF_TIMEOUT
        self.settle()

    def restart(self, crash_after=None):
        """The daemon stops (every worker dies) and starts again, recovering from its files."""
        self.stop_daemon()
        self.start_daemon(crash_after)

    def stop(self):
        """The daemon is down for a while: the shim queues DELs."""
        self.stop_daemon()

    def housekeeping(self, crash_after=None):
        keeper = housekeeping.Housekeeper(self.ownership, self.queue)
        queued = self._queued_may_remove()

        def may_remove(cid, owners):
            # recovery.delete_vanished applies the DEL of a sandbox whose namespace is
            # gone. The runtime removes it only after the DEL it sent (here, one that
            # crashed or failed), and a kuryr-daemon sandbox's goes when it died
            # (removable_netns): the sandbox is dead either way, nothing of it can
            # serve its pod. (A new Housekeeper per call, as a replacement worker 0
            # makes one: it does so at every call, not only after a start.)
            return queued(cid, owners) or (
                (cid in self.del_sent or cid in self.kuryr_daemon_made)
                and not self.node.netns_exists(self.netns[cid]))

        worker = self.run('housekeeping', keeper.tick, crash_after, may_remove=may_remove)
        self._finish(worker)
        self.settle()

    # Rules ---------------------------------------------------------------------------------

    @precondition(lambda self: self.up and self.addable())
    @rule(data=st.data(), crash_after=CRASH)
    def rule_add(self, data, crash_after):
        self.add(data.draw(st.sampled_from(self.addable()), label='cid'), crash_after)

    @precondition(lambda self: self.deletable())
    @rule(data=st.data(), crash_after=CRASH, pod_identity=st.booleans())
    def rule_delete(self, data, crash_after, pod_identity):
        self.delete(data.draw(st.sampled_from(self.deletable()), label='cid'),
                    crash_after, pod_identity)

    @precondition(lambda self: self.up and self.checkable())
    @rule(data=st.data(), crash_after=CRASH)
    def rule_check(self, data, crash_after):
        self.check(data.draw(st.sampled_from(self.checkable()), label='cid'), crash_after)

    @precondition(lambda self: self.up)
    @rule(crash_after=CRASH)
    def rule_gc(self, crash_after):
        self.gc(crash_after)

    @precondition(lambda self: self.removable_netns())
    @rule(data=st.data())
    def rule_remove_netns(self, data):
        self.remove_netns(data.draw(st.sampled_from(self.removable_netns()), label='cid'))

    @rule(data=st.data(), pod=st.sampled_from(PODS), active=st.booleans())
    def rule_vifs(self, data, pod, active):
        self.vifs(pod, data.draw(st.sampled_from(range(VARIANTS)),
                                 label='variant'), active)

    @rule(pod=st.sampled_from(PODS))
    def rule_recreate(self, pod):
        self.recreate(pod)

    @precondition(lambda self: not (self.port.fail_connect or self.port.fail_disconnect))
    @rule(unplug=st.booleans())
    def rule_kernel_refuses_next(self, unplug):
        self.kernel_refuses_next(unplug)

    @precondition(lambda self: self.up and self.scheduler.workers)
    @rule(data=st.data())
    def rule_kill_waiting_worker(self, data):
        self.kill_waiting_worker(data.draw(st.integers(0, len(self.scheduler.workers) - 1),
                                           label='index'))

    @precondition(lambda self: self.up and self.scheduler.workers)
    @rule(data=st.data())
    def rule_time_out(self, data):
        self.time_out(data.draw(st.integers(0, len(self.scheduler.workers) - 1),
                                label='index'))

    @precondition(lambda self: self.kuryr_daemon_makeable())
    @rule(data=st.data())
    def rule_kuryr_daemon_sandbox(self, data):
        self.kuryr_daemon_sandbox(data.draw(st.sampled_from(self.kuryr_daemon_makeable()),
                                            label='cid'))

    @precondition(lambda self: self.adopts() and len(self.node.kernel.rows) < 4)
    @rule(data=st.data())
    def rule_plant(self, data):
        self.plant(data.draw(st.sampled_from([None] + sorted(self.netns)), label='cid'))

    @rule(crash_after=CRASH)
    def rule_restart(self, crash_after):
        self.restart(crash_after)

    @precondition(lambda self: self.up)
    @rule()
    def rule_stop(self):
        self.stop()

    @precondition(lambda self: self.up)
    @rule(crash_after=CRASH)
    def rule_housekeeping(self, crash_after):
        self.housekeeping(crash_after)

    # Invariants ----------------------------------------------------------------------------

    def assert_invariants(self):
        """Every invariant, as Hypothesis checks them after each rule."""
        self.adds_answered_success_stay_connected()
        self.adds_in_flight_are_registered()
        self.no_two_pods_hold_one_address()

    @invariant()
    def adds_answered_success_stay_connected(self):
        devices = self.node.devices()
        for cid in self.connected:
            assert (cid, 'eth0', 'host') in devices and \
                (cid, 'eth0', self.netns[cid]) in devices, (
                    'the ADD of %s answered success and nothing undid it, yet its devices '
                    'are gone: %s' % (cid, sorted(devices)))

    @invariant()
    def adds_in_flight_are_registered(self):
        if not self.up:
            return
        registered = self.registry.bindings.adds_since(0)
        for worker, (cid, _) in self.adds.items():
            if not worker.dead and worker.parked_on is not None:
                assert cid in registered, ('the ADD of %s waits, yet the registry does not '
                                           'count it in flight' % cid)

    def iface_id_on_one_port(self, cid):
        """An ADD answered success: no port of kuryr-daemon proven its VIF is left on
        br-int beside the one it plugged (an iface-id on two ports: OVN binds either)."""
        if not self.adopts():
            return
        vif_dict = self.records[pod_of(cid)]['vifs']['eth0']
        beside = {name: (iface, mac) for name, (iface, mac, _netns, _end)
                  in self.node.kernel.untagged().items() if iface == vif_dict['port_id']}
        proven = {name for name, (_, mac) in beside.items() if mac == vif_dict['mac']}
        assert not proven, ('the ADD of %s answered success, yet kuryr-daemon\'s port %s '
                            'with its iface-id %s stays on br-int'
                            % (cid, sorted(proven), vif_dict['port_id']))
        if beside:
            _event('ADD answered beside an unproven port of its iface-id')

    @invariant()
    def no_two_pods_hold_one_address(self):
        """A port, MAC or IP is bound to one pod of the node at most (the address fence)."""
        holders = {}
        for pod, binding in self.ownership.store.load_all().items():
            for sandbox in binding.sandboxes.values():
                for attachment in sandbox.attachments.values():
                    for interface in attachment.interfaces:
                        vif = interface.vif
                        for address in {vif.port_id, vif.mac, *vif.ips}:
                            holders.setdefault(address, set()).add(pod)
        shared = {a: sorted(p) for a, p in holders.items() if len(p) > 1}
        assert not shared, 'pods of the node share addresses: %s' % shared

    # The end -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def driven(self):
        """Drive this machine by hand (a named regression, a crash point) as Hypothesis
        would: invariants checked first, the wind-down's checks at the end; after a
        failure, only the clean-up."""
        try:
            self.assert_invariants()
            yield self
        except BaseException:
            try:
                self.stop_daemon()      # may fail too when a worker's slice failed
            finally:
                self.teardown_resources()
            raise
        self.teardown()

    def teardown(self):
        try:
            self.wind_down()
        finally:
            try:
                self.stop_daemon()      # may fail too when a worker's slice failed
            finally:
                self.teardown_resources()   # or every failing example leaves its state dir

    def teardown_resources(self):
        self.watch.__exit__(None, None, None)
        self.identities.__exit__(None, None, None)
        self.node.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def wind_down(self):
        """Let everything end, then check that nothing of a deleted sandbox remains,
        and that after every sandbox's DEL nothing at all remains."""
        if not self.up:
            self.restart(None)
        for pod in list(self.records):
            self.publish(pod, self.variant[pod], True)
        for worker in list(self.scheduler.workers):
            worker.clock_offset = REQUEST_TIMEOUT + VIF_TIMEOUT
        self.settle()
        self.housekeeping(None)
        self.restart(None)
        # A started daemon's housekeeping: the queued DELs that waited for the watcher's
        # list (recovery.replay_queue) are applied now.
        self.housekeeping(None)
        self.assert_gone(self.deleted)
        for cid in sorted(set(self.netns) - self.deleted):
            for _ in range(3):
                if cid in self.deleted:
                    break
                self.delete(cid, None, True)
                self.housekeeping(None)
            assert cid in self.deleted, 'the DEL of %s never succeeded' % cid
        self.restart(None)
        self.assert_gone(set(self.netns))
        self.assert_empty()

    def assert_gone(self, cids):
        devices = {d for d in self.node.devices() if d[0] in cids}
        assert not devices, 'devices of deleted sandboxes remain: %s' % sorted(devices)
        for pod, binding in self.ownership.store.load_all().items():
            left = set(binding.sandboxes) & cids
            assert not left, 'the binding of %s still records deleted %s' % (pod, sorted(left))
        for cid in cids:
            assert self.registry.bindings.find_container(cid) is None, cid
        assert not self.registry.bindings.adds_since(0) & cids
        # A pod's lock file lives as long as its binding (PodLocks.remove_unused takes
        # those of pods without one, which a killed ADD or GC may leave).
        bound = {state.file_stem(pod) for pod in self.ownership.store.load_all()}
        left = [n for n in self.ownership.locks.held_files() if n[:-len('.lock')] not in bound]
        assert not left, 'lock files of pods without a binding remain: %s' % left
        assert not _queue_entries(self.state_dir), (
            'the DEL queue still holds %s' % _queue_entries(self.state_dir))

    def assert_no_lock_files(self):
        left = os.listdir(os.path.join(self.state_dir, 'locks'))
        assert not left, 'lock files left: %s' % left

    def assert_empty(self):
        assert not self.node.devices(), sorted(self.node.devices())
        if self.adopts():
            left = self.node.kernel.untagged()
            for cid in sorted(self.kuryr_daemon_made - self.vif_moved):
                vif_dict = self.records[pod_of(cid)]['vifs']['eth0']
                name = foreign_node.foreign.tap_name(vif_dict['port_id'])
                proof = (vif_dict['port_id'], vif_dict['mac'])
                assert left.get(name, (None, None))[:2] != proof, (
                    'kuryr-daemon\'s port %s of deleted sandbox %s remains' % (name, cid))
            planted = {n for n, r in self.node.kernel.rows.items() if r.planted}
            assert planted <= set(left), 'planted ports were taken: %s' % (planted - set(left))
        left = {sub: sorted(os.listdir(os.path.join(self.state_dir, sub)))
                for sub in ('bindings', 'locks')}
        left[state.DEL_QUEUE] = _queue_entries(self.state_dir)
        assert left == {'bindings': [], 'locks': [], state.DEL_QUEUE: []}, left
        assert self.registry.bindings.snapshot() == {}


_shared = {}


def fresh_registry():
    """A registry as a restarted daemon has it: empty tables.

    One Manager process serves every example (a Manager takes 0.2 s to start,
    and the examples restart often), and a restart gets a new binding table and
    an emptied pods table from it: what a restart loses is the registry's
    memory, which they lose as well. (The status and stale-DEL tables hold
    nothing the rules read but the resync request, which is cleared.)
    """
    if 'manager' not in _shared:
        manager, registry = registry_mod.Registry.start(
            title='kuryr-cni-daemon: registry (model)')
        atexit.register(manager.shutdown)
        _shared.update(manager=manager, registry=registry)
    shared = _shared['registry']
    shared.pods.replace({})
    shared.status.take_resync_request()
    shared.status.mark_synced(False)    # a started daemon's watcher has listed nothing yet
    return registry_mod.Registry(shared.pods, _shared['manager'].BindingTable(),
                                 shared.status, shared.stale_dels, shared.changes)


def _recorded_proofs(bindings):
    """``{OVS port: (iface-id, MAC)}`` that adoption records name: the proof the adoption
    checked when it wrote them."""
    return {interface.adopted.ovs_port: (interface.vif.port_id, interface.vif.mac)
            for binding in bindings.values() for sandbox in binding.sandboxes.values()
            for attachment in sandbox.attachments.values()
            for interface in attachment.interfaces
            if interface.adopted is not None and interface.adopted.ovs_port}


def _code(status, payload):
    """The CNI answer in a word: ok or the error code."""
    return 'ok' if status in (200, 204) else json.loads(payload)['code']


def _event(text):
    """Count ``text`` in Hypothesis' statistics (outside a Hypothesis run: nowhere)."""
    try:
        event(text)
    except hypothesis_errors.InvalidArgument:
        pass


def _queue_entries(state_dir):
    """The DEL queue's entries and set-aside entries; a shim's temporary file is not one
    (a shim killed while queueing leaves it for a minute, by design)."""
    names = os.listdir(os.path.join(state_dir, state.DEL_QUEUE))
    return sorted(n for n in names if not (n.startswith('.') and n.endswith('.tmp')))


def _fast_tmp():
    """A tmpfs when there is one: the model fsyncs a lot, and what it checks is the order."""
    return '/dev/shm' if os.path.isdir('/dev/shm') and os.access('/dev/shm', os.W_OK) else None
