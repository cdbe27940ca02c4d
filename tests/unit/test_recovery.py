"""Start-up recovery, and the steps that also run while the daemon runs: mirror
resync, DEL queue replay, tidying of temporary files.

Against a real registry Manager, a real state directory and the recording
kernel port. Some replay tests give ``replay_queue`` an ownership whose
``delete`` is scripted, to check what replay does with each outcome.
"""

import json
import os
import threading

from kuryr_cni import errors
from kuryr_cni import records
from kuryr_cni import state
from kuryr_cni.daemon import housekeeping
from kuryr_cni.daemon import recovery


def binding(pod, owner):
    return records.Binding(pod, owner, 'u', {owner: records.Sandbox(owner, '/run/netns/x', 'u')})


def test_resync_makes_the_mirror_equal_the_files(ownership, registry, tmp_path):
    store = ownership.store
    store.save(binding('ns/only-file', 'c1'))           # mirror never written
    store.save(binding('ns/differs', 'c2'))
    registry.bindings.put('ns/differs', binding('ns/differs', 'c-old').summary())  # file newer
    registry.bindings.put('ns/only-mirror',                              # file removed
                          binding('ns/only-mirror', 'c3').summary())
    store.save(binding('ns/same', 'c4'))
    registry.bindings.put('ns/same', binding('ns/same', 'c4').summary())

    assert recovery.resync_mirror(ownership) == 3
    assert registry.bindings.snapshot() == {k: b.summary() for k, b in store.load_all().items()}
    assert registry.bindings.find_container('c3') is None
    assert registry.bindings.find_container('c2') == 'ns/differs'
    # No lock file is left for the pod that has no binding.
    assert sorted(os.listdir(ownership.locks.directory)) == sorted(
        state.file_stem(pod) + '.lock' for pod in ('ns/differs', 'ns/only-file', 'ns/same'))
    assert recovery.resync_mirror(ownership) == 0


def test_resync_skips_a_pod_whose_lock_stays_busy(ownership, registry, monkeypatch):
    monkeypatch.setattr(recovery, 'RESYNC_LOCK_TIMEOUT', 0.1)
    ownership.store.save(binding('ns/busy', 'c1'))
    ownership.store.save(binding('ns/free', 'c2'))
    held = threading.Event()
    release = threading.Event()

    def hold():
        with ownership.locks.hold('ns/busy', deadline=float('inf')):
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        held.wait(10)
        assert recovery.resync_mirror(ownership) == 1
    finally:
        release.set()
        holder.join()
    assert registry.bindings.get('ns/busy') is None
    assert registry.bindings.get('ns/free') == binding('ns/free', 'c2').summary()


class ScriptedDeletes:
    """An ownership whose DELs answer from a script: container ID -> outcome or exception."""

    def __init__(self, script):
        self.script = script
        self.seen = []

    def delete(self, req, deadline):
        self.seen.append(req.container_id)
        answer = self.script[req.container_id]
        if isinstance(answer, BaseException):
            raise answer
        return answer


def queued_del(queue, name, container_id):
    body = {'CNI_COMMAND': 'DEL', 'CNI_CONTAINERID': container_id, 'CNI_NETNS': '',
            'CNI_IFNAME': 'eth0', 'CNI_ARGS': 'K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web',
            'CNI_PATH': '', 'config': {'cniVersion': '1.0.0', 'name': 'kuryr',
                                       'type': 'kuryr-cni'}}
    state.write_atomically(queue.directory, name, json.dumps(body).encode())


def test_replay_removes_done_entries_and_keeps_what_may_succeed_later(tmp_path):
    queue = state.DelQueue(str(tmp_path))
    queued_del(queue, '1-1.json', 'done')
    queued_del(queue, '2-1.json', 'busy')
    queued_del(queue, '3-1.json', 'bug')
    queued_del(queue, '4-1.json', 'invalid')
    queued_del(queue, '5-1.json', 'stale')
    owner = ScriptedDeletes({'done': 'success', 'stale': 'stale',
                             'busy': errors.TryAgainLater('pod lock busy'),
                             'bug': RuntimeError('unexpected'),
                             'invalid': errors.InvalidEnvironment('no')})
    assert recovery.replay_queue(owner, queue) == 2
    assert owner.seen == ['done', 'busy', 'bug', 'invalid', 'stale']
    kept, aside = sorted(os.listdir(queue.directory))[:2], sorted(os.listdir(queue.directory))[2:]
    assert kept == ['2-1.json', '3-1.json']
    assert [name.partition('.corrupt-')[0] for name in aside] == ['4-1.json']


def test_replay_stops_between_entries_when_asked(tmp_path):
    queue = state.DelQueue(str(tmp_path))
    queued_del(queue, '1-1.json', 'first')
    queued_del(queue, '2-1.json', 'second')
    stop = threading.Event()

    class StopAfterOne(ScriptedDeletes):
        def delete(self, req, deadline):
            stop.set()
            return super().delete(req, deadline)

    owner = StopAfterOne({'first': 'success', 'second': 'success'})
    assert recovery.replay_queue(owner, queue, stop=stop) == 1
    assert os.listdir(queue.directory) == ['2-1.json']


def test_housekeeper_resyncs_only_when_asked(ownership, registry, tmp_path):
    keeper = housekeeping.Housekeeper(ownership, state.DelQueue(str(tmp_path)))
    ownership.store.save(binding('ns/web', 'c1'))
    keeper.tick()
    assert registry.bindings.get('ns/web') is None        # nobody died: nothing to fix
    registry.status.request_resync()
    keeper.tick()
    assert registry.bindings.get('ns/web') == binding('ns/web', 'c1').summary()
    assert registry.status.take_resync_request() is False
