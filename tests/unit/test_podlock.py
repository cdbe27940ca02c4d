"""kuryr_cni.podlock: per-pod serialisation across real processes.

Mutual exclusion is observed through its outcome: processes that do a
read-modify-write of a shared counter file and log their entry and exit
under the lock must never lose an update or interleave. A holder killed
with SIGKILL must release the lock (the kernel drops its flock), and
removing the lock file must never let two holders in at once.
"""

import contextlib
import multiprocessing
import os
import signal
import threading
import time

import pytest

from kuryr_cni import errors
from kuryr_cni import podlock
from kuryr_cni import state

POD = 'demo/web-0'
LOCK0 = state.file_stem(POD) + '.lock'
LOCK1 = state.file_stem('demo/web-1') + '.lock'
FORK = multiprocessing.get_context('fork')


@pytest.fixture
def children():
    """Processes started by a test; any still alive at the end are killed by pid."""
    started = []
    yield started
    for proc in started:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(5)


def start(children, target, *args):
    proc = FORK.Process(target=target, args=args, daemon=True)
    proc.start()
    children.append(proc)
    return proc


def deadline(seconds):
    return time.monotonic() + seconds


def assert_unavailable(directory, pod_key=POD, wait=0.05):
    """Nobody else can take ``pod_key`` now (someone holds the file at its path)."""
    with pytest.raises(errors.TryAgainLater):
        with podlock.PodLocks(directory).hold(pod_key, deadline(wait)):
            pass


# -- one process ------------------------------------------------------------

def test_hold_creates_the_pod_lock_file(tmp_path):
    locks = podlock.PodLocks(str(tmp_path))
    assert locks.path(POD) == str(tmp_path / LOCK0)
    assert locks.held_files() == []
    with locks.hold(POD, deadline(1)):
        assert locks.held_files() == [LOCK0]
    assert locks.held_files() == [LOCK0]    # kept until removed


def test_held_files_of_a_missing_directory_is_empty(tmp_path):
    assert podlock.PodLocks(str(tmp_path / 'absent')).held_files() == []


def test_second_holder_times_out_with_try_again_later(tmp_path):
    locks = podlock.PodLocks(str(tmp_path))
    with locks.hold(POD, deadline(5)):
        limit = deadline(0.2)
        with pytest.raises(errors.TryAgainLater) as info:
            # another PodLocks, another open file description: flock excludes it
            with podlock.PodLocks(str(tmp_path)).hold(POD, limit):
                pytest.fail('two holders of one pod lock')
        assert time.monotonic() >= limit       # it waited until its deadline, not less
    assert info.value.code == 11
    assert info.value.retry is True
    assert info.value.http_status == 503


def test_the_same_instance_does_not_reenter(tmp_path):
    locks = podlock.PodLocks(str(tmp_path))
    with locks.hold(POD, deadline(5)):
        with pytest.raises(errors.TryAgainLater):
            with locks.hold(POD, deadline(0.05)):
                pytest.fail('a pod lock was taken twice')


def test_other_pods_are_independent(tmp_path):
    locks = podlock.PodLocks(str(tmp_path))
    with locks.hold(POD, deadline(5)):
        # An expired deadline: taken only if free at the first try, without waiting.
        with locks.hold('demo/web-1', time.monotonic() - 1):
            assert sorted(locks.held_files()) == sorted([LOCK0, LOCK1])


def test_free_lock_is_taken_even_with_an_expired_deadline(tmp_path):
    locks = podlock.PodLocks(str(tmp_path))
    with locks.hold(POD, time.monotonic() - 1):
        assert_unavailable(str(tmp_path))


def test_released_when_the_block_raises(tmp_path):
    locks = podlock.PodLocks(str(tmp_path))
    with pytest.raises(RuntimeError):
        with locks.hold(POD, deadline(1)):
            raise RuntimeError('boom')
    with locks.hold(POD, deadline(0.1)):
        pass


def _descriptors_under(path):
    """This process's descriptors of files under ``path``: the locks' own, whatever
    else the test process opens or the garbage collector closes meanwhile."""
    found = set()
    for fd in os.listdir('/proc/self/fd'):
        with contextlib.suppress(OSError):      # the listing's own descriptor, closed
            if os.readlink('/proc/self/fd/' + fd).startswith(str(path) + '/'):
                found.add(fd)
    return found


def test_no_descriptor_leaks(tmp_path):
    locks = podlock.PodLocks(str(tmp_path))
    before = _descriptors_under(tmp_path)
    for _ in range(20):
        with locks.hold(POD, deadline(1)) as remove:
            remove()
    with locks.hold(POD, deadline(1)):
        with pytest.raises(errors.TryAgainLater):
            with podlock.PodLocks(str(tmp_path)).hold(POD, deadline(0.05)):
                pass
    assert _descriptors_under(tmp_path) == before


def test_remove_deletes_the_lock_file_at_release(tmp_path):
    locks = podlock.PodLocks(str(tmp_path))
    with locks.hold(POD, deadline(1)) as remove:
        remove()
        # Still held: the file stays until release, so no second holder can
        # start on a fresh file while this one is inside its block.
        assert locks.held_files() == [LOCK0]
        remove()                     # twice is harmless
    assert locks.held_files() == []
    with locks.hold(POD, deadline(1)):
        assert locks.held_files() == [LOCK0]


class _RemovedBeforeLocking(podlock.PodLocks):
    """Simulates a holder removing the file between our open() and our flock()."""

    def __init__(self, directory):
        super().__init__(directory)
        self.attempts = 0

    def _try_lock(self, fd):
        self.attempts += 1
        if self.attempts == 1:
            os.unlink(self.path(POD))
        return super()._try_lock(fd)


def test_lock_on_a_removed_file_is_retried_on_the_fresh_file(tmp_path):
    """The re-check after locking: a flock on an unlinked inode protects nothing."""
    (tmp_path / LOCK0).touch()
    locks = _RemovedBeforeLocking(str(tmp_path))
    with locks.hold(POD, deadline(5)):
        assert locks.attempts == 2
        assert locks.held_files() == [LOCK0]
        assert_unavailable(str(tmp_path))


# -- across processes -------------------------------------------------------

def _append(path, line):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _contend(directory, log, counter, rounds, remove):
    locks = podlock.PodLocks(directory)
    me = os.getpid()
    for _ in range(rounds):
        with locks.hold(POD, deadline(60)) as remove_lock:
            _append(log, 'enter %d\n' % me)
            with open(counter, 'r+') as f:         # a read-modify-write that loses
                value = int(f.read())              # updates unless it is exclusive
                os.sched_yield()
                f.seek(0)
                f.write(str(value + 1))
                f.truncate()
            _append(log, 'exit %d\n' % me)
            if remove:
                remove_lock()        # last, as kuryr_cni.ownership does


def _check_serialised(log_path, expected_rounds):
    lines = open(log_path).read().splitlines()
    assert len(lines) == 2 * expected_rounds
    for i in range(0, len(lines), 2):
        enter, exit_ = lines[i].split(), lines[i + 1].split()
        assert (enter[0], exit_[0], enter[1]) == ('enter', 'exit', exit_[1]), \
            'holders overlapped at line %d: %s' % (i, lines[i:i + 4])


@pytest.mark.parametrize('remove', [False, True], ids=['keep-file', 'remove-file'])
def test_mutual_exclusion_across_processes(tmp_path, children, remove):
    workers, rounds = 4, 40
    log, counter = str(tmp_path / 'log'), str(tmp_path / 'counter')
    locks_dir = tmp_path / 'locks'
    locks_dir.mkdir()
    with open(counter, 'w') as f:
        f.write('0')
    procs = [start(children, _contend, str(locks_dir), log, counter, rounds, remove)
             for _ in range(workers)]
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    assert open(counter).read() == str(workers * rounds)
    _check_serialised(log, workers * rounds)
    lock_files = podlock.PodLocks(str(locks_dir)).held_files()
    assert lock_files == ([] if remove else [LOCK0])


def _hold_until(directory, held, release, remove):
    with podlock.PodLocks(directory).hold(POD, deadline(30)) as remove_lock:
        held.set()
        release.wait(30)
        if remove:
            remove_lock()


def test_waiter_times_out_while_another_process_holds(tmp_path, children):
    held, release = FORK.Event(), FORK.Event()
    holder = start(children, _hold_until, str(tmp_path), held, release, False)
    assert held.wait(10)
    limit = deadline(0.3)
    with pytest.raises(errors.TryAgainLater) as info:
        with podlock.PodLocks(str(tmp_path)).hold(POD, limit):
            pytest.fail('took a lock another process holds')
    assert info.value.code == 11
    assert time.monotonic() >= limit
    release.set()
    holder.join(10)
    assert holder.exitcode == 0
    with podlock.PodLocks(str(tmp_path)).hold(POD, deadline(1)):
        pass


def test_lock_of_a_sigkilled_holder_is_released(tmp_path, children):
    held, never = FORK.Event(), FORK.Event()
    holder = start(children, _hold_until, str(tmp_path), held, never, False)
    assert held.wait(10)
    assert_unavailable(str(tmp_path))
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    assert holder.exitcode == -signal.SIGKILL
    # Free at once (the kernel dropped the flock): an expired deadline still gets it.
    with podlock.PodLocks(str(tmp_path)).hold(POD, time.monotonic() - 1):
        pass


class _ReportsWaiting(podlock.PodLocks):
    def __init__(self, directory):
        super().__init__(directory)
        self.waiting = threading.Event()

    def _try_lock(self, fd):
        taken = super()._try_lock(fd)
        if not taken:
            self.waiting.set()
        return taken


def test_waiter_gets_a_fresh_file_after_the_holder_removes_it(tmp_path, children):
    held, release = FORK.Event(), FORK.Event()
    holder = start(children, _hold_until, str(tmp_path), held, release, True)
    assert held.wait(10)
    waiter = _ReportsWaiting(str(tmp_path))
    seen = {}

    def wait_for_lock():
        try:
            with waiter.hold(POD, deadline(10)):
                seen['files'] = waiter.held_files()
                # exclusive: nobody else can take the pod while the waiter holds it
                try:
                    assert_unavailable(str(tmp_path))
                    seen['exclusive'] = True
                except BaseException as exc:     # report to the main thread
                    seen['exclusive'] = exc
        except BaseException as exc:
            seen['error'] = exc

    thread = threading.Thread(target=wait_for_lock)
    thread.start()
    try:
        assert waiter.waiting.wait(10), 'the waiter never found the lock taken'
        assert waiter.held_files() == [LOCK0]
    finally:
        release.set()            # the holder removes the file and exits
        thread.join(15)
    holder.join(10)
    assert holder.exitcode == 0
    assert 'error' not in seen, seen.get('error')
    assert seen == {'files': [LOCK0], 'exclusive': True}


def test_remove_unused_takes_only_free_lock_files_of_pods_without_binding(tmp_path):
    locks = podlock.PodLocks(str(tmp_path))
    for pod in ('ns/left', 'ns/bound', 'ns/busy'):
        with locks.hold(pod, time.monotonic() + 5):
            pass
    bound = {state.file_stem('ns/bound')}
    with locks.hold('ns/busy', time.monotonic() + 5):
        assert locks.remove_unused(lambda stem: stem in bound) == 1
        assert locks.held_files() == sorted(state.file_stem(p) + '.lock'
                                            for p in ('ns/bound', 'ns/busy'))
    assert locks.remove_unused(lambda stem: stem in bound) == 1
    assert locks.held_files() == [state.file_stem('ns/bound') + '.lock']
