"""What ``/metrics`` reads when it is scraped: the processes' metric files, and the
metrics read then rather than counted as they happen.

The processes' files are prometheus_client's multiprocess ones
(:func:`register_process_metrics`), less any file still being created.

The version, readiness (:mod:`kuryr_cni.daemon.health`), the attachments
and the age of the watcher's last activity (from the registry), and the DELs
waiting in the shim's queue (files in the state dir). Names and help come
from :data:`kuryr_cni.metrics.SCRAPED`. Registered in the ops process's
metrics registry; reads only.

prometheus_client is imported inside :meth:`ScrapeCollector.collect`: it must
not be imported before :func:`kuryr_cni.metrics.setup` has chosen
multiprocess mode.
"""

import glob
import os
import time

from kuryr_cni import metrics
from kuryr_cni import state
from kuryr_cni import version
from kuryr_cni.daemon import health

_SCRAPED = {spec.name: spec for spec in metrics.SCRAPED}
_SIZED = 8      # bytes: a metric file's header, written once the file has its size


def register_process_metrics(metrics_registry):
    """Register the processes' metric files in ``metrics_registry``.

    prometheus_client creates a process's metric file, then sizes it: a scrape
    in between read 0 bytes, failed with ``struct.error`` and answered 500 for
    every metric (prometheus/client_python#1199; seen when a scrape met a
    worker starting). Such a file holds no sample yet, so it is left out.
    """
    from prometheus_client import multiprocess

    class SizedFilesCollector(multiprocess.MultiProcessCollector):
        def collect(self):
            files = []
            for path in glob.glob(os.path.join(self._path, '*.db')):
                try:
                    if os.path.getsize(path) >= _SIZED:
                        files.append(path)
                except OSError:     # removed meanwhile (a dead process's gauges)
                    pass
            return self.merge(files, accumulate=True)

    SizedFilesCollector(metrics_registry)


class ScrapeCollector:
    """A prometheus_client collector of :data:`kuryr_cni.metrics.SCRAPED`."""

    def __init__(self, registry, state_dir, queue_fd=None):
        self.registry = registry
        self.state_dir = state_dir
        self.queue_fd = queue_fd    # state.queued_del_count's, in a process without root

    def collect(self):
        yield _gauge('kuryr_cni_build_info', 1, (version.VERSION,))
        yield _gauge('kuryr_cni_queued_dels',
                     state.queued_del_count(self.state_dir, self.queue_fd))
        yield _gauge('kuryr_cni_ready', int(health.judge(self.registry)['ready']))
        try:
            attachments = self.registry.bindings.count_attachments()
            activity = self.registry.status.facts().watch_activity
        except (ConnectionError, EOFError, OSError):
            return      # the registry is gone: kuryr_cni_ready says so
        yield _gauge('kuryr_cni_attachments', attachments)
        if activity is not None:
            yield _gauge('kuryr_cni_watch_activity_age_seconds',
                         max(0.0, time.monotonic() - activity))


def _gauge(name, value, label_values=()):
    from prometheus_client.core import GaugeMetricFamily
    spec = _SCRAPED[name]
    family = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels or None)
    family.add_metric(list(label_values), value)
    return family
