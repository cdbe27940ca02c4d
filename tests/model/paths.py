"""Paths of the real code, each from a given state: what the model's DURABLE_STEPS
names (tests/model/protocol.py), run in tests/model/real_protocol.py's machine.

``PATHS[name] = (given, when)``: ``given(machine)`` makes the state,
``when(machine, crash_after=None)`` runs the path (dying after that many durable
calls); ``machine.last_worker`` is then the worker that ran it.
"""

import copy
import os

from kuryr_cni import ownership as ownership_mod
from tests.model import real_protocol as rp

POD0 = rp.PODS[0]
A1, A2 = 'p0-s0', 'p0-s1'


def target(call, state_dir):
    """The model's name for what a filesystem call is about."""
    rel = os.path.relpath(call.path, state_dir)
    directory, _, name = rel.partition(os.sep)
    if not name:
        return directory + '/'
    name = name.partition('.corrupt-')[0]
    if directory == 'locks':
        return 'lock'
    kind = {'bindings': 'binding', 'del-queue': 'queue entry'}[directory]
    if name.startswith('.') and name.endswith('.tmp'):
        return {'binding': 'binding.tmp', 'queue entry': 'queue.tmp'}[kind]
    return kind


def calls(machine, worker):
    return [(call.name, target(call, machine.state_dir)) for call in worker.calls]


def plugged(machine, *cids):
    """The pod's binding as the real ADDs leave it, then ``cids`` (owner last) all recorded
    ready, as when an eviction could not finish: the real code's state, made by hand."""
    machine.vifs(POD0, 0, True)
    machine.add(cids[0])
    store = machine.ownership.store
    binding = store.load(POD0)
    first = binding.sandboxes[cids[0]]
    for cid in cids[1:]:
        machine.netns[cid] = machine.node.make_netns(cid)
        machine.uid[cid] = machine.uid[cids[0]]
        sandbox = copy.deepcopy(first)
        sandbox.container_id, sandbox.netns = cid, machine.netns[cid]
        binding.sandboxes[cid] = sandbox
        binding.owner = cid
        for attachment in sandbox.attachments.values():
            for interface in attachment.interfaces:
                machine.port.connect(interface.vif, ownership_mod._plug_of(
                    cid, sandbox.netns, interface))
    store.save(binding)
    machine.registry.bindings.put(POD0, binding.summary())
    # As if the last one's ADD answered success after an eviction that did not finish.
    machine.connected = {cids[-1]}


def no_binding(machine):
    machine.netns[A1] = machine.node.make_netns(A1)
    machine.uid[A1] = 'uid-0-0'


def queued_del_of_the_owner(machine):
    plugged(machine, A1)
    machine.stop()
    machine.delete(A1)


def replay_at_restart(machine, crash_after=None):
    machine.restart(crash_after)       # recovery replays the queued DEL


def kuryr_daemon_plugged(machine):
    """A1 plugged by kuryr-daemon while this daemon was down; then it starts."""
    machine.vifs(POD0, 0, True)
    machine.stop()
    machine.kuryr_daemon_sandbox(A1)
    machine.restart()


def kuryr_daemon_orphan(machine):
    """As kuryr_daemon_plugged, and A1's namespace (with the veth) gone before its DEL."""
    kuryr_daemon_plugged(machine)
    machine.remove_netns(A1)


def kuryr_daemon_del_queued(machine):
    """A1 plugged by kuryr-daemon, and its DEL queued by the shim, while this daemon was
    down."""
    machine.vifs(POD0, 0, True)
    machine.stop()
    machine.kuryr_daemon_sandbox(A1)
    machine.delete(A1)


PATHS = {
    'Ownership.add: first sandbox of a pod': (
        lambda m: m.vifs(POD0, 0, True), lambda m, n=None: m.add(A1, n)),
    'Ownership.add: a new sandbox evicts the plugged one': (
        lambda m: plugged(m, A1), lambda m, n=None: m.add(A2, n)),
    'Ownership.delete: the owner': (
        lambda m: plugged(m, A1), lambda m, n=None: m.delete(A1, n)),
    'Ownership.delete: the owner, an older sandbox recorded': (
        lambda m: plugged(m, A1, A2), lambda m, n=None: m.delete(A2, n)),
    'Ownership.delete: stale, its sandbox recorded': (
        lambda m: plugged(m, A1, A2), lambda m, n=None: m.delete(A1, n)),
    'Ownership.delete: stale, its sandbox not recorded': (
        lambda m: (plugged(m, A1), m.add(A2)), lambda m, n=None: m.delete(A1, n)),
    'Ownership.delete: no binding': (no_binding, lambda m, n=None: m.delete(A1, n)),
    'Ownership.collect: a stale attachment': (
        lambda m: plugged(m, A1), lambda m, n=None: m.gc(n, valid=set())),
    'recovery.replay_queue: one queued DEL of the owner': (
        queued_del_of_the_owner, replay_at_restart),
    'Adopter.adopt_for_delete: the DEL of a sandbox kuryr-daemon plugged': (
        kuryr_daemon_plugged, lambda m, n=None: m.delete(A1, n)),
    'Adopter.adopt_for_delete: an orphan of kuryr-daemon removed': (
        kuryr_daemon_orphan, lambda m, n=None: m.delete(A1, n)),
    'Adopter.evict_foreign: a new sandbox evicts kuryr-daemon\'s port': (
        kuryr_daemon_plugged, lambda m, n=None: m.add(A2, n)),
    'recovery.replay_queue: a queued DEL of kuryr-daemon\'s sandbox waits for the pods': (
        kuryr_daemon_del_queued, replay_at_restart),
    'recovery.replay_queue: housekeeping applies it once the pods are listed': (
        lambda m: (kuryr_daemon_del_queued(m), m.restart()),
        lambda m, n=None: m.housekeeping(n)),
    'Adopter.scan: at start-up, a sandbox kuryr-daemon plugged': (
        kuryr_daemon_plugged, lambda m, n=None: m.housekeeping(n)),
    'Ownership.check: the owner': (
        lambda m: plugged(m, A1), lambda m, n=None: m.check(A1, n)),
    'recovery.resync_mirror: housekeeping after a worker died': (
        lambda m: (plugged(m, A1), m.registry.status.request_resync()),
        lambda m, n=None: m.housekeeping(n)),
    'shim queueDel': (
        lambda m: (plugged(m, A1), m.stop()), lambda m, n=None: m.delete(A1, n)),
}
