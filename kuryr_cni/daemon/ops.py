"""The ops process: ``/metrics`` for Prometheus and ``/alive`` ``/ready`` for probes.

``/alive`` and ``/ready`` answer 200 or 503 as :mod:`kuryr_cni.daemon.health`
judges (documented for operators in doc/source/operations.rst), with a small
JSON document of the facts judged, the problems found and the probe's
consecutive failures; the count is reset by the next success, and the first
failure and the recovery are logged once each rather than at every probe.
While shutting down, the ops process serves on until the CNI workers have
drained.

prometheus_client is imported inside functions: it must not be imported
before :func:`kuryr_cni.metrics.setup` has chosen multiprocess mode.
"""

import http.server
import json
import threading

import cotyledon
import setproctitle
from oslo_log import log as logging

from kuryr_cni.daemon import collector
from kuryr_cni.daemon import health

LOG = logging.getLogger(__name__)

TITLE = 'kuryr-cni-daemon: ops'


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


class OpsHandler(http.server.BaseHTTPRequestHandler):
    server_version = 'kuryr-cni'
    sys_version = ''
    timeout = 10

    def do_GET(self):
        if self.path == '/metrics' and self.server.kind == 'metrics':
            return self._metrics()
        if self.path in ('/alive', '/ready') and self.server.kind == 'health':
            probe = self.path[1:]
            facts = health.judge(self.server.registry)
            facts['consecutive_failures'] = self.server.probes.record(probe, facts)
            return self._send(200 if facts[probe] else 503, json.dumps(facts).encode(),
                              'application/json')
        self._send(404, b'not found\n', 'text/plain')

    def _metrics(self):
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        self._send(200, generate_latest(self.server.metrics_registry), CONTENT_TYPE_LATEST)

    def _send(self, status, payload, content_type):
        self.send_response(status)
        self.send_header('Content-Type', content_type)
        self.send_header('Content-Length', str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, fmt, *args):
        LOG.debug('ops %s ' + fmt, self.path, *args)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, sock, kind, registry, metrics_registry=None):
        super().__init__(sock.getsockname()[:2], OpsHandler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock          # bound and listening in the parent
        self.kind = kind
        self.registry = registry
        self.metrics_registry = metrics_registry
        self.probes = ProbeLog()


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
        self.socks = (health_sock, metrics_sock)
        self.drain_timeout = drain_timeout
        self.servers = []

    def run(self):
        from prometheus_client import CollectorRegistry
        from prometheus_client import multiprocess
        setproctitle.setproctitle(TITLE)
        metrics_registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(metrics_registry)
        metrics_registry.register(collector.ScrapeCollector(self.registry, self.state_dir))
        health_sock, metrics_sock = self.socks
        self.servers = [_Server(health_sock, 'health', self.registry),
                        _Server(metrics_sock, 'metrics', self.registry, metrics_registry)]
        threading.Thread(target=self.servers[0].serve_forever, daemon=True).start()
        self.servers[1].serve_forever()

    def terminate(self):
        health.wait_for_cni_workers_to_exit(self.registry, self.drain_timeout)
        for srv in self.servers:
            srv.shutdown()
