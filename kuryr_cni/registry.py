"""The registry shared by every daemon process, served by a multiprocessing.Manager.

It holds four small tables:

* ``pods``: what the watcher sees, ``"ns/name" -> {uid, vifs, error, deleting}``;
* ``bindings``: a mirror of the persisted pod bindings (the files under
  ``state_dir`` are authoritative; the mirror serves look-ups by container ID,
  metrics and the operator CLI);
* ``status``: daemon health facts (watcher synced, worker pids, ...);
* ``stale_dels``: the last rejected stale DELs, for ``kuryr-cni-ctl``.

Each table is an object living in the Manager process whose methods run there
under a plain ``threading.Lock`` held only for the duration of one call, so every
update is one atomic RPC and a client killed mid-call cannot leave a lock held
(which is why there is no Manager Lock/Condition anywhere in this daemon).
"""

import collections
import ctypes
import multiprocessing
import multiprocessing.managers
import os
import signal
import threading

import setproctitle

PR_SET_PDEATHSIG = 1


class _Table:
    def __init__(self):
        self._lock = threading.Lock()
        self._rows = {}

    def get(self, key):
        with self._lock:
            return self._rows.get(key)

    def put(self, key, value):
        with self._lock:
            self._rows[key] = value

    def drop(self, key):
        with self._lock:
            self._rows.pop(key, None)

    def replace(self, rows):
        with self._lock:
            self._rows = dict(rows)

    def snapshot(self):
        with self._lock:
            return dict(self._rows)

    def size(self):
        with self._lock:
            return len(self._rows)


class PodTable(_Table):
    """Pods of this node as the watcher last saw them."""


class StatusTable(_Table):
    """Daemon health facts; also tells which process serves the registry."""

    def server_pid(self):
        """The pid of the Manager process (this method runs in it)."""
        return os.getpid()


class BindingTable(_Table):
    """Mirror of the persisted bindings, with an index by container ID."""

    def __init__(self):
        super().__init__()
        self._by_container = {}

    def put(self, key, value):
        with self._lock:
            self._put(key, value)

    def drop(self, key):
        with self._lock:
            self._unindex(key)
            self._rows.pop(key, None)

    def replace(self, rows):
        with self._lock:    # one atomic update: no reader sees a half-filled table
            self._rows, self._by_container = {}, {}
            for key, value in rows.items():
                self._put(key, value)

    def _put(self, key, value):
        self._unindex(key)
        self._rows[key] = value
        for container_id in value.get('sandboxes', {}):
            self._by_container[container_id] = key

    def find_container(self, container_id):
        with self._lock:
            return self._by_container.get(container_id)

    def count_attachments(self):
        with self._lock:
            return sum(len(sandbox.get('attachments', {}))
                       for binding in self._rows.values()
                       for sandbox in binding.get('sandboxes', {}).values())

    def _unindex(self, key):
        old = self._rows.get(key)
        for container_id in (old or {}).get('sandboxes', {}):
            if self._by_container.get(container_id) == key:
                del self._by_container[container_id]


class StaleDelLog:
    """The last rejected stale DELs, newest last, for operators (bounded)."""

    def __init__(self, size=100):
        self._entries = collections.deque(maxlen=size)
        self._lock = threading.Lock()

    def record(self, entry):
        with self._lock:
            self._entries.append(entry)

    def recent(self):
        with self._lock:
            return list(self._entries)


class _RegistryManager(multiprocessing.managers.BaseManager):
    pass


_RegistryManager.register('PodTable', PodTable)
_RegistryManager.register('BindingTable', BindingTable)
_RegistryManager.register('StatusTable', StatusTable)
_RegistryManager.register('StaleDelLog', StaleDelLog)


def _init_manager_process(title, parent_pid):
    # cotyledon's SIGINT fast exit and any crash of the parent would otherwise
    # orphan this process (it ignores SIGINT): the kernel ends it when the
    # parent goes. The signal is tied to the forking thread, which is the
    # parent's main thread (Registry.start is called before any other thread);
    # a parent that died before prctl took effect is caught by the ppid check.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if os.getppid() != parent_pid:
        os._exit(1)
    setproctitle.setproctitle(title)


class Registry:
    """Proxies to the tables; picklable, and usable after fork."""

    def __init__(self, pods, bindings, status, stale_dels):
        self.pods = pods
        self.bindings = bindings
        self.status = status
        self.stale_dels = stale_dels

    @classmethod
    def start(cls, title='kuryr-cni-daemon: registry', address=None):
        """Start the Manager process; returns ``(manager, registry)``.

        Call it before cotyledon's ServiceManager exists and with the fork
        start method, so the Manager inherits default signal handlers.
        ``address`` is the path of the Manager's unix socket; None lets
        multiprocessing make one in a ``pymp-*`` directory under TMPDIR,
        which a Manager ended by a signal leaves behind.
        """
        manager = _RegistryManager(address=address, ctx=multiprocessing.get_context('fork'))
        manager.start(_init_manager_process, (title, os.getpid()))
        return manager, cls(manager.PodTable(), manager.BindingTable(), manager.StatusTable(),
                            manager.StaleDelLog())

    # The watcher's sink (kuryr_cni.watcher) --------------------------------

    def replace_pods(self, records):
        self.pods.replace(records)

    def put_pod(self, key, record):
        self.pods.put(key, record)

    def drop_pod(self, key):
        self.pods.drop(key)

    def mark_synced(self, synced):
        self.status.put('watcher_synced', bool(synced))

    def is_synced(self):
        return bool(self.status.get('watcher_synced'))
