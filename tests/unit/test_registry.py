"""kuryr_cni.registry against a real multiprocessing Manager, and kuryr_cni.metrics.

No plain-dict stand-in: values go through the Manager process, so a value a
child writes must be what the parent reads, and the Manager must die with its
parent. The metrics are checked in fresh interpreters because
prometheus_client picks its multiprocess mode at import time.
"""

import multiprocessing
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from prometheus_client import parser as prom_parser

from kuryr_cni import records
from kuryr_cni import registry as registry_mod
from tests import wait

FORK = multiprocessing.get_context('fork')
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start_registry(**kwargs):
    """``(manager, registry, pid of the Manager process)``."""
    before = set(multiprocessing.active_children())
    manager, reg = registry_mod.Registry.start(**kwargs)
    new = set(multiprocessing.active_children()) - before
    assert len(new) == 1, new
    return manager, reg, new.pop().pid


@pytest.fixture
def started():
    """``(manager pid, registry)``, shut down (and checked gone) after the test."""
    manager, reg, pid = start_registry(title='kuryr-cni-daemon: registry (test)')
    yield pid, reg
    manager.shutdown()
    assert wait_gone(pid, 10), 'the Manager process outlived shutdown()'


@pytest.fixture
def reg(started):
    return started[1]


@pytest.fixture
def children():
    procs = []
    yield procs
    for proc in procs:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(5)


def run_child(children, target, *args):
    return run_children(children, target, [args])[0]


def run_children(children, target, arg_lists):
    """``target(*args)`` in a child per ``args``, all at once; each must exit 0."""
    procs = [FORK.Process(target=target, args=args) for args in arg_lists]
    children.extend(procs)
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    return procs


def is_gone(pid):
    """True once ``pid`` has exited (a zombie no init has reaped yet counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(')', 1)[1].split()[0] in ('Z', 'X')
    except FileNotFoundError:
        return True


def wait_gone(pid, timeout):
    """Whether ``pid`` (not our child) ends within ``timeout`` s: its pidfd says when."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0]) or is_gone(pid)
    finally:
        os.close(fd)


# -- tables -----------------------------------------------------------------

def test_pod_table_operations(reg):
    reg.replace_pods({'demo/a': {'uid': 'ua'}, 'demo/b': {'uid': 'ub'}})
    reg.put_pod('demo/c', {'uid': 'uc', 'vifs': {}})
    reg.drop_pod('demo/a')
    reg.drop_pod('demo/missing')                 # harmless
    assert reg.pods.snapshot() == {'demo/b': {'uid': 'ub'}, 'demo/c': {'uid': 'uc', 'vifs': {}}}
    assert reg.pods.size() == 2
    assert reg.pods.get('demo/c') == {'uid': 'uc', 'vifs': {}}
    assert reg.pods.get('demo/a') is None
    reg.replace_pods({})
    assert reg.pods.snapshot() == {}


def test_values_are_copies_not_shared_objects(reg):
    record = {'uid': 'u1', 'vifs': {}}
    reg.put_pod('demo/a', record)
    record['uid'] = 'changed locally'
    got = reg.pods.get('demo/a')
    got['vifs']['eth0'] = 'changed locally'
    assert reg.pods.get('demo/a') == {'uid': 'u1', 'vifs': {}}


def test_synced_flag(reg):
    assert reg.is_synced() is False
    reg.mark_synced(1)
    assert reg.is_synced() is True
    reg.mark_synced(0)
    assert reg.is_synced() is False


def binding(pod, **sandboxes):
    """The summary of a binding whose sandboxes have ``n`` attachments each (``cid=n``)."""
    return records.Summary(pod, next(iter(sandboxes), None), tuple(sandboxes.items()))


def _child_writes(reg):
    reg.put_pod('demo/web-0', {'uid': 'u-child', 'vifs': {'eth0': {'mtu': 1450}}})
    reg.mark_synced(True)
    reg.bindings.put('demo/web-0', binding('demo/web-0', **{'c-child': 0}))
    reg.status.process_started('cni-worker', 7, os.getpid(), 1.0)


def test_values_set_in_a_child_are_seen_by_the_parent(reg, children):
    proc = run_child(children, _child_writes, reg)
    assert reg.pods.get('demo/web-0') == {'uid': 'u-child', 'vifs': {'eth0': {'mtu': 1450}}}
    assert reg.is_synced() is True
    assert reg.bindings.find_container('c-child') == 'demo/web-0'
    assert reg.status.pid_of('cni-worker', 7) == proc.pid


def _child_puts_many(reg, prefix, count):
    for i in range(count):
        reg.put_pod('%s/pod-%d' % (prefix, i), {'uid': str(i)})


def test_concurrent_writers_lose_nothing(reg, children):
    run_children(children, _child_puts_many, [(reg, 'ns%d' % n, 50) for n in range(4)])
    assert reg.pods.size() == 200
    assert reg.pods.get('ns3/pod-49') == {'uid': '49'}


# -- change counters ---------------------------------------------------------

def _child_puts_and_drops(reg, key):
    reg.put_pod(key, {'uid': 'u-child'})
    reg.drop_pod(key)


def test_a_write_in_another_process_wakes_a_waiter(reg, children):
    seen = reg.changes.version('demo/web-0')
    proc = FORK.Process(target=_child_puts_and_drops, args=(reg, 'demo/web-0'))
    children.append(proc)
    proc.start()
    assert reg.changes.wait('demo/web-0', seen, 30)
    proc.join(30)
    assert reg.changes.version('demo/web-0') == (seen + 2) & 0xFFFFFFFF


@pytest.mark.parametrize('write', [
    lambda reg, key: reg.pods.put(key, {'uid': 'u'}),
    lambda reg, key: reg.pods.drop(key),
    lambda reg, key: reg.pods.replace({}),
    lambda reg, key: reg.bindings.put(key, records.Binding(key).summary()),
    lambda reg, key: reg.bindings.drop(key),
    lambda reg, key: reg.bindings.replace({}),
], ids=['pod put', 'pod drop', 'pod replace', 'binding put', 'binding drop',
        'binding replace'])
def test_every_write_of_a_pods_rows_moves_its_counter(reg, write):
    seen = reg.changes.version('demo/web-0')
    write(reg, 'demo/web-0')
    assert reg.changes.version('demo/web-0') != seen


def test_a_wait_without_change_ends_at_its_timeout(reg):
    seen = reg.changes.version('demo/web-0')
    reg.pods.put('demo/other', {'uid': 'u'})        # another slot (CRC of the key)
    assert not reg.changes.wait('demo/web-0', seen, 0.05)


def test_a_wake_of_the_waiters_own_ends_its_wait_and_no_other(reg):
    seen = reg.changes.version('demo/web-0')
    wake, other = threading.Event(), threading.Event()
    woken = []
    waiters = [threading.Thread(target=lambda e=e: woken.append(
        (e, reg.changes.wait('demo/web-0', seen, 30, e)))) for e in (wake, other)]
    for waiter in waiters:
        waiter.start()
    wake.set()
    waiters[0].join(10)
    assert woken == [(wake, True)]
    assert waiters[1].is_alive()
    reg.pods.put('demo/web-0', {'uid': 'u'})      # the registry's own change ends the other
    waiters[1].join(10)
    assert woken == [(wake, True), (other, True)]


def _child_puts_one_pod(reg, key, count):
    for _ in range(count):
        reg.put_pod(key, {'uid': 'u'})


def test_concurrent_writers_lose_no_bump(reg, children):
    seen = reg.changes.version('ns0/pod-0')
    run_children(children, _child_puts_one_pod, [(reg, 'ns0/pod-0', 50)] * 4)
    assert reg.changes.version('ns0/pod-0') == seen + 200


def _distinct_slots(reg, count):
    keys, slots = [], set()
    for n in range(count * 4):
        key = 'burst/pod-%d' % n
        if reg.changes._slot(key) not in slots:
            slots.add(reg.changes._slot(key))
            keys.append(key)
    return keys[:count]


def _lookouts():
    return {t for t in threading.enumerate() if t.name == 'kuryr-cni-changes'}


def _voluntary_switches(thread):
    with open('/proc/self/task/%d/status' % thread.native_id) as f:
        return int(next(line for line in f if line.startswith('voluntary_ctxt_switches'))
                   .split()[1])


def test_many_waiters_of_a_process_share_one_lookout_idle_without_them(reg):
    keys = _distinct_slots(reg, 30)
    seen = {key: reg.changes.version(key) for key in keys}
    woken = {}
    others = set(_lookouts())       # of other tests' registries

    def waiter(key):
        woken[key] = reg.changes.wait(key, seen[key], 30)

    threads = [threading.Thread(target=waiter, args=(key,)) for key in keys]
    for thread in threads:
        thread.start()
    for key in keys[:10]:
        reg.pods.put(key, {'uid': 'u'})
    wait.until(lambda: len(woken) == 10, 10, 'the ten waiters whose pod changed to wake')
    assert set(woken) == set(keys[:10]) and all(woken.values())
    for key in keys[10:]:
        reg.pods.put(key, {'uid': 'u'})
    for thread in threads:
        thread.join(10)
    assert len(woken) == 30 and all(woken.values())

    lookouts = list(_lookouts() - others)
    assert len(lookouts) == 1
    # With nobody waiting it sleeps, not polls (a poll every 5 ms: ~40 switches here).
    before = _voluntary_switches(lookouts[0])
    time.sleep(0.2)
    assert _voluntary_switches(lookouts[0]) - before <= 1


def _child_waits(reg, key, seen, answer):
    answer.send('waiting')
    answer.send(reg.changes.wait(key, seen, 10))


def test_a_child_forked_after_its_parent_waited_gets_a_lookout_of_its_own(reg, children):
    seen = reg.changes.version('demo/web-0')
    assert not reg.changes.wait('demo/web-0', seen, 0.01)      # the parent's lookout
    ours, theirs = FORK.Pipe()
    proc = FORK.Process(target=_child_waits, args=(reg, 'demo/web-0', seen, theirs))
    children.append(proc)
    proc.start()
    assert ours.poll(10) and ours.recv() == 'waiting'
    # A Manager round trip: the child waits by the time the counter moves. With the
    # parent's lookout, whose thread the child does not have, it would time out.
    reg.pods.put('demo/web-0', {'uid': 'u'})
    assert ours.poll(10), 'the child did not answer within 10 s'
    assert ours.recv() is True
    proc.join(10)


def test_find_container_follows_puts_drops_and_replace(reg):
    table = reg.bindings
    assert table.find_container('c1') is None
    table.put('demo/a', binding('demo/a', c1=1, c2=1))
    assert (table.find_container('c1'), table.find_container('c2')) == ('demo/a', 'demo/a')
    table.put('demo/a', binding('demo/a', c2=1))              # c1's sandbox is gone
    assert (table.find_container('c1'), table.find_container('c2')) == (None, 'demo/a')
    table.drop('demo/a')
    assert table.find_container('c2') is None
    table.drop('demo/a')                                      # harmless

    table.put('demo/old', binding('demo/old', c9=1))
    table.replace({'demo/b': binding('demo/b', c3=1), 'demo/c': binding('demo/c', c4=2)})
    assert table.find_container('c9') is None
    assert (table.find_container('c3'), table.find_container('c4')) == ('demo/b', 'demo/c')
    assert sorted(table.snapshot()) == ['demo/b', 'demo/c']

    # A container recorded under another key: dropping the old key keeps the new index.
    table.put('demo/d', binding('demo/d', c3=1))
    assert table.find_container('c3') == 'demo/d'
    table.drop('demo/b')
    assert table.find_container('c3') == 'demo/d'
    table.put('demo/b', binding('demo/b'))
    assert table.find_container('c3') == 'demo/d'


def test_binding_without_sandboxes_is_indexed_as_nothing(reg):
    reg.bindings.put('demo/a', records.Summary('demo/a', None))
    assert reg.bindings.get('demo/a') == records.Summary('demo/a', None)
    assert reg.bindings.count_attachments() == 0


def test_count_attachments(reg):
    table = reg.bindings
    assert table.count_attachments() == 0
    table.put('demo/a', binding('demo/a', c1=2, c2=1))
    table.put('demo/b', binding('demo/b', c3=0))
    assert table.count_attachments() == 3
    table.put('demo/a', binding('demo/a', c1=1))
    assert table.count_attachments() == 1
    table.replace({'demo/x': binding('demo/x', c5=4), 'demo/y': binding('demo/y', c6=1)})
    assert table.count_attachments() == 5
    table.drop('demo/x')
    assert table.count_attachments() == 1


def test_an_adds_calls_return_the_pods_record_of_the_same_managers_pod_table(reg):
    assert reg.bindings.add_started('c1', time.monotonic(), 'demo/a') is None
    assert reg.bindings.summary_and_record('demo/a') == (None, None)
    reg.pods.put('demo/a', {'uid': 'u1', 'vifs': {}})
    reg.bindings.put('demo/a', binding('demo/a', c1=1))
    assert reg.bindings.add_started('c2', time.monotonic(), 'demo/a') == {'uid': 'u1', 'vifs': {}}
    assert reg.bindings.summary_and_record('demo/a') == (binding('demo/a', c1=1),
                                                         {'uid': 'u1', 'vifs': {}})
    reg.pods.drop('demo/a')
    assert reg.bindings.summary_and_record('demo/a') == (binding('demo/a', c1=1), None)
    assert reg.bindings.add_started('c3', time.monotonic()) is None     # no pod named
    assert reg.bindings.adds_since(0) == {'c1', 'c2', 'c3'}


def test_an_add_awaits_an_unseen_pod_until_the_pods_table_has_it(reg):
    assert not reg.bindings.awaits_unseen_pod()
    reg.bindings.add_started('c0', time.monotonic())      # no pod named: awaits nothing
    assert not reg.bindings.awaits_unseen_pod()
    reg.bindings.add_started('c1', time.monotonic(), 'demo/a', token='t1')
    assert reg.bindings.awaits_unseen_pod()
    reg.pods.put('demo/a', {'uid': 'u1', 'vifs': {}})
    assert not reg.bindings.awaits_unseen_pod()
    reg.pods.drop('demo/a')
    assert reg.bindings.awaits_unseen_pod()
    reg.bindings.add_finished('t1')
    assert not reg.bindings.awaits_unseen_pod()


# -- the Manager process ------------------------------------------------------

def test_manager_process_is_named_after_its_role(started):
    pid, reg = started
    assert pid != os.getpid()
    with open('/proc/%d/cmdline' % pid, 'rb') as f:
        assert b'kuryr-cni-daemon: registry (test)' in f.read()


def _start_registry_and_wait(conn, address):
    manager, reg, pid = start_registry(address=address)
    reg.put_pod('demo/a', {'uid': 'u'})
    conn.send(pid)
    signal.pause()


def test_manager_dies_when_its_parent_is_sigkilled(children, tmp_path):
    parent_end, child_end = FORK.Pipe()
    # A socket path of the test's: the pymp-* directory multiprocessing would
    # make instead outlives a Manager that dies of a signal.
    owner = FORK.Process(target=_start_registry_and_wait,
                         args=(child_end, str(tmp_path / 'registry.sock')))
    owner.start()
    children.append(owner)
    manager_pid = None
    try:
        assert parent_end.poll(20), 'the registry did not start'
        manager_pid = parent_end.recv()
        assert not is_gone(manager_pid)
        os.kill(owner.pid, signal.SIGKILL)
        owner.join(10)
        assert owner.exitcode == -signal.SIGKILL
        assert wait_gone(manager_pid, 10), 'the Manager outlived its parent'
    finally:
        if manager_pid is not None and not is_gone(manager_pid):
            os.kill(manager_pid, signal.SIGKILL)


# -- metrics, in fresh interpreters -------------------------------------------

def run_python(code, *args):
    proc = subprocess.run(
        [sys.executable, '-c', textwrap.dedent(code), *args], cwd=REPO,
        env={k: v for k, v in os.environ.items() if k != 'PROMETHEUS_MULTIPROC_DIR'},
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def samples(exposition):
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in prom_parser.text_string_to_metric_families(exposition)
            for s in family.samples}


METRICS_SCRIPT = '''
    import multiprocessing, sys
    from kuryr_cni import metrics
    metrics.setup(sys.argv[1])

    def worker(n):
        for _ in range(n):
            metrics.stale_del_rejected('container_id_mismatch')
        metrics.observe_request('DEL', 'noop', 0.02)
        metrics.sandbox_evicted()

    procs = [multiprocessing.get_context('fork').Process(target=worker, args=(n,))
             for n in (3, 4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    metrics.stale_del_rejected('container_id_mismatch')
    metrics.observe_request('ADD', 'success', 0.3)

    if sys.argv[2:] == ['a file being created']:    # as MmapedDict leaves it before sizing
        open(sys.argv[1] + '/counter_999.db', 'wb').close()

    from prometheus_client import CollectorRegistry, generate_latest
    from kuryr_cni.daemon import collector
    registry = CollectorRegistry()
    collector.register_process_metrics(registry)
    sys.stdout.write(generate_latest(registry).decode())
'''


@pytest.mark.parametrize('also', [[], ['a file being created']], ids=['', 'file being created'])
def test_metrics_are_aggregated_across_processes(tmp_path, also):
    directory = tmp_path / 'prom'
    directory.mkdir()
    (directory / 'counter_12345.db').write_bytes(b'left by a previous run')
    got = samples(run_python(METRICS_SCRIPT, str(directory), *also))
    stale = 'kuryr_cni_stale_del_rejected_total'
    assert got[(stale, (('reason', 'container_id_mismatch'),))] == 8.0
    assert got[(stale, (('reason', 'pod_uid_mismatch'),))] == 0.0      # pre-created
    requests = 'kuryr_cni_requests_total'
    assert got[(requests, (('command', 'DEL'), ('result', 'noop')))] == 2.0
    assert got[(requests, (('command', 'ADD'), ('result', 'success')))] == 1.0
    assert got[('kuryr_cni_sandbox_evictions_total', ())] == 2.0
    duration = 'kuryr_cni_request_duration_seconds'
    ok = ('error', 'False')
    assert got[(duration + '_count', (('command', 'DEL'), ok))] == 2.0
    assert got[(duration + '_bucket', (('command', 'DEL'), ok, ('le', '0.025')))] == 2.0
    assert got[(duration + '_bucket', (('command', 'ADD'), ok, ('le', '0.25')))] == 0.0
    assert got[(duration + '_bucket', (('command', 'ADD'), ok, ('le', '0.5')))] == 1.0
    assert got[(duration + '_count', (('command', 'ADD'), ('error', 'True')))] == 0.0
    assert 'counter_12345.db' not in os.listdir(directory)   # setup() wiped the directory


def test_metric_functions_do_nothing_before_setup():
    out = run_python('''
        import os, sys
        from kuryr_cni import metrics
        metrics.observe_request('ADD', 'success', 0.1)
        metrics.in_flight(1)
        metrics.stale_del_rejected('container_id_mismatch')
        metrics.sandbox_evicted()
        metrics.vif_waited(0.5)
        metrics.watch_restarted('gone')
        metrics.watch_event('ADDED')
        metrics.worker_restarted('cni-worker')
        metrics.del_replayed()
        metrics.process_dead(os.getpid())
        print(metrics._m is None, 'prometheus_client' in sys.modules,
              'PROMETHEUS_MULTIPROC_DIR' in os.environ)
    ''')
    assert out.split() == ['True', 'False', 'False']


def test_binding_replace_is_atomic_for_readers(reg, children):
    """A reader never sees the table half replaced (every update is one atomic RPC)."""
    rows = {'ns/pod-%d' % i: binding('ns/pod-%d' % i, **{'c%d' % i: 1}) for i in range(20000)}
    rows['demo/stable'] = binding('demo/stable', stable=1)
    reg.bindings.replace(rows)
    parent_end, child_end = FORK.Pipe()
    proc = FORK.Process(target=_watch_stable, args=(reg, child_end))
    proc.start()
    children.append(proc)
    assert parent_end.poll(10) and parent_end.recv() == 'reading'
    for _ in range(5):
        reg.bindings.replace(rows)
    parent_end.send('stop')
    assert parent_end.poll(10)
    lookups, missing = parent_end.recv()
    proc.join(10)
    assert lookups > 0
    assert missing == 0, 'a reader saw "stable" missing during replace()'


def _watch_stable(reg, conn):
    conn.send('reading')
    lookups = missing = 0
    while not conn.poll():
        lookups += 1
        if reg.bindings.find_container('stable') != 'demo/stable':
            missing += 1
    conn.send((lookups, missing))


def test_two_adds_of_one_sandbox_each_end_only_their_own_mark_and_reservation(reg):
    """A runtime retries ADD c1 while the first still runs: each ADD has its token."""
    later = time.monotonic() + 60
    for token in ('t1', 't2'):
        reg.bindings.add_started('c1', time.monotonic(), 'ns/a', token)
        assert reg.bindings.admit_add('c1', 'ns/a', {'10.0.0.5'}, later, token) == \
            (False, 'c1', {})
    reg.bindings.add_finished('t1')
    assert reg.bindings.adds_since(0) == {'c1'}
    assert reg.bindings.reserve_addresses('c2', 'ns/b', {'10.0.0.5'}, later) == \
        {'10.0.0.5': 'ns/a'}
    reg.bindings.add_finished('t2')
    assert reg.bindings.adds_since(0) == set()
    assert reg.bindings.reserve_addresses('c2', 'ns/b', {'10.0.0.5'}, later) == {}


def test_a_del_cancels_the_adds_of_its_sandbox_in_flight_and_no_later_one(reg):
    """DEL c1 while two ADDs of c1 and one of c2 run: the two of c1 may claim nothing
    (and reserve nothing); c2's, and an ADD of c1 sent after the DEL, are admitted."""
    later = time.monotonic() + 60
    reg.bindings.add_started('c1', time.monotonic(), 'ns/a', 't1')
    reg.bindings.add_started('c1', time.monotonic(), 'ns/a', 't2')
    reg.bindings.add_started('c2', time.monotonic(), 'ns/b', 't3')
    reg.pods.put('ns/a', {'uid': 'u1', 'vifs': {}})
    assert reg.bindings.add_look('t1', 'ns/a') == (False, {'uid': 'u1', 'vifs': {}})
    seen = reg.changes.version('ns/a')
    assert reg.bindings.cancel_adds('c1') == {'ns/a'}
    assert reg.changes.version('ns/a') != seen          # the waiting ADDs look again
    assert reg.bindings.add_look('t1', 'ns/a') == (True, {'uid': 'u1', 'vifs': {}})
    assert reg.bindings.add_look('t3', 'ns/b') == (False, None)
    assert reg.bindings.cancel_adds('c9') == set()
    for token in ('t1', 't2'):
        assert reg.bindings.admit_add('c1', 'ns/a', {'10.0.0.5'}, later, token) == \
            (True, 'c1', {})
    assert reg.bindings.admit_add('c2', 'ns/b', {'10.0.0.6'}, later, 't3') == \
        (False, 'c2', {})
    assert reg.bindings.reserve_addresses('c3', 'ns/c', {'10.0.0.5'}, later) == {}
    reg.bindings.add_started('c1', time.monotonic(), 'ns/a', 't4')
    assert reg.bindings.admit_add('c1', 'ns/a', {'10.0.0.7'}, later, 't4') == \
        (False, 'c1', {})
    for token in ('t1', 't2', 't3', 't4'):
        reg.bindings.add_finished(token)
    assert reg.bindings.adds_since(0) == set()
