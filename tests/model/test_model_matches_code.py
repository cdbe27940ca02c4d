"""Issue 32, item 3: the model and the code stay one.

The model (tests/model/protocol.py) lists, for each path of the real code,
the durable filesystem calls it makes when nothing fails
(``protocol.DURABLE_STEPS``): the points a crash can fall between, which it
explores. Here each path runs in the real code (tests/model/real_protocol.py,
every ``open`` for writing, ``write``, ``fsync``, ``rename``, ``unlink`` and
``flock`` of the state modules counted) and its calls must be the model's,
in order: a durable step added to the code without its crash point in the
model fails this test, and so does one the model has and the code lost.
"""

import copy
import os

import pytest

from kuryr_cni import ownership as ownership_mod
from tests.model import protocol
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


def no_binding(machine):
    machine.netns[A1] = machine.node.make_netns(A1)
    machine.uid[A1] = 'uid-0-0'


def queued_del_of_the_owner(machine):
    plugged(machine, A1)
    machine.stop()
    machine.delete(A1)
    machine.restart()       # recovery replays it


PATHS = {
    'Ownership.add: first sandbox of a pod': (
        lambda m: m.vifs(POD0, 0, True), lambda m: m.add(A1)),
    'Ownership.add: a new sandbox evicts the plugged one': (
        lambda m: plugged(m, A1), lambda m: m.add(A2)),
    'Ownership.delete: the owner': (
        lambda m: plugged(m, A1), lambda m: m.delete(A1)),
    'Ownership.delete: the owner, an older sandbox recorded': (
        lambda m: plugged(m, A1, A2), lambda m: m.delete(A2)),
    'Ownership.delete: stale, its sandbox recorded': (
        lambda m: plugged(m, A1, A2), lambda m: m.delete(A1)),
    'Ownership.delete: stale, its sandbox not recorded': (
        lambda m: (plugged(m, A1), m.add(A2)), lambda m: m.delete(A1)),
    'Ownership.delete: no binding': (no_binding, lambda m: m.delete(A1)),
    'Ownership.collect: a stale attachment': (
        lambda m: plugged(m, A1), lambda m: m.request('GC', None, valid=set())),
    'recovery.replay_queue: one queued DEL of the owner': (
        lambda m: None, queued_del_of_the_owner),
    'shim queueDel': (
        lambda m: (plugged(m, A1), m.stop()), lambda m: m.delete(A1)),
}


def test_every_path_of_the_model_is_measured_here():
    assert sorted(PATHS) == sorted(protocol.DURABLE_STEPS)


@pytest.mark.parametrize('path', sorted(PATHS))
def test_the_code_makes_the_models_durable_calls(path):
    given, when = PATHS[path]
    machine = rp.Protocol()
    try:
        given(machine)
        when(machine)
        measured = calls(machine, machine.last_worker)
    finally:
        machine.stop_daemon()
        machine.teardown_resources()
    assert measured == protocol.DURABLE_STEPS[path], (
        'the code and the model differ on %s: add the crash point to the model '
        '(tests/model/protocol.py STEPS and its planner) or to the code' % path)
