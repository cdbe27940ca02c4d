"""The registry shared by every daemon process, served by a multiprocessing.Manager.

It holds four small tables:

* ``pods``: what the watcher sees, ``"ns/name" -> {uid, vifs, error, deleting}``;
* ``bindings``: a summary of each persisted pod binding (the files under
  ``state_dir`` are authoritative and whole; the summaries serve look-ups by
  container ID and by address, and counts), and the ADDs in flight (when
  each started, which came last for each pod, the addresses each reserved);
* ``status``: daemon health facts (:class:`StatusTable`: processes and their
  heartbeats, watcher sync, ...);
* ``stale_dels``: the last rejected stale DELs, for ``kuryr-cni-ctl``;

and :class:`Changes`, which tells waiters that a pod's rows changed.

Each table is an object living in the Manager process whose methods run there
under a plain ``threading.Lock`` held only for the duration of one call, so every
update is one atomic RPC and a client killed mid-call cannot leave a lock held
(which is why there is no Manager Lock/Condition anywhere in this daemon).
"""

import collections
import ctypes
import dataclasses
import io
import multiprocessing
import multiprocessing.connection
import multiprocessing.managers
import multiprocessing.reduction
import os
import pickle
import signal
import threading
import time
import typing
import zlib

import setproctitle

PR_SET_PDEATHSIG = 1


# An ADD lasts at most its request deadline (under the shim's 110 s): past this,
# which ADD of a pod came last no longer matters, and the entry may go.
NEWEST_ADD_TTL = 600
NEWEST_ADD_PRUNE_AT = 1024
CHANGE_SLOTS = 4096
CHANGE_POLL = 0.005     # seconds between looks at a counter

_changes = None         # in the Manager process: the Changes its tables bump
_pods = None            # in the Manager process: its one PodTable, which the BindingTable reads


class Changes:
    """Which pods' rows changed, for waiters in every daemon process, without a Manager call.

    One counter per slot (a pod's slot: a CRC of its key) in shared memory
    mapped before the Manager and the daemon's processes fork. Only the Manager
    bumps them, after a write to the pods or bindings table and under a lock of
    its own, so no bump is lost. A waiter notes its pod's counter, reads the
    registry, and then waits until the counter moves: one thread of its process
    (:class:`_Lookout`) looks at the counters its process waits on every
    :data:`CHANGE_POLL` seconds (a read of shared memory) and wakes the waiters
    whose counter moved. A change is seen within milliseconds, and the registry
    is read again only then. Pods sharing a slot cost a spurious read, never a
    missed change.
    """

    def __init__(self, slots=CHANGE_SLOTS):
        self._counters = multiprocessing.RawArray(ctypes.c_uint32, slots)
        self._lock = threading.Lock()
        self._lookout = None        # this process's, made at its first wait
        self._lookout_lock = threading.Lock()

    def _slot(self, key):
        return zlib.crc32(key.encode()) % len(self._counters)

    def version(self, key):
        """``key``'s counter: note it before reading the registry, then :meth:`wait`."""
        return self._counters[self._slot(key)]

    def wait(self, key, seen, timeout, wake=None):
        """Until ``key``'s counter is not ``seen`` (True) or ``timeout`` seconds pass (False).

        ``wake``, a ``threading.Event`` of the caller's own, is what the wait
        waits on: it ends the wait when anyone sets it (a signal of the
        caller's process, such as an OVSDB row), and it is set when the
        counter moves. The caller clears it before it reads the registry.
        """
        slot = self._slot(key)
        if self._counters[slot] != seen:
            return True
        with self._lookout_lock:
            if self._lookout is None or self._lookout.pid != os.getpid():   # forked since
                self._lookout = _Lookout(self._counters)
            lookout = self._lookout
        if wake is None:
            return lookout.wait(slot, seen, timeout)
        return lookout.wait_or_wake(slot, seen, timeout, wake)

    def bump(self, keys=None):
        """Move the counters of ``keys`` (None: all); the Manager's tables call it."""
        slots = range(len(self._counters)) if keys is None else {self._slot(k) for k in keys}
        with self._lock:
            for slot in slots:
                self._counters[slot] = (self._counters[slot] + 1) & 0xFFFFFFFF


class _Lookout:
    """The thread of one process that looks at the counters its threads wait on.

    Thirty ADDs waiting for their VIFs, each looking at its own counter every
    :data:`CHANGE_POLL` seconds, were six thousand wake-ups a second competing
    for the interpreter lock and for the CPU of a node busy starting pods; one
    thread per process looks at all of them, and only while some thread waits.
    """

    def __init__(self, counters):
        self.pid = os.getpid()
        self._counters = counters
        self._lock = threading.Lock()
        self._waits = {}                    # (slot, counter seen) -> [Event, waiters]
        self._wakes = {}                    # a waiter's own Event -> (slot, counter seen)
        self._waiting = threading.Event()   # set while _waits is not empty
        threading.Thread(target=self._run, name='kuryr-cni-changes', daemon=True).start()

    def wait(self, slot, seen, timeout):
        key = (slot, seen)
        with self._lock:
            entry = self._waits.setdefault(key, [threading.Event(), 0])
            entry[1] += 1
            self._waiting.set()
        try:
            # Looked at once registered: a move before this is seen here, a later one
            # by the thread, which compares each wait's own counter, not a snapshot.
            return self._counters[slot] != seen or entry[0].wait(timeout)
        finally:
            with self._lock:
                entry[1] -= 1
                if not entry[1]:
                    del self._waits[key]
                    if not self._waits and not self._wakes:
                        self._waiting.clear()

    def wait_or_wake(self, slot, seen, timeout, wake):
        """As :meth:`wait`, on the waiter's own ``wake`` (which others may set too)."""
        with self._lock:
            self._wakes[wake] = (slot, seen)
            self._waiting.set()
        try:
            return self._counters[slot] != seen or wake.wait(timeout)
        finally:
            with self._lock:
                del self._wakes[wake]
                if not self._waits and not self._wakes:
                    self._waiting.clear()

    def _run(self):
        while True:
            self._waiting.wait()
            time.sleep(CHANGE_POLL)
            with self._lock:
                moved = [event for (slot, seen), (event, _) in self._waits.items()
                         if self._counters[slot] != seen]
                moved += [wake for wake, (slot, seen) in self._wakes.items()
                          if self._counters[slot] != seen]
            for event in moved:
                event.set()


def _changed(keys=None):
    if _changes is not None:    # None: a table used outside a Manager (unit tests)
        _changes.bump(keys)


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

    def put(self, key, value):
        super().put(key, value)
        _changed([key])

    def drop(self, key):
        super().drop(key)
        _changed([key])

    def replace(self, rows):
        super().replace(rows)
        _changed()


class ProcessBeat(typing.NamedTuple):
    pid: int | None
    beat: float          # time.monotonic() of its last heartbeat


@dataclasses.dataclass(frozen=True)
class StatusFacts:
    """What :meth:`StatusTable.facts` returns."""

    processes: dict      # (role, worker_id) -> ProcessBeat
    heartbeat_timeout: float | None
    synced: bool
    shutting_down: bool
    watch_activity: float | None    # time.monotonic() of the last list, event or bookmark
    saturated: frozenset = frozenset()   # (role, worker_id) whose connections are at the cap
    api_limits: tuple = ()          # why the API server's answers are being refused, in words
    queued_dels_failing: int = 0    # queued DELs whose replay failed, waiting to be retried
    queued_dels_failing_since: float | None = None   # time.monotonic() of the oldest's failure
    required_bridges: tuple = ()    # bridges that must exist for the daemon to be ready

    def of_role(self, role):
        """``{worker_id: ProcessBeat}`` of the processes of ``role``."""
        return {wid: beat for (r, wid), beat in self.processes.items() if r == role}


class StatusTable:
    """The daemon's health facts, each written and read through a method that says what it is.

    Processes (the watcher, CNI workers, ops) register their pid and beat, CNI
    workers whether their connections are at the cap; the parent records the
    heartbeat timeout, the watcher its sync state and the moment of its last
    watch activity; the parent asks for a mirror resync when a CNI worker
    died. Times are ``time.monotonic()`` readings (one clock for every
    process of the machine, never stepped).
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._processes = {}        # (role, worker_id) -> ProcessBeat
        self._heartbeat_timeout = None
        self._required_bridges = ()
        self._synced = False
        self._shutting_down = False
        self._watch_activity = None
        self._resync_requested = False
        self._saturated = set()     # (role, worker_id)
        self._api_limits = {}       # watched objects (in words) -> the limit exceeded, in words
        self._queued_dels = (0, None, [])   # failing count, oldest failure, listed entries

    def server_pid(self):
        """The pid of the Manager process (this method runs in it)."""
        return os.getpid()

    # Processes and their heartbeats -------------------------------------------

    def process_started(self, role, worker_id, pid, now):
        """A new process of ``role``: it counts as serving until its first beat is due."""
        with self._lock:
            self._processes[(role, worker_id)] = ProcessBeat(pid, now)
            self._saturated.discard((role, worker_id))

    def beat(self, role, worker_id, now):
        with self._lock:
            known = self._processes.get((role, worker_id))
            pid = known.pid if known else None
            self._processes[(role, worker_id)] = ProcessBeat(pid, now)

    def pid_of(self, role, worker_id):
        with self._lock:
            known = self._processes.get((role, worker_id))
            return known.pid if known else None

    def set_saturated(self, role, worker_id, saturated):
        """Whether the process's server has every connection slot taken (or room again)."""
        with self._lock:
            if saturated:
                self._saturated.add((role, worker_id))
            else:
                self._saturated.discard((role, worker_id))

    def set_heartbeat_timeout(self, seconds):
        with self._lock:
            self._heartbeat_timeout = seconds

    def set_required_bridges(self, names):
        """The bridges whose absence makes the daemon not ready ([binding] required_bridges)."""
        with self._lock:
            self._required_bridges = tuple(names)

    # The watcher -----------------------------------------------------------------

    def mark_synced(self, synced):
        with self._lock:
            self._synced = bool(synced)

    def is_synced(self):
        with self._lock:
            return self._synced

    def note_watch_activity(self, now=None):
        """A list, a watch event or a bookmark arrived from the API server."""
        with self._lock:
            self._watch_activity = time.monotonic() if now is None else now

    def note_api_limit(self, what, problem):
        """The API server exceeded a limit of the watch of ``what`` (None: no longer)."""
        with self._lock:
            if problem is None:
                self._api_limits.pop(what, None)
            else:
                self._api_limits[what] = problem

    # Shutdown ----------------------------------------------------------------------

    def mark_shutting_down(self):
        with self._lock:
            self._shutting_down = True

    # Mirror resync -------------------------------------------------------------------

    def request_resync(self):
        with self._lock:
            self._resync_requested = True

    def take_resync_request(self):
        """Whether a resync was asked for since the last call (which clears it)."""
        with self._lock:
            requested, self._resync_requested = self._resync_requested, False
            return requested

    # Queued DELs whose replay fails (kuryr_cni.daemon.recovery.Retries) ---------------

    def note_queued_dels(self, failing, since, listed):
        """``failing`` entries fail, the oldest since ``since``; ``listed``: the first
        of them, as dicts, for ``kuryr-cni-ctl queued-dels``."""
        with self._lock:
            self._queued_dels = (failing, since, list(listed))

    def queued_dels(self):
        """``{'failing': count, 'entries': [...]}`` as last noted."""
        with self._lock:
            return {'failing': self._queued_dels[0], 'entries': list(self._queued_dels[2])}

    # Everything at once, for the health judgement ----------------------------------

    def facts(self):
        """A :class:`StatusFacts` snapshot, taken in one call."""
        with self._lock:
            return StatusFacts(processes=dict(self._processes),
                               heartbeat_timeout=self._heartbeat_timeout,
                               synced=self._synced, shutting_down=self._shutting_down,
                               watch_activity=self._watch_activity,
                               saturated=frozenset(self._saturated),
                               api_limits=tuple(sorted(self._api_limits.values())),
                               queued_dels_failing=self._queued_dels[0],
                               queued_dels_failing_since=self._queued_dels[1],
                               required_bridges=self._required_bridges)


class BindingTable(_Table):
    """Mirror of the persisted bindings as :class:`kuryr_cni.records.Summary` values,
    indexed by container ID and by the MACs and IPs they hold; and the ADDs in
    flight: when each started (a GC spares them), which came last for each pod,
    and the addresses each reserved.

    An ADD makes three calls: :meth:`add_started`, :meth:`admit_add` (whether
    a DEL of its sandbox came meanwhile, its order and its addresses, judged
    together) and :meth:`add_finished`; a DEL makes one, :meth:`cancel_adds`. Its
    reads of the pods table (``pods``, in the same Manager process) ride on
    calls it makes anyway: :meth:`add_started` returns the pod's record, and
    :meth:`summary_and_record` reads the owner and the record at once. On a
    node busy starting pods, every Manager call waits for its turn on a CPU. Times
    are ``time.monotonic()`` readings (one clock for every process of the
    machine, never stepped): a wall clock stepped forward would make ADDs in
    flight look dead to a GC.
    """

    def __init__(self, pods=None):
        super().__init__()
        self._pods = pods           # the PodTable; None: a table on its own (unit tests)
        self._by_container = {}
        self._by_address = {}       # MAC, IP or 'port <id>' -> {network or None: {pod key}}
        # An ADD in flight is known by its token, not its container ID: a runtime
        # may retry an ADD of a sandbox while the first still runs, and the first
        # to end must not end the other's mark or reservation.
        self._reserved = {}         # ADD token -> (pod key, addresses, time.monotonic() limit)
        self._adds = {}             # ADD token -> (container ID, pod key, monotonic start)
        self._cancelled = set()     # tokens of ADDs in flight whose sandbox a DEL removed
        self._newest_add = {}       # pod key -> (container ID, monotonic time) of its last ADD

    def put(self, key, value):
        with self._lock:
            self._put(key, value)
        _changed([key])

    def drop(self, key):
        with self._lock:
            self._unindex(key)
            self._rows.pop(key, None)
        _changed([key])

    def replace(self, rows):
        with self._lock:    # one atomic update: no reader sees a half-filled table
            self._rows, self._by_container, self._by_address = {}, {}, {}
            for key, value in rows.items():
                self._put(key, value)
        _changed()

    def _put(self, key, value):
        self._unindex(key)
        self._rows[key] = value
        for container_id, _count in value.sandboxes:
            self._by_container[container_id] = key
        for network, address in map(_scoped, value.addresses):
            self._by_address.setdefault(address, {}).setdefault(network, set()).add(key)

    # ADDs in flight ----------------------------------------------------------------

    def add_started(self, container_id, when, pod=None, token=None):
        """Register an ADD in flight; ``pod``: its pod's key, which it is now the newest of.

        ``token`` names this ADD in :meth:`admit_add` and :meth:`add_finished`
        (default: the container ID, for callers that run one ADD per sandbox).
        Returns ``pod``'s record in the pods table (None: none yet), the ADD's
        first look for its VIFs.
        """
        with self._lock:
            self._adds[token or container_id] = (container_id, pod, when)
            if pod is not None:
                now = time.monotonic()
                self._newest_add[pod] = (container_id, now)
                if len(self._newest_add) > NEWEST_ADD_PRUNE_AT:
                    self._newest_add = {key: entry for key, entry in self._newest_add.items()
                                        if now - entry[1] < NEWEST_ADD_TTL}
        return self._pod_record(pod)

    def add_look(self, token, pod):
        """``(deleted, record)``: whether a DEL cancelled the ADD of ``token``
        (:meth:`cancel_adds`), and ``pod``'s record: the look of an ADD waiting for
        its VIFs, which ends at once when its sandbox is deleted."""
        with self._lock:
            deleted = token in self._cancelled
        return deleted, self._pod_record(pod)

    def summary_and_record(self, pod):
        """``(summary, record)``: ``pod``'s binding summary and its pods-table record."""
        with self._lock:
            summary = self._rows.get(pod)
        return summary, self._pod_record(pod)

    def _pod_record(self, pod):
        return None if pod is None or self._pods is None else self._pods.get(pod)

    def _newest(self, pod):
        """The container ID of the ADD for ``pod`` that started last, or None when unknown.

        An ADD that started earlier must not claim the pod: the runtime has
        given up on its sandbox for the newer one (DESIGN §1).
        """
        entry = self._newest_add.get(pod)
        return entry[0] if entry and time.monotonic() - entry[1] < NEWEST_ADD_TTL else None

    def admit_add(self, container_id, pod, addresses, until, token=None):
        """Judge the ADD of ``container_id`` to ``pod``: ``(deleted, newest, taken)``.

        ``deleted``: a DEL of the sandbox came since the ADD started
        (:meth:`cancel_adds`); the ADD may claim nothing and nothing is
        reserved. ``newest``: the container ID of the pod's newest ADD (see
        :meth:`_newest`); when it is another, the ADD is superseded and
        nothing is reserved. Otherwise ``taken`` is what
        :meth:`reserve_addresses` returns for ``addresses``. One call, under
        one lock hold.
        """
        token = token or container_id
        with self._lock:
            newest = self._newest(pod)
            if token in self._cancelled:
                return True, newest, {}
            if newest not in (None, container_id):
                return False, newest, {}
            return False, newest, self._reserve(token, pod, addresses, until)

    def cancel_adds(self, container_id):
        """A DEL of sandbox ``container_id``: its ADDs in flight now may claim nothing
        (:meth:`admit_add` says so). Returns the keys of the pods they are for.

        The runtime was told the sandbox is deleted and will not DEL it again,
        so an ADD still waiting for its VIFs must not go on to plug it. An ADD
        admitted before this call has the pod's lock until its claim is
        recorded, so the DEL, which takes that lock next, finds the claim.
        ADDs the runtime sends later are not touched.
        """
        with self._lock:
            tokens = [t for t, (cid, _, _) in self._adds.items() if cid == container_id]
            self._cancelled.update(tokens)
            pods = {self._adds[t][1] for t in tokens} - {None}
        _changed(pods)      # wakes the ADDs waiting for their VIFs (add_look)
        return pods

    def add_finished(self, token):
        """The ADD of ``token`` (its :meth:`add_started` token) ended: it is no longer in
        flight, its reservation ends. Another ADD of the same sandbox keeps its own."""
        with self._lock:
            self._adds.pop(token, None)
            self._cancelled.discard(token)
            self._reserved.pop(token, None)

    def awaits_unseen_pod(self):
        """Whether an ADD in flight waits for a pod the pods table has no record of:
        the watcher, backing off after an outage, retries the API server early."""
        with self._lock:
            pods = {pod for _, pod, _ in self._adds.values() if pod is not None}
        return any(self._pod_record(pod) is None for pod in pods)

    def adds_since(self, cutoff):
        """Container IDs with an ADD that started after ``cutoff`` (a ``time.monotonic()``)
        and runs."""
        with self._lock:
            return {cid for cid, _, started in self._adds.values() if started > cutoff}

    def reserve_addresses(self, container_id, pod, addresses, until, token=None):
        """Reserve ``addresses`` for the ADD of ``container_id`` to pod ``pod`` until
        ``until`` (a ``time.monotonic()``), unless another pod holds one of them.

        ``addresses`` are :func:`kuryr_cni.records.vif_addresses`' ``(network,
        address)``, or bare addresses (on every network). Another pod holds one
        when its binding records an interface with it, or its ADD in flight
        reserved it, on the same network, or on either side one not known
        (None: the fence stays node-wide where a VIF names no network).
        Returns ``{address: that pod}``, empty when the reservation was made.
        One call, so of two ADDs racing for one address only one can win. The
        reservation ends with :meth:`add_finished` or at ``until`` (a worker
        that died).
        """
        with self._lock:
            return self._reserve(token or container_id, pod, addresses, until)

    def _reserve(self, token, pod, addresses, until):
        addresses = frozenset(map(_scoped, addresses))
        now = time.monotonic()
        for expired in [t for t, (_, _, limit) in self._reserved.items() if limit <= now]:
            del self._reserved[expired]
        taken = {}
        for network, address in sorted(addresses, key=lambda item: item[1]):
            holders = set().union(*(pods for held_on, pods
                                    in self._by_address.get(address, {}).items()
                                    if _overlap(network, held_on))) - {pod}
            if holders:
                taken[address] = min(holders)
        for other, reserved, _ in self._reserved.values():
            if other != pod:
                for network, address in addresses:
                    if any(a == address and _overlap(network, n) for n, a in reserved):
                        taken.setdefault(address, other)
        if not taken:
            self._reserved[token] = (pod, addresses, until)
        return taken

    def find_container(self, container_id):
        with self._lock:
            return self._by_container.get(container_id)

    def count_attachments(self):
        with self._lock:
            return sum(summary.attachment_count() for summary in self._rows.values())

    def _unindex(self, key):
        old = self._rows.get(key)
        for container_id, _count in (old.sandboxes if old else ()):
            if self._by_container.get(container_id) == key:
                del self._by_container[container_id]
        for network, address in map(_scoped, old.addresses if old else ()):
            networks = self._by_address.get(address, {})
            holders = networks.get(network)
            if holders is not None:
                holders.discard(key)
                if not holders:
                    del networks[network]
                if not networks:
                    del self._by_address[address]


def _scoped(address):
    """``(network, address)``; a bare address is on every network (None)."""
    return address if isinstance(address, tuple) else (None, address)


def _overlap(network, other):
    """Whether addresses on ``network`` and ``other`` may collide: the same network,
    or either unknown."""
    return network is None or other is None or network == other


class StaleDelLog:
    """The last entries of one kind, newest last, for operators (bounded): rejected
    stale DELs; findings of the adoption (``AdoptionLog``)."""

    def __init__(self, size=100):
        self._entries = collections.deque(maxlen=size)
        self._lock = threading.Lock()

    def record(self, entry):
        with self._lock:
            self._entries.append(entry)

    def recent(self):
        with self._lock:
            return list(self._entries)


# The only classes a request to the Manager may carry; the rest is plain data
# (str, numbers, None, bool, bytes, tuple, list, dict, set, frozenset).
REQUEST_CLASSES = {('kuryr_cni.records', 'Summary')}
SERIALIZER = 'kuryr-cni-registry'


class _RequestUnpickler(pickle.Unpickler):
    """Decodes requests without running what they carry.

    The Manager is root, and the watcher and ops processes, which run without
    root and parse untrusted input, send it requests: a plain unpickler would
    run whatever callable a request names, as root (doc/source/security.rst,
    "Privilege separation"). Every global a request names must be one of
    :data:`REQUEST_CLASSES`.
    """

    def find_class(self, module, name):
        if (module, name) not in REQUEST_CLASSES:
            raise pickle.UnpicklingError('the registry refuses %s.%s in a request'
                                         % (module, name))
        return super().find_class(module, name)


def _load_request(data):
    return _RequestUnpickler(io.BytesIO(data)).load()


class _RequestListener(multiprocessing.connection.Listener):
    """The Manager's listener: its connections decode requests with :class:`_RequestUnpickler`."""

    def accept(self):
        return multiprocessing.connection.ConnectionWrapper(
            super().accept(), multiprocessing.reduction.ForkingPickler.dumps, _load_request)


# The clients, which trust the Manager's answers, are multiprocessing's own.
multiprocessing.managers.listener_client[SERIALIZER] = (
    _RequestListener, multiprocessing.connection.Client)


class _RegistryManager(multiprocessing.managers.BaseManager):
    pass


def _pod_table():
    return _pods


def _binding_table():
    return BindingTable(_pods)


# The Manager process has one PodTable (made at its start), which the
# BindingTable reads in the calls that also return a pod's record.
_RegistryManager.register('PodTable', _pod_table)
_RegistryManager.register('BindingTable', _binding_table)
_RegistryManager.register('StatusTable', StatusTable)
_RegistryManager.register('StaleDelLog', StaleDelLog)
_RegistryManager.register('AdoptionLog', StaleDelLog)


def _init_manager_process(title, parent_pid, changes):
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
    global _changes, _pods
    _changes = changes
    _pods = PodTable()


class Registry:
    """Proxies to the tables; picklable, and usable after fork."""

    def __init__(self, pods, bindings, status, stale_dels, changes, adoptions=None):
        self.pods = pods
        self.bindings = bindings
        self.status = status
        self.stale_dels = stale_dels
        self.adoptions = adoptions      # a StaleDelLog of the adoption's findings, or None
        self.changes = changes

    @classmethod
    def start(cls, title='kuryr-cni-daemon: registry', address=None):
        """Start the Manager process; returns ``(manager, registry)``.

        Call it before cotyledon's ServiceManager exists and with the fork
        start method, so the Manager inherits default signal handlers.
        ``address`` is the path of the Manager's unix socket; None lets
        multiprocessing make one in a ``pymp-*`` directory under TMPDIR,
        which a Manager ended by a signal leaves behind.
        """
        changes = Changes()     # before the fork: shared with the Manager and its clients
        manager = _RegistryManager(address=address, ctx=multiprocessing.get_context('fork'),
                                   serializer=SERIALIZER)
        manager.start(_init_manager_process, (title, os.getpid(), changes))
        return manager, cls(manager.PodTable(), manager.BindingTable(), manager.StatusTable(),
                            manager.StaleDelLog(), changes, manager.AdoptionLog())

    # The watcher's sink (kuryr_cni.listwatch) --------------------------------

    def replace_pods(self, records):
        self.pods.replace(records)

    def put_pod(self, key, record):
        self.pods.put(key, record)

    def drop_pod(self, key):
        self.pods.drop(key)

    def mark_synced(self, synced):
        self.status.mark_synced(synced)
        if synced:
            self.changes.bump()     # a DEL may wait for the pods to be listed

    def is_synced(self):
        return self.status.is_synced()
