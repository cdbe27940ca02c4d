"""Durable state under ``[cni_daemon] state_dir``: pod bindings and the DEL queue.

Layout::

    bindings/<namespace>_<name>.json   one pod binding (see kuryr_cni.ownership)
    locks/<namespace>_<name>.lock      per-pod flock files (kuryr_cni.podlock)
    del-queue/<time_ns>-<pid>.json     DELs the shim could not deliver

Every write is atomic: a temporary file in the same directory, fsync, rename,
fsync of the directory. Readers therefore see the old or the new binding, never
half of one. A file that does not parse is moved aside to ``*.corrupt`` and
logged, never fatal. Temporary files are named ``.<...>.<writer pid>.tmp``
(``.<time_ns>-<shim pid>.tmp`` in the DEL queue): one whose writer no longer
runs is what a killed writer left, and readers remove it; one of a live writer
is never touched, so a reader cannot break a write in progress. Shims may run
in another pid namespace than the daemon, so a queue file must also be a
minute old before its writer's pid is believed.
"""

import contextlib
import json
import os
import time

from oslo_log import log as logging

LOG = logging.getLogger(__name__)

SHIM_WRITE_AGE = 60      # seconds after which a queue temporary file is surely not being written


def write_atomically(directory, name, data):
    """Write ``data`` (bytes) to ``directory/name`` atomically and durably."""
    tmp = os.path.join(directory, '.%s.%d.tmp' % (name, os.getpid()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, os.path.join(directory, name))
    fsync_dir(directory)


def fsync_dir(directory):
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_dir(path, mode=0o700):
    os.makedirs(path, mode=mode, exist_ok=True)
    return path


class BindingStore:
    """One JSON file per pod binding. Callers hold the pod's lock."""

    def __init__(self, state_dir):
        self.directory = ensure_dir(os.path.join(state_dir, 'bindings'))

    def _name(self, pod_key):
        return pod_key.replace('/', '_') + '.json'

    def load(self, pod_key):
        path = os.path.join(self.directory, self._name(pod_key))
        try:
            with open(path, 'rb') as f:
                binding = json.loads(f.read())
            if not isinstance(binding, dict):
                raise ValueError('not a JSON object')
            return binding
        except FileNotFoundError:
            return None
        except ValueError:
            _set_aside(path)
            return None

    def save(self, pod_key, binding):
        write_atomically(self.directory, self._name(pod_key),
                         json.dumps(binding, separators=(',', ':')).encode())

    def remove(self, pod_key):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.directory, self._name(pod_key)))
            fsync_dir(self.directory)

    def load_all(self):
        """Every readable binding, keyed by pod key (used at start-up)."""
        bindings = {}
        for name in sorted(os.listdir(self.directory)):
            if _dead_write(self.directory, name):
                continue
            if not name.endswith('.json') or name.startswith('.'):
                continue
            binding = self.load(name[:-len('.json')].replace('_', '/', 1))
            if binding is not None:
                bindings[binding['pod']] = binding
        return bindings

    def files(self):
        return sorted(n for n in os.listdir(self.directory) if n.endswith('.json'))


DEL_QUEUE = 'del-queue'     # under the state dir; the shim writes its entries there


def queued_del_count(state_dir):
    """How many complete entries wait in the DEL queue of ``state_dir``; reads only."""
    try:
        names = os.listdir(os.path.join(state_dir, DEL_QUEUE))
    except FileNotFoundError:
        return 0
    return sum(1 for name in names if name.endswith('.json') and not name.startswith('.'))


class DelQueue:
    """DELs the shim queued while the daemon was unreachable (DESIGN §4.2)."""

    def __init__(self, state_dir):
        self.directory = ensure_dir(os.path.join(state_dir, DEL_QUEUE))

    def entries(self):
        """Yield ``(path, body)`` for complete entries, oldest first."""
        for name in sorted(os.listdir(self.directory)):
            if _dead_write(self.directory, name, min_age=SHIM_WRITE_AGE):
                continue
            if not name.endswith('.json') or name.startswith('.'):
                continue
            path = os.path.join(self.directory, name)
            try:
                with open(path, 'rb') as f:
                    body = json.loads(f.read())
                if not isinstance(body, dict):
                    raise ValueError('not a JSON object')
            except (OSError, ValueError) as exc:
                LOG.warning('Setting aside unreadable queued DEL %s: %s', path, exc)
                _set_aside(path)
                continue
            yield path, body

    @staticmethod
    def done(path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def set_aside(self, path):
        _set_aside(path)


def _dead_write(directory, name, min_age=0):
    """Remove ``name`` if it is the temporary file of a writer that died; say so."""
    if not (name.startswith('.') and name.endswith('.tmp')):
        return False
    pid = name[:-len('.tmp')].replace('-', '.').rpartition('.')[2]
    if not pid.isdigit() or _running(int(pid)):
        return False
    path = os.path.join(directory, name)
    try:
        if time.time() - os.stat(path).st_mtime < min_age:
            return False
    except FileNotFoundError:
        return True
    LOG.info('Removing %s, the partial write of a process that died', path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return True


def _running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True         # someone else's process, or no pid at all: leave the file
    return True


def _set_aside(path):
    LOG.error('Moving corrupt state file %s aside to %s.corrupt', path, path)
    with contextlib.suppress(OSError):
        os.rename(path, path + '.corrupt')
