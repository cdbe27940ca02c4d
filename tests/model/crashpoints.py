"""Crash points and a deterministic scheduler for driving the real daemon code in-process.

The state machine of tests/model/test_real_protocol.py runs every CNI request,
replay and recovery of the real :class:`kuryr_cni.ownership.Ownership` (its
``BindingStore``, DEL queue, ``PodLocks``, a real registry Manager) in a thread of its own
standing for the process that serves it: a :class:`Worker`. This module gives
those workers what the test needs of them:

* **Crash points, ALICE-style.** :func:`watch_filesystem` replaces the ``os``
  and ``fcntl`` that :mod:`kuryr_cni.state` and :mod:`kuryr_cni.podlock` see with
  proxies that count every call with a durable effect (``open`` for writing or
  creating, ``write``, ``fsync``, ``rename``, ``replace``, ``unlink``,
  ``flock``) and, at the worker's chosen count, let the call complete and then
  kill the worker: :class:`Crash`, a ``BaseException`` that nothing in the daemon
  catches. From then on the worker is dead: every further filesystem, registry
  or kernel call it tries raises :class:`Crash` again without effect (its
  ``finally`` blocks cannot write, unlink or tell the registry anything, as a
  killed process could not), and every descriptor it opened is closed at once,
  which drops its flocks as the kernel drops those of a dead process. What the
  completed calls did stays on disk: "calls completed before the crash
  persist". (Whether an un-fsynced write survives a power loss is a further
  question this does not ask.)
* **A deterministic scheduler.** Only one worker runs at a time. An ADD waits
  for its VIFs through the registry's change counters
  (:class:`kuryr_cni.registry.Changes`); :class:`ControlledChanges` keeps the
  real counters and replaces only the waiting: the worker parks, and the test's
  thread resumes it when its pod's counter moved (or it was killed, or its clock
  was moved past its deadline), one at a time, in the order the workers started.
  A run of the same rules is the same run, so Hypothesis can replay and shrink it.
"""

import collections
import contextlib
import dataclasses
import fcntl as real_fcntl
import os as real_os
import sys
import threading
import time as real_time

from kuryr_cni import errors
from kuryr_cni import ownership as ownership_mod
from kuryr_cni import podlock
from kuryr_cni import state

RESUME_TIMEOUT = 30         # seconds a resumed worker may run before it must park or end
_WRITE_FLAGS = real_os.O_WRONLY | real_os.O_RDWR | real_os.O_CREAT | real_os.O_TRUNC

_current = threading.local()

# (what the worker did: ADD, DEL, GC, restore, housekeeping, shim, ...; after how many
# durable calls it died; the last one's name) -> how often: the crash points covered
CRASHED = collections.Counter()


# module:function of the package's code on the stack of each durable call counted: the
# code paths a crash point was offered on (tests/model/durable_sites.py lists them all)
SITES = set()
_PACKAGE = real_os.path.dirname(ownership_mod.__file__) + real_os.sep
_WRAPPED = (state.__file__, podlock.__file__)


def _call_sites():
    frame, found = sys._getframe(2), set()
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith(_PACKAGE) and code.co_filename not in _WRAPPED:
            found.add('%s:%s' % (frame.f_globals['__name__'], code.co_qualname))
        frame = frame.f_back
    return found


class Crash(BaseException):
    """The worker's process dies here; raised again at each call it tries afterwards."""


def current():
    """The :class:`Worker` this thread runs for, or None (the test's own thread)."""
    return getattr(_current, 'worker', None)


@dataclasses.dataclass
class Call:
    """One filesystem call with a durable effect, as a worker made it."""

    name: str           # open, write, fsync, rename, replace, unlink, flock
    path: str           # the file (for write/fsync/flock: the one the descriptor was opened on)

    def where(self, state_dir):
        """The state dir's subdirectory the call is about: bindings, locks, del-queue or ''."""
        rel = real_os.path.relpath(self.path, state_dir)
        return rel.split(real_os.sep)[0] if not rel.startswith('..') and real_os.sep in rel \
            else ''


class Worker:
    """One process's worth of work (a request, a replay, a recovery) on a thread of its own."""

    def __init__(self, name, crash_after=None):
        self.name = name
        self.crash_after = crash_after      # die right after this many durable calls (None: never)
        self.calls = []                     # Call, in order
        self.dead = False
        self.clock_offset = 0.0             # added to ownership's monotonic clock (timeouts)
        self.fds = {}                       # descriptor -> path, of those opened and not closed
        self.outcome = None                 # ('ok', value) | ('error', exception) | ('crash', None)
        self.parked_on = None               # (key, counter seen) while parked in a wait
        self._go = threading.Event()

    # Life and death ------------------------------------------------------------------

    def alive(self):
        """Raise :class:`Crash` in a dead worker: a dead process does nothing more."""
        if self.dead:
            raise Crash(self.name)

    def die(self):
        """Kill the worker: its descriptors close (and with them its flocks)."""
        self.dead = True
        for fd in list(self.fds):
            self.fds.pop(fd)
            with contextlib.suppress(OSError):
                real_os.close(fd)

    def before_durable_call(self):
        """A durable call is next: raise :class:`Crash` in a dead worker, and die here if
        the worker was to die before its first."""
        if self.crash_after == 0 and not self.calls and not self.dead:
            CRASHED[(self.name.partition(' ')[0], 0, 'before its first')] += 1
            self.die()
        self.alive()

    def counted(self, name, path):
        """A durable call completed: record it, and die if it was the chosen one."""
        self.calls.append(Call(name, path))
        SITES.update(_call_sites())
        if len(self.calls) == self.crash_after:
            CRASHED[(self.name.partition(' ')[0], self.crash_after, name)] += 1
            self.die()
            raise Crash('%s after %s %s' % (self.name, name, path))

    @property
    def done(self):
        return self.outcome is not None


class Scheduler:
    """Runs workers one at a time on their own threads; the test's thread decides who runs."""

    def __init__(self, changes):
        self.changes = changes          # the real registry Changes (its counters)
        self.workers = []               # every worker not yet done, in start order
        # observe(worker, run): called around each slice a worker runs (run() runs it)
        self.observe = None
        self._turn = threading.Condition()

    def start(self, worker, fn):
        """Run ``fn()`` as ``worker`` until it parks or ends; returns the worker."""
        self.workers.append(worker)
        _Thread.take().jobs.append((self, worker, fn))
        self._resume(worker)
        return worker

    def _ended(self, worker, outcome):
        with self._turn:
            worker.outcome = outcome
            self._turn.notify_all()

    def _resume(self, worker):
        def run():
            with self._turn:
                worker.parked_on = None
                worker._go.set()
                if not self._turn.wait_for(lambda: worker.done or worker.parked_on is not None,
                                           RESUME_TIMEOUT):
                    raise AssertionError('worker %s neither parked nor ended within %d s'
                                         % (worker.name, RESUME_TIMEOUT))

        try:
            if self.observe is None:
                run()
            else:
                self.observe(worker, run)
        finally:
            # Also when an invariant failed on the slice: the worker ended all the same,
            # and the stop in the test's clean-up must not report it as one that never ends.
            if worker.done:
                self.workers.remove(worker)

    def park(self, worker, key, seen):
        """Called in ``worker``'s thread: wait until the test's thread resumes it."""
        with self._turn:
            worker._go.clear()
            worker.parked_on = (key, seen)
            self._turn.notify_all()
        worker._go.wait()

    def wakeable(self, worker):
        if worker.dead or worker.clock_offset:
            return True
        key, seen = worker.parked_on
        return self.changes.version(key) != seen

    def settle(self, limit=200):
        """Resume parked workers whose wait is over, oldest first, until none is."""
        for _ in range(limit):
            ready = [w for w in self.workers if w.parked_on is not None and self.wakeable(w)]
            if not ready:
                return
            self._resume(ready[0])
        raise AssertionError('workers keep waking each other: %s'
                             % [w.name for w in self.workers])

    def kill_all(self):
        """Every worker dies where it is (a daemon stop); parked ones unwind."""
        for worker in list(self.workers):
            worker.die()
        self.settle()
        assert not self.workers, [w.name for w in self.workers]


class _Thread:
    """A thread that runs workers one after the other.

    Reused, because each thread opens its own connection to the registry
    Manager (and the Manager a thread to serve it): a thread per worker made
    hundreds of them per example.
    """

    _idle = []
    _lock = threading.Lock()

    def __init__(self):
        self.jobs = _Jobs()
        threading.Thread(target=self._run, name='model-worker', daemon=True).start()

    @classmethod
    def take(cls):
        with cls._lock:
            return cls._idle.pop() if cls._idle else cls()

    def _run(self):
        while True:
            scheduler, worker, fn = self.jobs.get()
            _current.worker = worker
            worker._go.wait()
            try:
                worker.alive()
                outcome = ('ok', fn())
            except Crash:
                outcome = ('crash', None)
            except BaseException as exc:   # noqa: B902 - reported to the test's thread
                outcome = ('error', exc)
            worker.die()        # what it left open closes with its process
            _current.worker = None
            with self._lock:
                self._idle.append(self)
            scheduler._ended(worker, outcome)


class _Jobs:
    """A one-slot queue of jobs for a :class:`_Thread`."""

    def __init__(self):
        self._items = []
        self._ready = threading.Condition()

    def append(self, job):
        with self._ready:
            self._items.append(job)
            self._ready.notify()

    def get(self):
        with self._ready:
            self._ready.wait_for(lambda: self._items)
            return self._items.pop(0)


class ControlledChanges:
    """The registry's :class:`kuryr_cni.registry.Changes` whose ``wait`` parks the worker."""

    def __init__(self, real, scheduler):
        self._real = real
        self._scheduler = scheduler

    def version(self, key):
        worker = current()
        if worker is not None:
            worker.alive()
        return self._real.version(key)

    def wait(self, key, seen, timeout, wake=None):
        # wake: an OVSDB row's signal (kuryr_cni.readiness); the machine's ownership
        # waits for `active` alone, so nothing sets it while a worker is parked.
        worker = current()
        if worker is None:
            return self._real.wait(key, seen, timeout, wake)
        worker.alive()
        self._scheduler.park(worker, key, seen)
        worker.alive()
        return self._real.version(key) != seen


class _Guarded:
    """A proxy whose every method refuses to run for a dead worker."""

    def __init__(self, target):
        self._target = target

    def __getattr__(self, name):
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            worker = current()
            if worker is not None:
                worker.alive()
            return attr(*args, **kwargs)
        return call


class GuardedRegistry:
    """A :class:`kuryr_cni.registry.Registry` as one worker process sees it."""

    def __init__(self, registry, scheduler):
        self.real = registry
        self.pods = _Guarded(registry.pods)
        self.bindings = _Guarded(registry.bindings)
        self.status = _Guarded(registry.status)
        self.stale_dels = _Guarded(registry.stale_dels)
        self.changes = ControlledChanges(registry.changes, scheduler)

    def __getattr__(self, name):
        return getattr(self.real, name)


class FaultyPort(_Guarded):
    """The ownership rules' kernel port, refusing a dead worker and failing on demand.

    ``fail_connect``: the next ``connect`` makes its devices and then fails, as a
    driver refused half-way; ``fail_disconnect``: the next ``disconnect`` is
    refused before it removes anything (a kernel refusal, code 101).
    """

    def __init__(self, kernel):
        super().__init__(kernel)
        self.fail_connect = False
        self.fail_disconnect = False

    def connect(self, vif, plug):
        current() and current().alive()
        self._target.connect(vif, plug)
        if self.fail_connect:
            self.fail_connect = False
            raise errors.BindingFailed('injected: the kernel refused the plug half-way')

    def disconnect(self, kind, plug):
        current() and current().alive()
        if self.fail_disconnect:
            self.fail_disconnect = False
            raise errors.BindingFailed('injected: the kernel refused the unplug')
        self._target.disconnect(kind, plug)


class _OsProxy:
    """``os`` for the state modules: durable calls counted, descriptors tracked per worker."""

    def __getattr__(self, name):
        return getattr(real_os, name)

    @staticmethod
    def open(path, flags, mode=0o777, *, dir_fd=None):
        worker = current()
        if worker is None:
            return real_os.open(path, flags, mode, dir_fd=dir_fd)
        if flags & _WRITE_FLAGS:
            worker.before_durable_call()
        worker.alive()
        fd = real_os.open(path, flags, mode, dir_fd=dir_fd)
        worker.fds[fd] = path
        if flags & _WRITE_FLAGS:
            worker.counted('open', path)
        return fd

    @staticmethod
    def fdopen(fd, *args, **kwargs):
        worker = current()
        if worker is not None:
            worker.fds.pop(fd, None)     # the file object closes it
        return real_os.fdopen(fd, *args, **kwargs)

    @staticmethod
    def close(fd):
        worker = current()
        if worker is None:
            return real_os.close(fd)
        if fd in worker.fds:
            worker.fds.pop(fd)
            return real_os.close(fd)
        if worker.dead:
            return None     # closed when it died
        return real_os.close(fd)

    @staticmethod
    def write(fd, data):
        return _on_fd('write', fd, real_os.write, fd, data)

    @staticmethod
    def fsync(fd):
        return _on_fd('fsync', fd, real_os.fsync, fd)

    @staticmethod
    def rename(src, dst, **kwargs):
        return _on_path('rename', dst, real_os.rename, src, dst, **kwargs)

    @staticmethod
    def replace(src, dst, **kwargs):
        return _on_path('replace', dst, real_os.replace, src, dst, **kwargs)

    @staticmethod
    def unlink(path, **kwargs):
        return _on_path('unlink', path, real_os.unlink, path, **kwargs)

    remove = unlink


class _FcntlProxy:
    def __getattr__(self, name):
        return getattr(real_fcntl, name)

    @staticmethod
    def flock(fd, operation):
        return _on_fd('flock', fd, real_fcntl.flock, fd, operation)


def _on_fd(name, fd, fn, *args):
    worker = current()
    if worker is None:
        return fn(*args)
    worker.before_durable_call()
    result = fn(*args)
    worker.counted(name, worker.fds.get(fd, '?'))
    return result


def _on_path(name, path, fn, *args, **kwargs):
    worker = current()
    if worker is None:
        return fn(*args, **kwargs)
    worker.before_durable_call()
    result = fn(*args, **kwargs)
    worker.counted(name, path)
    return result


class _Clock:
    """``time`` for :mod:`kuryr_cni.ownership`: a worker's monotonic clock may be moved on."""

    def __getattr__(self, name):
        return getattr(real_time, name)

    @staticmethod
    def monotonic():
        worker = current()
        return real_time.monotonic() + (worker.clock_offset if worker is not None else 0.0)


@contextlib.contextmanager
def watch_filesystem():
    """Count and crash the durable calls of the state modules, and give workers their clock."""
    saved = (state.os, podlock.os, podlock.fcntl, ownership_mod.time)
    state.os = podlock.os = _OsProxy()
    podlock.fcntl = _FcntlProxy()
    ownership_mod.time = _Clock()
    try:
        yield
    finally:
        state.os, podlock.os, podlock.fcntl, ownership_mod.time = saved
