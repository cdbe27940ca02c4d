"""The daemon's Prometheus metrics, aggregated across processes.

prometheus_client decides at import time whether values live in per-process
files (multiprocess mode), so :func:`setup` sets PROMETHEUS_MULTIPROC_DIR,
wipes the directory and only then imports it. Callers record events through
the small functions below, which do nothing before :func:`setup` (unit tests of
other modules need no metrics).
"""

import os
import shutil
import types

_m = None

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


def setup(directory):
    """Prepare multiprocess mode in ``directory`` (wiped) and create the metrics."""
    global _m
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory, mode=0o700)
    os.environ['PROMETHEUS_MULTIPROC_DIR'] = directory
    import prometheus_client as prom
    _m = types.SimpleNamespace(
        requests=prom.Counter(
            'kuryr_cni_requests', 'CNI requests handled, by command and result.',
            ['command', 'result']),
        duration=prom.Histogram(
            'kuryr_cni_request_duration_seconds', 'Time to answer a CNI request.',
            ['command'], buckets=DURATION_BUCKETS),
        in_flight=prom.Gauge(
            'kuryr_cni_requests_in_flight', 'CNI requests being served now.',
            multiprocess_mode='livesum'),
        stale_del=prom.Counter(
            'kuryr_cni_stale_del_rejected',
            'DELs from a sandbox that does not own the pod, rejected without touching it.',
            ['reason']),
        evictions=prom.Counter(
            'kuryr_cni_sandbox_evictions',
            "Previous sandboxes' devices removed when a new sandbox of the pod was added."),
        vif_wait=prom.Histogram(
            'kuryr_cni_vif_wait_seconds', 'Time an ADD waited for its pod and VIFs.',
            buckets=DURATION_BUCKETS),
        watch_restarts=prom.Counter(
            'kuryr_cni_watch_restarts', 'Times the pod watch was re-established.',
            ['reason']),
        watch_events=prom.Counter(
            'kuryr_cni_watch_events', 'Watch events received, by type.', ['type']),
        worker_restarts=prom.Counter(
            'kuryr_cni_worker_restarts', 'Daemon child processes that died and were replaced.',
            ['service']),
        del_replayed=prom.Counter(
            'kuryr_cni_queued_del_replayed', 'DELs queued by the shim and replayed at start.'),
    )
    # Pre-create the label sets operators alert on, so they read 0, not absent.
    for reason in ('container_id_mismatch', 'pod_uid_mismatch'):
        _m.stale_del.labels(reason)
    return _m


def observe_request(command, result, seconds):
    if _m:
        _m.requests.labels(command, result).inc()
        _m.duration.labels(command).observe(seconds)


def in_flight(delta):
    if _m:
        _m.in_flight.inc(delta)


def stale_del_rejected(reason):
    if _m:
        _m.stale_del.labels(reason).inc()


def sandbox_evicted():
    if _m:
        _m.evictions.inc()


def vif_waited(seconds):
    if _m:
        _m.vif_wait.observe(seconds)


def watch_restarted(reason):
    if _m:
        _m.watch_restarts.labels(reason).inc()


def watch_event(event_type):
    if _m:
        _m.watch_events.labels(event_type).inc()


def worker_restarted(service):
    if _m:
        _m.worker_restarts.labels(service).inc()


def del_replayed():
    if _m:
        _m.del_replayed.inc()


def process_dead(pid):
    """Drop a dead process's live gauges (its counters stay, as they must)."""
    if _m:
        from prometheus_client import multiprocess
        multiprocess.mark_process_dead(pid)
