"""The daemon's Prometheus metrics, aggregated across processes.

prometheus_client decides at import time whether values live in per-process
files (multiprocess mode), so :func:`setup` sets PROMETHEUS_MULTIPROC_DIR,
wipes the directory and only then imports it. Callers record events through
the small functions below, which do nothing before :func:`setup` (unit tests of
other modules need no metrics).
"""

import glob
import itertools
import os
import shutil
import types
import typing

_m = None

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Spec(typing.NamedTuple):
    """One metric: its attribute on :func:`setup`'s namespace and how it is exported."""

    attr: str
    kind: str                  # counter, gauge or histogram
    name: str                  # as exported: counters end in _total, durations in _seconds
    help: str
    labels: tuple = ()
    options: dict = {}         # further arguments of the prometheus_client class
    known: tuple = ()          # label values created at start, one tuple per label

    def known_label_sets(self):
        """Every combination of the known label values (none for unlabelled metrics)."""
        return list(itertools.product(*self.known)) if self.labels else []


COMMANDS = ('ADD', 'DEL', 'CHECK', 'GC', 'STATUS')
RESULTS = ('success', 'noop', 'stale', 'error')
ERRORS = ('False', 'True')                      # str(bool), as kuryr-kubernetes writes it
SERVICES = ('watcher', 'cni-worker', 'ops')     # kuryr_cni.daemon.main's children
SERVERS = ('cni', 'health', 'metrics')          # kuryr_cni.daemon.server instances, by name
DROP_REASONS = ('peer_uid', 'head_timeout', 'request_timeout', 'write_timeout', 'evicted')
WATCH_LIMITS = ('list_bytes', 'list_time', 'object_size', 'object_count', 'watch_time')
# kube-apiserver's watch event types; any other is counted as 'other' (a label per
# type a server makes up would grow the metric without bound).
WATCH_EVENT_TYPES = ('ADDED', 'MODIFIED', 'DELETED', 'BOOKMARK', 'ERROR', 'other')
WATCH_SKIPS = ('too_large', 'unusable')


# The daemon's metric set (DESIGN 4.4); doc/source/operations.rst lists it for
# operators. The counted ones are SPECS; SCRAPED are read when /metrics is
# scraped (kuryr_cni.daemon.collector).
SPECS = (
    Spec('requests', 'counter', 'kuryr_cni_requests_total',
         'CNI requests handled, by command and result.', ('command', 'result'),
         known=(COMMANDS, RESULTS)),
    # kuryr-kubernetes' kuryr-daemon exports this name with these labels; its
    # operators' rules filter on error="True".
    Spec('duration', 'histogram', 'kuryr_cni_request_duration_seconds',
         'Time to answer a CNI request, by command and whether it was an error.',
         ('command', 'error'), {'buckets': DURATION_BUCKETS}, known=(COMMANDS, ERRORS)),
    Spec('in_flight', 'gauge', 'kuryr_cni_requests_in_flight',
         'CNI requests being served now.', (), {'multiprocess_mode': 'livesum'}),
    Spec('stale_del', 'counter', 'kuryr_cni_stale_del_rejected_total',
         'DELs from a sandbox that does not own the pod, rejected without touching it.',
         ('reason',), known=(('container_id_mismatch', 'pod_uid_mismatch'),)),
    Spec('adoptions', 'counter', 'kuryr_cni_adoptions_total',
         'Devices kuryr-daemon plugged, found by the adoption: adopted, removed (evicted, '
         'orphaned) or left alone, by the reason.', ('result', 'reason'),
         known=(('adopted',), ('proven',))),
    Spec('evictions', 'counter', 'kuryr_cni_sandbox_evictions_total',
         "Previous sandboxes' devices removed when a new sandbox of the pod was added."),
    Spec('vif_wait', 'histogram', 'kuryr_cni_vif_wait_seconds',
         'Time an ADD waited for its pod and VIFs.', (), {'buckets': DURATION_BUCKETS}),
    Spec('watch_restarts', 'counter', 'kuryr_cni_watch_restarts_total',
         'Times the pod watch was re-established after a failure, by reason.', ('reason',),
         known=(('error', 'expired'),)),
    Spec('watch_limits', 'counter', 'kuryr_cni_watch_limit_exceeded_total',
         'Answers of the API server cut short for exceeding a limit of the watcher, by '
         'limit.', ('limit',), known=(WATCH_LIMITS,)),
    Spec('watch_events', 'counter', 'kuryr_cni_watch_events_total',
         'Watch events received, by type.', ('type',), known=(WATCH_EVENT_TYPES,)),
    Spec('watch_skips', 'counter', 'kuryr_cni_watch_objects_skipped_total',
         'Listed or watched objects skipped, by reason: too large to read (only their '
         'identity was) or unusable (no name, UID or version).', ('reason',),
         known=(WATCH_SKIPS,)),
    Spec('worker_restarts', 'counter', 'kuryr_cni_worker_restarts_total',
         'Daemon child processes that died and were replaced, by service.', ('service',),
         known=(SERVICES,)),
    Spec('del_replayed', 'counter', 'kuryr_cni_queued_del_replayed_total',
         'DELs queued by the shim and replayed.'),
    Spec('del_replay_failed', 'counter', 'kuryr_cni_queued_del_failures_total',
         'Replays of a queued DEL that failed; the entry is kept and retried with back-off.'),
    Spec('set_aside', 'counter', 'kuryr_cni_state_files_set_aside_total',
         'State files that were not valid records, moved aside, by kind.', ('kind',),
         known=(('binding', 'del_queue'),)),
    Spec('connections_open', 'gauge', 'kuryr_cni_connections_open',
         'Connections whose request is being read or answer written (what the cap '
         'counts), by server.',
         ('server',), {'multiprocess_mode': 'livesum'}, known=(SERVERS,)),
    Spec('connections_limit', 'gauge', 'kuryr_cni_connections_limit',
         'The connection caps of the serving processes, summed, by server.',
         ('server',), {'multiprocess_mode': 'livesum'}, known=(SERVERS,)),
    Spec('connections_dropped', 'counter', 'kuryr_cni_connections_dropped_total',
         'Connections closed without an answer, by server and reason.', ('server', 'reason'),
         known=(SERVERS, DROP_REASONS)),
)


class Scraped(typing.NamedTuple):
    """A gauge read at scrape time: its exported name, help and labels."""

    name: str
    help: str
    labels: tuple = ()


SCRAPED = (
    Scraped('kuryr_cni_build_info', 'The running kuryr-cni, by version; always 1.',
            ('version',)),
    Scraped('kuryr_cni_ready', 'Whether the daemon is ready (1) or not (0).'),
    Scraped('kuryr_cni_attachments', 'Pod interface attachments recorded on this node.'),
    Scraped('kuryr_cni_queued_dels',
            'DELs the shim queued while the daemon was unreachable, not yet applied: '
            'replayed at start and every few seconds while the daemon runs.'),
    Scraped('kuryr_cni_watch_activity_age_seconds',
            'Seconds since the watcher last received a list, a watch event or a bookmark '
            'from the API server; absent until the first list.'),
)


def setup(directory):
    """Prepare multiprocess mode in ``directory`` (wiped) and create the metrics."""
    global _m
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory, mode=0o700)
    os.environ['PROMETHEUS_MULTIPROC_DIR'] = directory
    import prometheus_client as prom
    classes = {'counter': prom.Counter, 'gauge': prom.Gauge, 'histogram': prom.Histogram}
    _m = types.SimpleNamespace(**{
        spec.attr: classes[spec.kind](spec.name, spec.help, spec.labels, **spec.options)
        for spec in SPECS})
    # Series of known label values read 0 from the start instead of being
    # absent, so rate() and alerts see their first increase.
    for spec in SPECS:
        for values in spec.known_label_sets():
            getattr(_m, spec.attr).labels(*values)
    return _m


def open_process_files():
    """Create this process's metric files now; returns their paths.

    prometheus_client opens a process's files at the first use of a metric
    after the fork, and then writes them through their mappings: a process
    about to drop root opens them while it may still create files.
    """
    if not _m:
        return []
    _m.evictions.inc(0)     # any metric: the first use in a process opens every file
    return glob.glob(os.path.join(os.environ['PROMETHEUS_MULTIPROC_DIR'],
                                  '*_%d.db' % os.getpid()))


def observe_request(command, result, seconds):
    if _m:
        _m.requests.labels(command, result).inc()
        _m.duration.labels(command, str(result == 'error')).observe(seconds)


def in_flight(delta):
    if _m:
        _m.in_flight.inc(delta)


def stale_del_rejected(reason):
    if _m:
        _m.stale_del.labels(reason).inc()


def adoption(result, reason):
    if _m:
        _m.adoptions.labels(result, reason).inc()


def sandbox_evicted():
    if _m:
        _m.evictions.inc()


def vif_waited(seconds):
    if _m:
        _m.vif_wait.observe(seconds)


def watch_restarted(reason):
    if _m:
        _m.watch_restarts.labels(reason).inc()


def watch_limit_exceeded(limit):
    if _m:
        _m.watch_limits.labels(limit).inc()


def watch_event(event_type):
    if _m:
        _m.watch_events.labels(event_type).inc()


def watch_object_skipped(reason):
    if _m:
        _m.watch_skips.labels(reason).inc()


def worker_restarted(service):
    if _m:
        _m.worker_restarts.labels(service).inc()


def del_replayed():
    if _m:
        _m.del_replayed.inc()


def queued_del_failed():
    if _m:
        _m.del_replay_failed.inc()


def state_file_set_aside(kind):
    if _m:
        _m.set_aside.labels(kind).inc()


def connections_open(server, count):
    if _m:
        _m.connections_open.labels(server).set(count)


def connections_limit(server, count):
    if _m:
        _m.connections_limit.labels(server).set(count)


def connection_dropped(server, reason):
    if _m:
        _m.connections_dropped.labels(server, reason).inc()


def process_dead(pid):
    """Drop a dead process's live gauges (its counters stay, as they must)."""
    if _m:
        from prometheus_client import multiprocess
        multiprocess.mark_process_dead(pid)
