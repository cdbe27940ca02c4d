"""Health judgement, heartbeats, probe failure counts and the systemd notifier.

Against a real registry Manager (the heartbeats cross processes through it)
and a real datagram socket standing in for systemd's NOTIFY_SOCKET.
"""

import logging
import os
import socket
import time

import pytest

from kuryr_cni import registry as registry_mod
from kuryr_cni.daemon import health
from kuryr_cni.daemon import heartbeat
from kuryr_cni.daemon import ops
from kuryr_cni.daemon import sdnotify


def _register(reg, role, worker_id=0, pid=None, age=0.0):
    reg.status.process_started(role, worker_id, pid or os.getpid(), time.monotonic() - age)


def _healthy(reg):
    reg.status.set_heartbeat_timeout(5)
    _register(reg, 'cni-worker', 0)
    _register(reg, 'cni-worker', 1)
    _register(reg, 'watcher')
    reg.mark_synced(True)


def test_nothing_registered_is_neither_alive_nor_ready(registry):
    facts = health.judge(registry)
    assert (facts['alive'], facts['ready'], facts['workers']) == (False, False, 0)
    assert facts['problems'] == ['no CNI worker serving', 'watcher stuck or dead',
                                 'watcher not synced with the API server']


def test_healthy(registry):
    _healthy(registry)
    facts = health.judge(registry)
    assert (facts['alive'], facts['ready'], facts['workers']) == (True, True, 2)
    assert facts['problems'] == []


def test_not_synced_is_alive_but_not_ready(registry):
    _healthy(registry)
    registry.mark_synced(False)
    facts = health.judge(registry)
    assert (facts['alive'], facts['ready']) == (True, False)
    assert facts['problems'] == ['watcher not synced with the API server']


def test_a_worker_without_a_recent_beat_is_stuck(registry):
    _healthy(registry)
    _register(registry, 'cni-worker', 1, age=6)
    assert health.judge(registry)['workers'] == 1
    _register(registry, 'cni-worker', 0, age=6)
    facts = health.judge(registry)
    assert (facts['alive'], facts['ready'], facts['workers']) == (False, False, 0)
    assert facts['problems'] == ['no CNI worker serving']


def test_a_stuck_watcher_fails_liveness(registry):
    _healthy(registry)
    _register(registry, 'watcher', age=6)
    facts = health.judge(registry)
    assert (facts['alive'], facts['problems']) == (False, ['watcher stuck or dead'])


def test_dead_and_zombie_workers_do_not_serve(registry):
    _healthy(registry)
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        # Exited, not reaped yet (WNOWAIT): a zombie, which os.kill(pid, 0) would call alive.
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        assert _state(pid) == 'Z'
        _register(registry, 'cni-worker', 0, pid=pid)
        assert health.judge(registry)['workers'] == 1
    finally:
        os.waitpid(pid, 0)
    assert health.judge(registry)['workers'] == 1      # reaped: gone altogether


def _state(pid):
    with open('/proc/%d/stat' % pid) as f:
        return f.read().rpartition(')')[2].split()[0]


def test_a_saturated_socket_is_alive_but_not_ready_until_a_worker_has_room(registry):
    _healthy(registry)
    registry.status.set_saturated('cni-worker', 0, True)
    assert health.judge(registry)['ready']          # worker 1 still takes connections
    registry.status.set_saturated('cni-worker', 1, True)
    facts = health.judge(registry)
    assert (facts['alive'], facts['ready'], facts['socket_saturated']) == (True, False, True)
    assert facts['problems'] == ['CNI socket saturated']
    # An ADD still gets in (it waits in the backlog): STATUS's judgement holds.
    assert (facts['serves_adds'], facts['add_problems']) == (True, [])
    registry.status.set_saturated('cni-worker', 0, False)
    assert health.judge(registry)['ready']


def test_a_restarted_worker_starts_unsaturated(registry):
    _healthy(registry)
    registry.status.set_saturated('cni-worker', 0, True)
    registry.status.set_saturated('cni-worker', 1, True)
    _register(registry, 'cni-worker', 1)        # its successor
    assert health.judge(registry)['ready']


def test_shutting_down_is_not_ready_and_draining_workers_need_no_beat(registry):
    _healthy(registry)
    registry.status.mark_shutting_down()
    _register(registry, 'cni-worker', 0, age=60)
    _register(registry, 'cni-worker', 1, age=60)
    facts = health.judge(registry)
    assert (facts['alive'], facts['ready'], facts['workers']) == (True, False, 2)
    assert facts['problems'] == ['shutting down']
    assert (facts['serves_adds'], facts['add_problems']) == (False, ['shutting down'])


def test_a_dead_registry_manager_fails_everything():
    manager, reg = registry_mod.Registry.start()
    _healthy(reg)
    assert health.judge(reg)['ready']
    manager.shutdown()
    assert health.judge(reg) == {'alive': False, 'ready': False, 'serves_adds': False,
                                 'registry': False, 'problems': ['registry unavailable'],
                                 'add_problems': ['registry unavailable']}


def test_heartbeat_writes_at_most_once_per_interval(registry):
    beat = heartbeat.Heartbeat(registry.status, 'cni-worker', 3, timeout=3)
    assert beat.interval == 1
    before = time.monotonic()
    beat.beat()
    first = registry.status.facts().of_role('cni-worker')[3]
    beat.beat()
    assert registry.status.facts().of_role('cni-worker')[3] == first
    assert first.beat >= before


def test_probe_failures_count_up_and_reset_on_success(caplog):
    probes = ops.ProbeLog()
    failing = {'ready': False, 'problems': ['watcher not synced with the API server']}
    with caplog.at_level(logging.INFO, logger='kuryr_cni.daemon.ops'):
        assert [probes.record('ready', failing) for _ in range(3)] == [1, 2, 3]
        assert probes.record('alive', {'alive': True}) == 0
        assert probes.record('ready', {'ready': True}) == 0
        assert probes.record('ready', failing) == 1
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ['/ready is failing: watcher not synced with the API server',
                        '/ready passes again after 3 failed probes',
                        '/ready is failing: watcher not synced with the API server']


# --- systemd notify ----------------------------------------------------------------

@pytest.fixture
def systemd(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / 'notify'))
    # The notifier sends from the calling thread: what it sent is queued on return.
    sock.setblocking(False)
    yield sock, {'NOTIFY_SOCKET': str(tmp_path / 'notify')}
    sock.close()


def _received(sock):
    lines = []
    try:
        while True:
            lines.extend(sock.recv(4096).decode().split('\n'))
    except BlockingIOError:
        return lines


FACTS = {'registry': True, 'alive': True, 'ready': False, 'workers': 4,
         'watcher_synced': False, 'shutting_down': False,
         'problems': ['watcher not synced with the API server']}


def test_notifier_ready_once_status_on_change_watchdog_while_alive(systemd):
    sock, env = systemd
    facts = dict(FACTS)
    notifier = sdnotify.Notifier(lambda: facts, env=dict(env, WATCHDOG_USEC='4000000'))
    assert notifier.period == 1.0 and notifier.watchdog == 2.0
    notifier.tick()
    assert _received(sock) == ['STATUS=Starting: watcher not synced with the API server',
                               'WATCHDOG=1']
    facts.update(ready=True, watcher_synced=True, problems=[])
    notifier.tick()
    notifier.tick()
    assert _received(sock) == ['STATUS=Ready: 4 workers serving, watcher synced', 'READY=1',
                               'WATCHDOG=1', 'WATCHDOG=1']
    facts.update(ready=False, watcher_synced=False,
                 problems=['watcher not synced with the API server'])
    notifier.tick()
    assert _received(sock) == ['STATUS=Not ready: watcher not synced with the API server',
                               'WATCHDOG=1']
    facts.update(alive=False, workers=0, problems=['no CNI worker serving'])
    notifier.tick()
    notifier.tick()
    assert _received(sock) == ['STATUS=Unhealthy: no CNI worker serving']
    notifier.stop()
    assert _received(sock) == ['STOPPING=1', 'STATUS=Shutting down']


def test_notifier_without_watchdog_never_pings(systemd):
    sock, env = systemd
    notifier = sdnotify.Notifier(lambda: dict(FACTS, ready=True), env=env)
    notifier.tick()
    assert 'WATCHDOG=1' not in _received(sock)


def test_watchdog_for_another_pid_is_not_ours():
    assert sdnotify.watchdog_interval({'WATCHDOG_USEC': '1000000'}) == 0.5
    assert sdnotify.watchdog_interval({'WATCHDOG_USEC': '1000000',
                                       'WATCHDOG_PID': str(os.getpid() + 1)}) is None


def test_a_receiver_that_never_reads_cannot_block_the_notifier(systemd):
    """Seen in the storm test: the parent hung for ever in its shutdown's notification."""
    _, env = systemd
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as filler:
        filler.connect(env['NOTIFY_SOCKET'])
        filler.setblocking(False)
        with pytest.raises(BlockingIOError):
            for _ in range(100000):          # fill the receiver's queue
                filler.send(b'STATUS=filler')
    started = time.monotonic()
    assert sdnotify.notify('STOPPING=1', env) is False
    assert time.monotonic() - started < sdnotify.SEND_TIMEOUT + 2


def test_failing_queued_dels_are_reported_but_fail_no_probe(registry):
    """A dead sandbox's leftover must not take every pod of the node out of service."""
    _healthy(registry)
    registry.status.note_queued_dels(2, time.monotonic() - 90, [])
    facts = health.judge(registry)
    assert (facts['alive'], facts['ready'], facts['problems']) == (True, True, [])
    assert facts['queued_dels_failing'] == 2
    assert facts['warnings'] == [
        '2 queued DELs failing for up to 90 s, retried with back-off '
        '(kuryr-cni-ctl queued-dels)']
    registry.status.note_queued_dels(0, None, [])
    assert health.judge(registry)['warnings'] == []
