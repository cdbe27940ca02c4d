"""The ops process: ``/metrics`` for Prometheus and ``/alive`` ``/ready`` for probes.

``/alive`` and ``/ready`` answer 200 or 503 as :mod:`kuryr_cni.daemon.health`
judges (documented for operators in doc/source/operations.rst), with a small
JSON document of the facts judged, the problems found and the probe's
consecutive failures; the count is reset by the next success, and the first
failure and the recovery are logged once each rather than at every probe.
While shutting down, the ops process serves on until the CNI workers have
drained. Both ports are open to anyone who can reach them and are served by
:class:`kuryr_cni.daemon.server.BoundedServer` within :data:`LIMITS`, so a
flood of connections can neither grow the process nor keep a probe out.

prometheus_client is imported inside functions: it must not be imported
before :func:`kuryr_cni.metrics.setup` has chosen multiprocess mode.
"""

import json
import os
import threading

import cotyledon
import setproctitle
from oslo_log import log as logging

from kuryr_cni import state
from kuryr_cni.daemon import collector
from kuryr_cni.daemon import health
from kuryr_cni.daemon import server

LOG = logging.getLogger(__name__)

TITLE = 'kuryr-cni-daemon: ops'

# Each port, whoever connects: probes and scrapes are small GETs answered in
# milliseconds, so two request threads suffice, and the head must be in at
# once. Two servers at the cap hold ~520 file descriptors, within the usual
# soft limit of 1024.
LIMITS = server.Limits(threads=2, connections=256, head_timeout=2, request_timeout=2)


class ProbeLog:
    """Consecutive failures of each probe: reset by a success, logged on changes only."""

    def __init__(self):
        self._lock = threading.Lock()
        self._failures = {}

    def record(self, probe, facts):
        """Count one answer of ``probe``; returns its consecutive failures so far."""
        with self._lock:
            before = self._failures.get(probe, 0)
            now = 0 if facts[probe] else before + 1
            self._failures[probe] = now
        if now == 1:
            LOG.warning('/%s is failing: %s', probe, '; '.join(facts.get('problems', [])))
        elif now == 0 and before:
            LOG.info('/%s passes again after %d failed probes', probe, before)
        return now


class _PlainErrors:
    """Refusals, and answers to unknown paths, in plain text."""

    def refuse(self, status, message):
        return server.Response(status, message.encode() + b'\n', 'text/plain')


class HealthApp(_PlainErrors):
    """``/alive`` and ``/ready`` (a :class:`kuryr_cni.daemon.server.App`)."""

    def __init__(self, registry):
        self.registry = registry
        self.probes = ProbeLog()

    def answer(self, request):
        if request.method != 'GET' or request.path not in ('/alive', '/ready'):
            return self.refuse(404, 'not found')
        probe = request.path[1:]
        facts = health.judge(self.registry)
        facts['consecutive_failures'] = self.probes.record(probe, facts)
        return server.Response(200 if facts[probe] else 503, json.dumps(facts).encode())


class MetricsApp(_PlainErrors):
    """``/metrics`` in the Prometheus text format (a :class:`kuryr_cni.daemon.server.App`)."""

    def __init__(self, metrics_registry):
        self.metrics_registry = metrics_registry

    def answer(self, request):
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        if request.method != 'GET' or request.path != '/metrics':
            return self.refuse(404, 'not found')
        return server.Response(200, generate_latest(self.metrics_registry), CONTENT_TYPE_LATEST)


class OpsService(cotyledon.Service):
    """Serves the health and metrics sockets the parent opened until terminated.

    ``terminate`` keeps serving (``/ready`` 503 "shutting down", ``/metrics``)
    until the CNI workers have drained, ``drain_timeout`` seconds at most.
    """

    name = 'ops'

    def __init__(self, worker_id, registry, health_sock, metrics_sock, drain_timeout=0,
                 state_dir=None):
        super().__init__(worker_id)
        self.registry = registry
        self.state_dir = state_dir
        # Built in the new process before it drops root (kuryr_cni.daemon.main),
        # run after: the DEL queue's directory is root's alone.
        self.queue_fd = None if state_dir is None else os.open(
            os.path.join(state_dir, state.DEL_QUEUE), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.socks = (health_sock, metrics_sock)
        self.drain_timeout = drain_timeout
        self.servers = []

    def run(self):
        from prometheus_client import CollectorRegistry
        setproctitle.setproctitle(TITLE)
        metrics_registry = CollectorRegistry()
        collector.register_process_metrics(metrics_registry)
        metrics_registry.register(
            collector.ScrapeCollector(self.registry, self.state_dir, self.queue_fd))
        health_sock, metrics_sock = self.socks
        self.servers = [server.BoundedServer(health_sock, HealthApp(self.registry), LIMITS,
                                             'health'),
                        server.BoundedServer(metrics_sock, MetricsApp(metrics_registry), LIMITS,
                                             'metrics')]
        threading.Thread(target=self.servers[0].serve_forever, name='health',
                         daemon=True).start()
        self.servers[1].serve_forever()

    def terminate(self):
        health.wait_for_cni_workers_to_exit(self.registry, self.drain_timeout)
        for srv in self.servers:
            srv.stop(drain_timeout=LIMITS.write_timeout)
