"""Start-up recovery, and the steps that also run while the daemon runs: mirror
resync, DEL queue replay, tidying of temporary files.

Against a real registry Manager, a real state directory and the recording
kernel port. Some replay tests give ``replay_queue`` an ownership whose
``delete`` is scripted, to check what replay does with each outcome.
"""

import json
import os
import threading

import pytest

from kuryr_cni import errors
from kuryr_cni import kernel
from kuryr_cni import ownership as ownership_rules
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
    """An ownership whose DELs answer from a script: container ID -> outcome or exception
    (a list: one answer per attempt)."""

    def __init__(self, script, registry):
        self.script = script
        self.registry = registry
        self.seen = []

    def delete(self, req, deadline, vifs_known=True):
        self.seen.append(req.container_id)
        answer = self.script[req.container_id]
        if isinstance(answer, list):
            answer = answer.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def queued_del(queue, name, container_id):
    body = {'CNI_COMMAND': 'DEL', 'CNI_CONTAINERID': container_id, 'CNI_NETNS': '',
            'CNI_IFNAME': 'eth0', 'CNI_ARGS': 'K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web',
            'CNI_PATH': '', 'config': {'cniVersion': '1.0.0', 'name': 'kuryr',
                                       'type': 'kuryr-cni'}}
    state.write_atomically(queue.directory, name, json.dumps(body).encode())


def test_replay_removes_done_entries_keeps_every_failed_one_and_sets_aside_only_non_dels(
        tmp_path, registry):
    """The shim told the runtime "success" for each: a DEL whose replay fails, for any
    reason, is kept for a retry; only what is no DEL at all is set aside."""
    queue = state.DelQueue(str(tmp_path))
    for name, cid in (('1-1.json', 'done'), ('2-1.json', 'busy'), ('3-1.json', 'bug'),
                      ('4-1.json', 'refused'), ('5-1.json', 'stale'), ('6-1.json', 'newer'),
                      ('7-1.json', 'host-netns'), ('8-1.json', '')):
        queued_del(queue, name, cid)
    owner = ScriptedDeletes({'done': 'success', 'stale': 'stale',
                             'busy': errors.TryAgainLater('pod lock busy'),
                             'bug': RuntimeError('unexpected'),
                             'refused': errors.BindingFailed('the kernel refused'),
                             'newer': errors.UnreadableState('written by a newer kuryr-cni'),
                             'host-netns': errors.InvalidEnvironment('no')}, registry)
    assert recovery.replay_queue(owner, queue) == 2
    assert owner.seen == ['done', 'busy', 'bug', 'refused', 'stale', 'newer', 'host-netns']
    names = sorted(os.listdir(queue.directory))
    assert [n for n in names if '.corrupt-' not in n] == [
        '2-1.json', '3-1.json', '4-1.json', '6-1.json', '7-1.json']
    assert [n.partition('.corrupt-')[0] for n in names if '.corrupt-' in n] == ['8-1.json']
    queued = registry.status.queued_dels()
    assert queued['failing'] == 5
    assert [(e['entry'], e['container_id'], e['attempts']) for e in queued['entries']] == [
        ('2-1.json', 'busy', 1), ('3-1.json', 'bug', 1), ('4-1.json', 'refused', 1),
        ('6-1.json', 'newer', 1), ('7-1.json', 'host-netns', 1)]
    assert 'the kernel refused (code 101)' in queued['entries'][2]['error']
    assert registry.status.facts().queued_dels_failing == 5


def test_a_failing_queued_del_is_retried_with_back_off_until_it_is_applied(
        tmp_path, registry, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(recovery.time, 'monotonic', lambda: clock[0])
    queue = state.DelQueue(str(tmp_path))
    queued_del(queue, '1-1.json', 'a')
    refused = errors.BindingFailed('OVSDB: not allowed')
    owner = ScriptedDeletes({'a': [refused] * 5 + ['success']}, registry)
    retries = recovery.Retries(first=2, cap=10, age_limit=3600)
    tried_at = []
    for _ in range(60):
        seen = len(owner.seen)
        recovery.replay_queue(owner, queue, retries=retries)
        if len(owner.seen) > seen:
            tried_at.append(clock[0] - 1000)
        clock[0] += 1
    assert tried_at == [0, 2, 6, 14, 24, 34]      # 2, 4, 8, then at most 10 s apart
    assert os.listdir(queue.directory) == []
    assert registry.status.queued_dels() == {'failing': 0, 'entries': []}


class NeedsVIFs(ScriptedDeletes):
    """DELs of sandboxes of pods without binding: deferred until the pods' VIFs are known."""

    def delete(self, req, deadline, vifs_known=True):
        if not vifs_known:
            self.seen.append(req.container_id)
            return ownership_rules.DEFERRED
        return super().delete(req, deadline)


def test_a_queued_del_needing_the_pods_vifs_waits_for_the_watcher_unnoticed_as_failing(
        tmp_path, registry):
    """Replayed at start-up, before the watcher's list, a DEL that only the pod's VIFs can
    prove kuryr-daemon's devices for stays queued, is not a failure, and is applied at
    the first replay once the watcher has synced."""
    queue = state.DelQueue(str(tmp_path))
    queued_del(queue, '1-1.json', 'a')
    owner = NeedsVIFs({'a': 'success'}, registry)
    retries = recovery.Retries()
    assert not registry.is_synced()
    assert recovery.replay_queue(owner, queue, retries=retries) == 0
    assert recovery.replay_queue(owner, queue, retries=retries) == 0    # due every round
    assert owner.seen == ['a', 'a']
    assert os.listdir(queue.directory) == ['1-1.json']
    assert registry.status.queued_dels() == {'failing': 0, 'entries': []}
    registry.mark_synced(True)
    assert recovery.replay_queue(owner, queue, retries=retries) == 1
    assert os.listdir(queue.directory) == []


@pytest.mark.parametrize('deferred', [False, True], ids=['failing', 'deferred'])
def test_a_queued_del_failing_or_deferred_past_the_age_limit_is_set_aside(
        tmp_path, registry, monkeypatch, deferred):
    clock = [1000.0]
    monkeypatch.setattr(recovery.time, 'monotonic', lambda: clock[0])
    queue = state.DelQueue(str(tmp_path))
    queued_del(queue, '1-1.json', 'a')
    owner = NeedsVIFs({'a': 'success'}, registry) if deferred else \
        ScriptedDeletes({'a': errors.BindingFailed('refused')}, registry)
    retries = recovery.Retries(first=2, cap=10, age_limit=60)
    recovery.replay_queue(owner, queue, retries=retries)
    clock[0] += 59
    recovery.replay_queue(owner, queue, retries=retries)
    assert os.listdir(queue.directory) == ['1-1.json']
    clock[0] += 10
    recovery.replay_queue(owner, queue, retries=retries)
    (aside,) = os.listdir(queue.directory)
    assert aside.startswith('1-1.json.corrupt-')
    assert registry.status.queued_dels()['failing'] == 0


def test_replay_stops_between_entries_when_asked(tmp_path, registry):
    queue = state.DelQueue(str(tmp_path))
    queued_del(queue, '1-1.json', 'first')
    queued_del(queue, '2-1.json', 'second')
    stop = threading.Event()

    class StopAfterOne(ScriptedDeletes):
        def delete(self, req, deadline, vifs_known=True):
            stop.set()
            return super().delete(req, deadline)

    owner = StopAfterOne({'first': 'success', 'second': 'success'}, registry)
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


class RecordedDeletes:
    """An ownership that records the DELs it is asked to apply, with the real kernel port."""

    def __init__(self, store):
        self.store = store
        self.kernel = kernel.Kernel()
        self.seen = []

    def delete(self, req, deadline):
        self.seen.append((req.container_id, req.netns, req.ifname, req.network, req.pod.key,
                          req.pod.uid))
        return 'success'


def test_the_del_of_a_sandbox_whose_namespace_vanished_is_applied(ownership, tmp_path):
    run = tmp_path / 'netns'
    run.mkdir()

    def recorded(pod, cid, netns):
        attachment = records.Attachment('kuryr', 'eth0', [])
        return records.Binding(pod, cid, 'u-' + cid, {cid: records.Sandbox(
            cid, netns, 'u-' + cid, {attachment.key: attachment})})

    ownership.store.save(recorded('ns/gone', 'c1', str(run / 'gone')))
    ownership.store.save(recorded('ns/alive', 'c2', '/proc/self/ns/net'))
    # A namespace directory this process does not see proves nothing.
    ownership.store.save(recorded('ns/unseen', 'c3', str(tmp_path / 'unmounted' / 'x')))
    deletes = RecordedDeletes(ownership.store)
    assert recovery.delete_vanished(deletes) == 1
    assert deletes.seen == [('c1', None, 'eth0', 'kuryr', 'ns/gone', 'u-c1')]
