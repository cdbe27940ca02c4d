"""Durable state under ``[cni_daemon] state_dir``: pod bindings and the DEL queue.

Layout::

    bindings/<digest>.json             one pod binding (kuryr_cni.records)
    locks/<digest>.lock                per-pod flock files (kuryr_cni.podlock)
    del-queue/<time_ns>-<pid>.json     DELs the shim could not deliver

``<digest>`` is a fixed-length digest of the pod key (:func:`file_stem`): a
pod key of the longest legal names (316 characters) would not fit a file
name. The key itself is kept inside the record, and a record whose key does
not hash to its file's name is refused.

Every write is atomic: a temporary file ``.<name>.<pid>.tmp`` in the same
directory, fsync, rename, fsync of the directory, and the temporary file is
removed when any step fails. Readers therefore see the old or the new binding,
never half of one. One write skips the two fsyncs (``durable=False``): the
record that an ADD completed, whose durable predecessor already names every
device (see :meth:`kuryr_cni.ownership.Ownership._plug`); a restarted daemon
reads it all the same, and only a power loss, which takes the pod's devices
too, could bring back the predecessor.

A temporary file that a killed writer left is removed at start-up, whoever
wrote it (:meth:`BindingStore.remove_temporaries`; pids are reused, so a pid
says nothing after a restart), and while running as soon as its writer has
died, or once it is a minute old whatever its pid; the shims' temporary files
in the DEL queue are removed at a minute old, since a shim may be writing one
while the daemon starts, from another pid namespace.

Only root may write here (issue 20): the state dir and each of its
directories must belong to root (or the daemon's euid) and be writable by
no group or other (:func:`unsafe_dir`); the daemon refuses to start
otherwise, and refuses to read a directory that became so meanwhile. Every
entry is opened without following a symbolic link and must be a regular
file of root's that no group or other may write; any other is set aside, so
a DEL planted by someone else is never replayed as root.

A file that is not a valid record (not JSON, not the declared shape, another
pod's record, a directory, not root's) is moved aside to ``<name>.corrupt-<time_ns>``,
logged and counted, never fatal. A record of a format newer than this
release reads is left untouched and refused (:class:`errors.UnreadableState`).
A disk that refuses a read or write (full, read-only, failing) makes the
request fail with CNI code 11, naming the state dir and the error
(:class:`errors.StateFailure`).
"""

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
import time

from oslo_log import log as logging

from kuryr_cni import errors
from kuryr_cni import metrics
from kuryr_cni import records
from kuryr_cni.cni import request as cni_request

LOG = logging.getLogger(__name__)

TEMPORARY_AGE = 60       # seconds after which a temporary file is surely not being written
_STEM = re.compile(r'^[0-9a-f]{32}\Z')
_QUEUE_ENTRY = re.compile(r'^[0-9]{1,20}-[0-9]{1,10}\.json\Z')


def is_stem(name):
    """Whether ``name`` has the form of a :func:`file_stem`."""
    return bool(_STEM.match(name))


def file_stem(pod_key):
    """The fixed-length name under which a pod's files are kept."""
    return hashlib.blake2b(pod_key.encode(), digest_size=16).hexdigest()


def write_atomically(directory, name, data, durable=True):
    """Write ``data`` (bytes) to ``directory/name`` atomically, and with ``durable``
    on disk before returning; raise OSError."""
    tmp = os.path.join(directory, '.%s.%d.tmp' % (name, os.getpid()))
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, os.path.join(directory, name))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(directory)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def fsync_dir(directory):
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_dir(path, mode=0o700):
    os.makedirs(path, mode=mode, exist_ok=True)
    return path


def private_dirs(state_dir):
    """The state dir and its directories, each of which only root may write."""
    return [state_dir] + [os.path.join(state_dir, sub) for sub in ('bindings', 'locks',
                                                                   DEL_QUEUE)]


def unsafe_dir(path):
    """Why the directory ``path`` cannot be trusted with root's state, or None.

    It must be a directory of root's (or of the daemon's euid) that no group
    or other may write: anyone who can write it can plant files there.
    """
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        return '%s is not a directory' % path
    if st.st_uid not in _trusted_uids():
        return '%s belongs to uid %d, not to root or the daemon\'s uid %d' % (
            path, st.st_uid, os.geteuid())
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return '%s is writable by group or others (mode %o)' % (path, stat.S_IMODE(st.st_mode))
    return None


def _trusted_uids():
    return {0, os.geteuid()}


class Untrusted(Exception):
    """A state entry someone else may have written: set aside, never read."""


def read_trusted(path, limit=None, nonblocking=False):
    """The content of the state entry ``path``, read without following a link.

    Raises :class:`Untrusted` unless it is a regular file of root's that no
    group or other may write (and, with ``limit``, of at most that many
    bytes); OSError as ``open`` does. ``nonblocking`` keeps a FIFO planted
    in its place from blocking the reader.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_NONBLOCK if nonblocking else 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Untrusted('it is a symbolic link') from None
        raise
    with os.fdopen(fd, 'rb') as f:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, 'is a directory', path)
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted('it is not a regular file')
        if st.st_uid not in _trusted_uids():
            raise Untrusted('it belongs to uid %d, not to root' % st.st_uid)
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise Untrusted('it is writable by group or others (mode %o)'
                            % stat.S_IMODE(st.st_mode))
        data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise Untrusted('it is larger than %d bytes' % limit)
    return data


def refuse_unsafe_dir(directory):
    """Raise :class:`errors.StateFailure` (code 11) when ``directory`` is :func:`unsafe_dir`."""
    with disk_errors(directory, 'check it'):
        problem = unsafe_dir(directory)
    if problem is not None:
        raise errors.StateFailure('state dir %s: refusing to read it' % directory, problem)


@contextlib.contextmanager
def disk_errors(directory, action):
    """Turn an OSError of the state dir into :class:`errors.StateFailure` (code 11)."""
    try:
        yield
    except OSError as exc:
        raise errors.StateFailure(
            'state dir %s: cannot %s' % (directory, action),
            'error %s (%s)' % (exc.errno, exc.strerror or os.strerror(exc.errno or 0))) from exc


class BindingStore:
    """One JSON file per pod binding. Callers hold the pod's lock."""

    def __init__(self, state_dir):
        self.directory = ensure_dir(os.path.join(state_dir, 'bindings'))

    def path(self, pod_key):
        return os.path.join(self.directory, file_stem(pod_key) + '.json')

    def load(self, pod_key):
        """The pod's :class:`records.Binding`, or None when it has none (or it was bad)."""
        name = file_stem(pod_key) + '.json'
        binding = self._read(name)
        if binding is not None and binding.pod != pod_key:
            self._set_aside(name, 'it holds the record of pod %s' % binding.pod)
            return None
        return binding

    def save(self, binding, durable=True):
        data = json.dumps(binding.to_dict(), separators=(',', ':')).encode()
        name = file_stem(binding.pod) + '.json'
        with disk_errors(self.directory, 'write the binding of pod %s' % binding.pod):
            write_atomically(self.directory, name, data, durable)

    def has_stem(self, stem):
        """Whether a binding file of the pod whose :func:`file_stem` is ``stem`` exists."""
        return os.path.exists(os.path.join(self.directory, stem + '.json'))

    def remove(self, pod_key):
        with disk_errors(self.directory, 'remove the binding of pod %s' % pod_key), \
                contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(pod_key))
            fsync_dir(self.directory)

    def load_all(self):
        """Every valid binding, keyed by pod key; bad files are set aside on the way."""
        bindings = {}
        for name in self._names():
            try:
                binding = self._read(name)
            except errors.UnreadableState as exc:
                LOG.error('%s (%s); leaving it untouched', exc.msg, exc.details)
                continue
            if binding is None:
                continue
            if file_stem(binding.pod) + '.json' != name:
                self._set_aside(name, 'its name is not that of pod %s' % binding.pod)
                continue
            bindings[binding.pod] = binding
        return bindings

    def _names(self):
        with disk_errors(self.directory, 'list the bindings'):
            names = sorted(os.listdir(self.directory))
        return [n for n in names if n.endswith('.json') and _STEM.match(n[:-len('.json')])]

    def _read(self, name):
        """Parse and validate one binding file; None when missing, refused or set aside."""
        path = os.path.join(self.directory, name)
        refuse_unsafe_dir(self.directory)
        with disk_errors(self.directory, 'read %s' % name):
            try:
                data = read_trusted(path)
            except FileNotFoundError:
                return None
            except IsADirectoryError:
                self._set_aside(name, 'it is a directory')
                return None
            except Untrusted as exc:
                self._set_aside(name, exc)
                return None
        try:
            return records.Binding.from_dict(json.loads(data))
        except records.FutureFormat as exc:
            raise errors.UnreadableState('binding file %s was written by a newer kuryr-cni'
                                         % path, str(exc)) from None
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            self._set_aside(name, exc)
            return None

    def _set_aside(self, name, why):
        set_aside(os.path.join(self.directory, name), why, 'binding')

    def remove_temporaries(self, while_running=False):
        """Remove temporary files of writes that never finished.

        At start-up, when no daemon process writes, every one; while running,
        those whose writer no longer runs, and any a minute old whatever its
        pid says (pids are reused).
        """
        return remove_temporaries(self.directory, _written_now if while_running else None)

    def migrate_legacy_names(self, lock_dir):
        """Rename bindings of kuryr-cni 0.1.0 (``<namespace>_<name>.json``) to digests.

        Run at start-up, before any request: its lock files (``*_*.lock``),
        which no process holds then, are removed. A legacy file whose content
        names another pod than its name is set aside. A legacy file beside
        the pod's digest-named one is the newer of the two: no release since
        0.1.0 writes legacy names, so a 0.1.0 daemon wrote it after this one
        had migrated the pod (a downgrade and back); the digest-named file is
        set aside for it. Returns the count moved.
        """
        moved = 0
        with disk_errors(self.directory, 'list the bindings'):
            names = sorted(os.listdir(self.directory))
        for name in names:
            if not name.endswith('.json') or name.startswith('.') \
                    or _STEM.match(name[:-len('.json')]):
                continue
            try:
                binding = records.Binding.from_dict(json.loads(
                    read_trusted(os.path.join(self.directory, name))))
            except records.FutureFormat:
                continue      # not ours to judge: a newer release wrote it
            except (OSError, Untrusted, ValueError, UnicodeDecodeError, RecursionError) as exc:
                self._set_aside(name, exc)
                continue
            if binding.pod.replace('/', '_', 1) + '.json' != name:
                self._set_aside(name, 'it holds the record of pod %s' % binding.pod)
                continue
            if os.path.exists(self.path(binding.pod)):
                self._set_aside(os.path.basename(self.path(binding.pod)),
                                'kuryr-cni 0.1.0 (a downgrade) wrote a newer binding of pod %s, '
                                'as %s' % (binding.pod, name))
            self.save(binding)
            with disk_errors(self.directory, 'remove %s' % name):
                os.unlink(os.path.join(self.directory, name))
            LOG.info('Moved the binding of pod %s from %s to %s', binding.pod, name,
                     os.path.basename(self.path(binding.pod)))
            moved += 1
        _remove_legacy_locks(lock_dir)
        return moved


DEL_QUEUE = 'del-queue'     # under the state dir; the shim writes its entries there


def queued_del_count(state_dir, queue_fd=None):
    """How many complete entries wait in the DEL queue of ``state_dir``; reads only.

    ``queue_fd``, a descriptor of the queue directory opened earlier, is listed
    instead: by a process that may no longer open the root-only directory.
    """
    try:
        names = os.listdir(os.path.join(state_dir, DEL_QUEUE) if queue_fd is None else queue_fd)
    except FileNotFoundError:
        return 0
    return sum(1 for name in names if _QUEUE_ENTRY.match(name))


class DelQueue:
    """DELs the shim queued while the daemon was unreachable (DESIGN §4.2)."""

    def __init__(self, state_dir):
        self.directory = ensure_dir(os.path.join(state_dir, DEL_QUEUE))
        self._refusal = None        # why the directory is refused, as last logged

    def entries(self, due=None):
        """Yield ``(path, body)`` for complete entries, oldest first.

        None while the directory is :func:`unsafe_dir` (logged once); an entry
        that is not root's is set aside unread. ``due(name)``: whether to read
        an entry now (one waiting for its next retry is skipped unread).
        """
        problem = unsafe_dir(self.directory)
        if problem != self._refusal:
            if problem is not None:
                LOG.error('Refusing to replay the DEL queue while %s', problem)
            self._refusal = problem
        if problem is not None:
            return
        for name in sorted(os.listdir(self.directory)):
            if not _QUEUE_ENTRY.match(name) or (due is not None and not due(name)):
                continue
            path = os.path.join(self.directory, name)
            try:
                body = json.loads(read_trusted(path, limit=cni_request.MAX_BODY_BYTES,
                                               nonblocking=True))
                if not isinstance(body, dict):
                    raise ValueError('not a JSON object')
            except FileNotFoundError:
                continue
            except (OSError, Untrusted, ValueError) as exc:
                self.set_aside(path, exc)
                continue
            yield path, body

    def names(self):
        """The names of the complete entries, oldest first."""
        return sorted(n for n in os.listdir(self.directory) if _QUEUE_ENTRY.match(n))

    @staticmethod
    def done(path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    @staticmethod
    def set_aside(path, why):
        set_aside(path, why, 'del_queue')

    def remove_temporaries(self):
        """Remove the temporary files of shims that died while queueing a DEL.

        Only once a minute old: a shim may be writing one right now, from
        another pid namespace, so its pid tells nothing.
        """
        return remove_temporaries(self.directory, lambda name, age: age < TEMPORARY_AGE)


def remove_temporaries(directory, keep=None):
    """Remove ``.*.tmp`` files of ``directory`` but those ``keep(name, age)`` keeps.

    Returns how many were removed.
    """
    removed = 0
    now = time.time()
    for name in os.listdir(directory):
        if not (name.startswith('.') and name.endswith('.tmp')):
            continue
        path = os.path.join(directory, name)
        with contextlib.suppress(FileNotFoundError):
            if keep is not None and keep(name, now - os.lstat(path).st_mtime):
                continue
            os.unlink(path)
            LOG.info('Removed %s, left by a write that never finished', path)
            removed += 1
    return removed


def _written_now(name, age):
    """Whether a daemon process may still be writing temporary file ``name``."""
    pid = name[:-len('.tmp')].rpartition('.')[2]
    return age < TEMPORARY_AGE and pid.isdigit() and _running(int(pid))


def _running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True         # someone else's process, or no pid at all: not ours to judge
    return True


def set_aside(path, why, kind):
    """Move a bad state file out of the way, log why and count it; never raises."""
    aside = '%s.corrupt-%d' % (path, time.time_ns())
    LOG.error('Setting aside %s as %s: %s', path, os.path.basename(aside), why)
    metrics.state_file_set_aside(kind)
    try:
        os.rename(path, aside)
    except OSError as exc:
        LOG.error('Could not set %s aside: %s', path, exc)


def _remove_legacy_locks(lock_dir):
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(lock_dir):
            if name.endswith('.lock') and not _STEM.match(name[:-len('.lock')]):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(lock_dir, name))
