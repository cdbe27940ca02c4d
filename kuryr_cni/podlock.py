"""Per-pod serialisation that survives a worker being killed.

Each pod has a lock file; holders take an ``fcntl.flock`` on it. The kernel
drops a flock when its holder dies, so a worker SIGKILLed mid-request cannot
wedge its pod (a Manager lock would stay held forever). Lock files are removed
when a pod's binding is cleared; because a waiter may already hold an open
descriptor of a file being removed, every acquirer re-checks after locking that
its descriptor is still the file at the path, and retries when it is not.
"""

import contextlib
import errno
import fcntl
import os
import threading
import time

from kuryr_cni import errors
from kuryr_cni import state

_POLL_FIRST = 0.001
_POLL_MAX = 0.02


class PodLocks:
    def __init__(self, directory):
        self.directory = directory
        # Only a wait for the lock, never a sleep as synchronisation: flock has no
        # timeout of its own, so a bounded wait polls LOCK_NB with backoff.
        self._never = threading.Event()

    def path(self, pod_key):
        return os.path.join(self.directory, state.file_stem(pod_key) + '.lock')

    @contextlib.contextmanager
    def hold(self, pod_key, deadline):
        """Hold ``pod_key``'s lock until the block ends.

        Yields a callable asking for the lock file to be removed (when the
        pod's binding is gone); the removal happens at release, still under
        the lock, so no new holder can start while this one works. Raises
        TryAgainLater when ``deadline`` (a ``time.monotonic()`` value) passes
        first.
        """
        path = self.path(pod_key)
        fd = self._acquire(path, deadline)
        removal = []
        try:
            yield lambda: removal.append(True)
        finally:
            try:
                if removal:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
            finally:
                os.close(fd)   # closing drops the flock

    def _acquire(self, path, deadline):
        delay = _POLL_FIRST
        while True:
            with state.disk_errors(self.directory, 'open the pod lock %s' % path):
                # Never through a link: nobody but root writes here, and a lock
                # file is made with O_CREAT, which would make the link's target.
                fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW,
                             0o600)
            try:
                if self._try_lock(fd) and self._still_linked(fd, path):
                    return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise errors.TryAgainLater('timed out waiting for the pod lock %s' % path)
            self._never.wait(min(delay, remaining))
            delay = min(delay * 2, _POLL_MAX)

    @staticmethod
    def _try_lock(fd):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise

    @staticmethod
    def _still_linked(fd, path):
        try:
            return os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def remove_unused(self, has_binding):
        """Remove the lock files that nobody holds of pods without a binding; returns how
        many went.

        A worker killed after making a pod's lock file and before writing its
        first record, or a GC killed in its hold of a pod without binding,
        leaves the file, and no request would remove it: a DEL without the
        pod's name finds no binding and takes no lock. ``has_binding(stem)``
        is asked under the lock; a held lock is skipped, never waited for. An
        acquirer whose descriptor was opened before the removal finds it
        unlinked after locking and retries with a new file.
        """
        removed = 0
        for name in self.held_files():
            stem = name[:-len('.lock')]
            if not state.is_stem(stem) or has_binding(stem):
                continue        # asked again under the lock: a pod's first ADD may be writing
            path = os.path.join(self.directory, name)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError:
                continue        # removed meanwhile, or not a lock file of ours
            try:
                if self._try_lock(fd) and self._still_linked(fd, path) \
                        and not has_binding(stem):
                    os.unlink(path)
                    removed += 1
            except OSError:
                continue        # tried again at the next round
            finally:
                os.close(fd)
        return removed

    def held_files(self):
        """Names of the lock files present (for tests and leak checks)."""
        try:
            return sorted(n for n in os.listdir(self.directory) if n.endswith('.lock'))
        except FileNotFoundError:
            return []
