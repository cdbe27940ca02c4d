"""``kuryr-cni-daemon``: start-up in the order DESIGN §2 requires.

config, checked whole (a bad one ends the start here: one line on stderr,
exit status 2) and logging → safety checks (no live daemon on the socket;
the run dir's lock: one daemon per run dir; a state dir only root may write,
and its lock: one daemon per state dir; both waited for while a predecessor
drains, :mod:`kuryr_cni.daemon.handover`) →
metrics directory → registry Manager (before cotyledon, with the fork start method,
its socket ``registry/registry.sock`` in the run dir) → the services' modules
(:func:`import_services`, after the Manager's fork) → state recovery → listening
sockets → cotyledon ServiceManager with the watcher, the CNI workers and the
ops process, the watcher and ops dropping root as they start
(:mod:`kuryr_cni.daemon.privileges`) → systemd notification. On SIGTERM the socket's name
is withdrawn (new requests wait for the next daemon), cotyledon stops the
children gracefully (in-flight requests answered) and exits 0; the Manager is
shut down last. On SIGINT cotyledon
exits at once and the Manager follows through its parent-death signal. If the
Manager dies, the parent stops gracefully too and exits non-zero
(:mod:`kuryr_cni.daemon.manager_guard`).
"""

import contextlib
import ctypes
import errno
import fcntl
import gc
import importlib
import multiprocessing
import os
import sys
import time
import types

import cotyledon
from oslo_log import log as logging

from kuryr_cni import conf as config
from kuryr_cni import metrics
from kuryr_cni import registry as registry_mod
from kuryr_cni import state
from kuryr_cni.daemon import handover
from kuryr_cni.daemon import health
from kuryr_cni.daemon import listener
from kuryr_cni.daemon import manager_guard
from kuryr_cni.daemon import privileges
from kuryr_cni.daemon import sdnotify

LOG = logging.getLogger(__name__)

REGISTRY_DIR = 'registry'           # in the run dir: the registry Manager's socket
REGISTRY_SOCKET = 'registry.sock'
METRICS_DIR = 'metrics'             # in the run dir: prometheus_client's files
# Services that parse untrusted input: they run without root (privileges.drop).
UNPRIVILEGED = ('watcher', 'ops')
EXIT_PRIVILEGES = 4                 # a child that could not drop root
STATE_LOCK = 'daemon.lock'          # in the state dir and the run dir: one daemon per each
M_ARENA_MAX = -8                    # mallopt(3)
LOCK_POLL = 0.05                    # seconds between tries of a lock a predecessor holds


# Libraries whose debug output would drown ours (pyroute2 logs every netlink message).
QUIET_LIBRARIES = ['pyroute2=WARN', 'urllib3=WARN', 'kubernetes=WARN', 'asyncio=WARN',
                   'cotyledon=INFO']


def main(argv=None):
    try:
        conf = config.load(sys.argv[1:] if argv is None else argv)
        # Before the run dir, the state dir or the registry is touched.
        notes = config.validate(conf)
    except config.ConfigError as exc:
        print('kuryr-cni-daemon: configuration error: %s' % exc, file=sys.stderr)
        return 2
    logging.set_defaults(default_log_levels=logging.get_default_log_levels() + QUIET_LIBRARIES)
    logging.setup(conf, 'kuryr-cni')
    for note in notes:
        LOG.log(note.level, '%s', note.message)
    multiprocessing.set_start_method('fork', force=True)
    _limit_malloc_arenas()
    try:
        return run(conf)
    except (listener.UnsafeSetup, privileges.PrivilegeError) as exc:
        refusal = str(exc)
    # Outside the except block, so that the log line does not repeat it.
    LOG.error('Refusing to start: %s', refusal)
    return 2


def run(conf):
    opts = conf.cni_daemon
    unprivileged = privileges.identity(opts.unprivileged_user)
    privileges.check_can_drop()
    privileges.forbid_new_privileges()      # before any thread or child exists
    run_dir = listener.ensure_private_dir(os.path.dirname(opts.socket))
    # Before anything in the run dir is wiped or replaced (metrics files, the
    # registry socket): a live daemon owns it, on this socket or another.
    listener.refuse_live_daemon(opts.socket)
    # A predecessor draining after SIGTERM holds the locks a while: wait for it.
    patience = handover.predecessor_patience(run_dir, drain_timeout(opts))
    locked = [_lock_dir(run_dir, 'run dir', patience)]  # bare descriptors: held until we exit
    handover.took_over(run_dir)
    for directory in state.private_dirs(opts.state_dir):    # only root may plant state
        listener.ensure_private_dir(directory)
    if os.path.realpath(opts.state_dir) != os.path.realpath(run_dir):
        locked.append(_lock_dir(opts.state_dir, 'state dir', patience))
    _setup_metrics(os.path.join(run_dir, METRICS_DIR), unprivileged.gid)
    _freeze_heap()
    manager, registry = _start_registry(run_dir, unprivileged.gid)
    guard = manager_guard.ManagerGuard(registry.status.server_pid())
    try:
        services = import_services()
        _recover(conf, registry, services)
        cni_sock = listener.open_unix(opts.socket)
        health_sock = listener.open_tcp(conf.health.host, conf.health.port)
        metrics_sock = listener.open_tcp(conf.prometheus.host, conf.prometheus.port)
        try:
            _serve(conf, registry, services, (cni_sock, health_sock, metrics_sock), guard,
                   unprivileged)
        except SystemExit:
            # cotyledon ends every graceful shutdown with sys.exit(0); one the
            # Manager's death caused must tell the supervisor to restart us.
            if guard.lost:
                return manager_guard.EXIT_REGISTRY_LOST
            raise
    finally:
        guard.disarm()
        manager.shutdown()
    return 0


def drain_timeout(opts):
    """Seconds a planned stop waits for the requests in flight (cotyledon's graceful
    shutdown timeout: the workers' drain, bounded by the request timeout)."""
    return opts.request_timeout + 10


def _lock_dir(directory, what, patience=0):
    """Take ``directory``'s lock, or refuse: one daemon per state dir and per run dir,
    whatever socket each names (``what`` names the directory in the refusal).
    A lock held is waited for up to ``patience`` s (a predecessor draining).

    An ``fcntl.flock`` on ``daemon.lock`` in it, taken before anything there
    is read or changed, and never released: the kernel drops it when the last
    process holding it (the parent, the Manager and the children inherit it)
    has exited. Returns the descriptor. Any error here is a refusal to start
    (one line, exit status 2), never a traceback a supervisor would loop on.
    """
    path = os.path.join(directory, STATE_LOCK)
    # Read-only first: a descriptor open for writing keeps the disk from being
    # remounted read-only under a running daemon. NFSv4 emulates flock with a
    # POSIX lock and refuses an exclusive one on a read-only descriptor
    # (EBADF): there, open for writing.
    deadline = time.monotonic() + patience
    if patience:
        LOG.info('Waiting up to %d s for the daemon stopping in %s to drain', patience, directory)
    for access in (os.O_RDONLY, os.O_RDWR):
        fd = None
        try:
            fd = os.open(path, access | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            _flock_within(fd, deadline)
            return fd
        except OSError as exc:
            if fd is not None:
                os.close(fd)
            if isinstance(exc, BlockingIOError):
                raise listener.UnsafeSetup('another daemon uses the %s %s (it holds %s)'
                                           % (what, directory, path)) from None
            if exc.errno == errno.EBADF and access == os.O_RDONLY:
                continue
            raise listener.UnsafeSetup('cannot lock the %s: %s: %s'
                                       % (what, path, exc.strerror or exc)) from None


def _flock_within(fd, deadline):
    """An exclusive flock on ``fd``, tried until ``deadline`` (BlockingIOError after it).

    Polled: a blocking flock cannot be bounded without a signal, and the
    wait is for a predecessor's exit, a handful of tries.
    """
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
        time.sleep(LOCK_POLL)


def _address(sock):
    host, port = sock.getsockname()[:2]
    return '[%s]:%d' % (host, port) if ':' in host else '%s:%d' % (host, port)


def _limit_malloc_arenas():
    """Give every thread of every process one of two glibc malloc arenas.

    By default glibc makes an arena per thread, up to eight per core, and
    keeps what each frees: a CNI worker's request threads, busy at once under
    a burst of pod starts, grew it by ~14 MiB that it never gave back. Set
    before any thread or child exists, so all of them inherit it.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(M_ARENA_MAX, 2)


def _registry_socket(run_dir):
    """Path of the registry Manager's socket, freed of one a killed Manager left.

    In the root-only run dir, not in the ``pymp-*`` directory multiprocessing
    would make under TMPDIR, which outlives every Manager ended by a signal.
    """
    directory = os.path.join(run_dir, REGISTRY_DIR)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, REGISTRY_SOCKET)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return path


def _start_registry(run_dir, gid):
    """Start the registry Manager; its socket is reachable by the dropped processes too.

    Forked before :func:`import_services`: the Manager never runs the
    services' code (pyroute2, the Kubernetes client), so it need not map it
    (~30 MiB of RSS instead of ~80; the daemon's PSS barely moves, as those
    pages stay shared by the other processes: doc/source/benchmark.rst).

    Each thread of a process opens its own connection to the Manager at its
    first call, so the dropped watcher and ops connect long after their drop:
    they reach the socket (group ``gid``, 0660) through
    :func:`privileges.shared_dir`'s descriptor, as does every other process,
    since the Manager's proxies carry one address for all.
    """
    path = _registry_socket(run_dir)
    address = os.path.join(privileges.shared_dir(os.path.dirname(path), gid), REGISTRY_SOCKET)
    manager, registry = registry_mod.Registry.start(address=address)
    os.chown(path, 0, gid)
    os.chmod(path, 0o660)
    return manager, registry


def _setup_metrics(directory, gid):
    """Multiprocess metrics in ``directory``, readable by the dropped ops process.

    Every process names the directory through :func:`privileges.shared_dir`'s
    descriptor (``PROMETHEUS_MULTIPROC_DIR`` is read at each file's creation
    and by the collector), and makes its files readable by group ``gid``
    (:func:`_share_metric_files`): the ops process reads them all.
    """
    metrics.setup(directory)
    os.environ['PROMETHEUS_MULTIPROC_DIR'] = privileges.shared_dir(directory, gid)
    _share_metric_files(gid)


def _share_metric_files(gid):
    """Create this process's metric files now, readable by group ``gid``.

    A dropped process could not create them later, nor could ops read them
    under the unit's UMask=0077; it writes them through the mappings opened here.
    """
    for path in metrics.open_process_files():
        os.chown(path, 0, gid)
        os.chmod(path, 0o640)


def _freeze_heap():
    """Keep what the parent has built shared with the children it forks next.

    A garbage collection in a child writes to the GC header of every object
    it traverses, which copies each page of the inherited heap into the child:
    ~25 MiB more per CNI worker once it has served a few hundred requests.
    Frozen objects are never traversed, so those pages stay shared.
    """
    gc.collect()
    gc.freeze()


# The services' modules, and start-up recovery's (it reaches the rules), imported once
# the registry Manager is forked: with them come pyroute2 (~10 MiB) and the Kubernetes
# client (~40 MiB).
SERVICE_MODULES = ('watcher', 'worker', 'ops', 'recovery')
# What the dropped processes import after their drop, imported here in the
# parent instead, so that the children share their pages: the daemon's
# virtualenv need not be readable by the unprivileged user either (tox's .tox/
# is 0700, a root-only /root/venv would be too).
IMPORTED_BEFORE_THE_FORK = ('prometheus_client.core', 'prometheus_client.exposition',
                            'prometheus_client.multiprocess')


# Installed beside the daemon in a test virtualenv (test-requirements.txt), not in
# the image: the Kubernetes client's dynamic module imports it when present, and
# with it jsonschema, ~3.7 MiB the daemon, which validates no manifests, never uses.
NOT_IMPORTED = ('kubernetes_validate',)


def import_services():
    """:data:`SERVICE_MODULES`, by name (a namespace), imported now."""
    for module in NOT_IMPORTED:
        sys.modules.setdefault(module, None)      # import raises ImportError
    for module in IMPORTED_BEFORE_THE_FORK:
        importlib.import_module(module)
    return types.SimpleNamespace(**{
        name: importlib.import_module('kuryr_cni.daemon.' + name) for name in SERVICE_MODULES})


def _recover(conf, registry, services):
    ownership = services.worker.build_ownership(conf, registry)
    services.recovery.restore(ownership, state.DelQueue(conf.cni_daemon.state_dir),
                              ownership.locks.directory)


def _drop(role, unprivileged):
    privileges.keep_log_files_open()
    try:
        privileges.drop(unprivileged)
    except (privileges.PrivilegeError, OSError) as exc:
        # cotyledon would log an exception of a hook and run the service anyway.
        LOG.error('The %s process could not drop root, exiting: %s', role, exc)
        os._exit(EXIT_PRIVILEGES)
    LOG.info('The %s process runs as %s (uid %d, gid %d) without capabilities',
             role, unprivileged.user, unprivileged.uid, unprivileged.gid)


def _serve(conf, registry, services, sockets, guard, unprivileged):
    cni_sock, health_sock, metrics_sock = sockets
    watcher, worker, ops = services.watcher, services.worker, services.ops
    sm = cotyledon.ServiceManager(graceful_shutdown_timeout=drain_timeout(conf.cni_daemon))
    registry.status.set_heartbeat_timeout(conf.health.heartbeat_timeout)
    registry.status.set_required_bridges(conf.binding.required_bridges)
    names = {
        sm.add(watcher.WatcherService, workers=1, args=(conf, registry)): 'watcher',
        sm.add(worker.CNIWorker, workers=conf.cni_daemon.worker_count,
               args=(conf, registry, cni_sock)): 'cni-worker',
        sm.add(ops.OpsService, workers=1, args=(registry, health_sock, metrics_sock,
                                                conf.cni_daemon.request_timeout,
                                                conf.cni_daemon.state_dir)): 'ops',
    }
    # The parent alone speaks to systemd, and only READY=1 once really ready:
    # cotyledon would send its own READY=1 at start, and children must not
    # inherit the socket.
    notifier = sdnotify.Notifier(lambda: health.judge(registry), env=dict(os.environ))
    os.environ.pop('NOTIFY_SOCKET', None)

    def on_new_worker(service_id, worker_id, service):
        # The first beat: a new process counts as serving until its loop is due to beat.
        registry.status.process_started(names[service_id], worker_id, os.getpid(),
                                        time.monotonic())
        _share_metric_files(unprivileged.gid)
        if names[service_id] in UNPRIVILEGED:
            # Not the sockets it does not serve: the watcher could otherwise accept
            # the shim's connections and answer them.
            served = (health_sock, metrics_sock) if names[service_id] == 'ops' else ()
            for sock in (cni_sock, health_sock, metrics_sock):
                if sock not in served:
                    sock.close()
            # Here, in the child's main thread before its service's thread starts
            # (cotyledon runs the service in a thread of its own).
            _drop(names[service_id], unprivileged)

    def on_dead_worker(service_id, worker_id, exit_code):
        metrics.worker_restarted(names[service_id])
        LOG.warning('%s %s exited with %s; starting a new one',
                    names[service_id], worker_id, exit_code)
        # Without the registry there is nothing to tidy: the watch stops the daemon.
        with contextlib.suppress(ConnectionError, EOFError, OSError):
            pid = registry.status.pid_of(names[service_id], worker_id)
            if pid:
                metrics.process_dead(pid)
            if names[service_id] == 'watcher':
                # Not ready again until its successor has relisted.
                registry.mark_synced(False)
            elif names[service_id] == 'cni-worker':
                # It may have died between a binding file and its mirror.
                registry.status.request_resync()

    def on_terminate():
        # Before the children drain: new requests wait for the next daemon.
        handover.withdraw(os.path.dirname(conf.cni_daemon.socket), conf.cni_daemon.socket)
        with contextlib.suppress(ConnectionError, EOFError, OSError):
            registry.status.mark_shutting_down()
        notifier.stop()

    sm.register_hooks(on_new_worker=on_new_worker, on_dead_worker=on_dead_worker,
                      on_terminate=on_terminate)
    for sock in (cni_sock, health_sock, metrics_sock):
        sock.set_inheritable(True)
    notifier.start()
    guard.start()
    LOG.info('kuryr-cni-daemon serving %s for node %s with %d workers; health on %s, '
             'metrics on %s', conf.cni_daemon.socket, conf.cni_daemon.node_name,
             conf.cni_daemon.worker_count,
             _address(health_sock), _address(metrics_sock))
    _freeze_heap()
    sm.run()


if __name__ == '__main__':
    sys.exit(main())
