"""The ops process: ``/metrics`` for Prometheus and ``/alive`` ``/ready`` for probes.

Semantics (documented for operators in doc/source/operations.rst):

* ``/alive`` is 200 while the registry Manager answers and at least one CNI
  worker process lives; 503 otherwise (restart the daemon).
* ``/ready`` is 200 when, in addition, the watcher has synced with the API
  server and the daemon is not shutting down; 503 otherwise (do not schedule).

Both answer a small JSON document with the facts they judged. prometheus_client
is imported inside functions: it must not be imported before
:func:`kuryr_cni.metrics.setup` has chosen multiprocess mode.
"""

import http.server
import json
import os
import threading

import cotyledon
import setproctitle
from oslo_log import log as logging

LOG = logging.getLogger(__name__)

TITLE = 'kuryr-cni-daemon: ops'


def health(registry):
    """Judge the daemon's health from the registry: returns a dict of facts."""
    try:
        status = registry.status.snapshot()
    except (ConnectionError, EOFError, OSError):
        return {'alive': False, 'ready': False, 'registry': False}
    workers = [pid for key, pid in status.items()
               if key.startswith('pid:cni-worker:') and _running(pid)]
    alive = bool(workers)
    ready = (alive and bool(status.get('watcher_synced'))
             and not status.get('shutting_down'))
    return {'alive': alive, 'ready': ready, 'registry': True, 'workers': len(workers),
            'watcher_synced': bool(status.get('watcher_synced')),
            'shutting_down': bool(status.get('shutting_down'))}


def _running(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


class _RegistryCollector:
    """Values that live in the registry rather than in a counter."""

    def __init__(self, registry):
        self.registry = registry

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily
        facts = health(self.registry)
        yield GaugeMetricFamily('kuryr_cni_ready', 'Whether the daemon is ready (1) or not (0).',
                                value=int(facts['ready']))
        try:
            count = self.registry.bindings.count_attachments()
        except (ConnectionError, EOFError, OSError):
            return
        yield GaugeMetricFamily('kuryr_cni_attachments',
                                'Pod interface attachments recorded on this node.', value=count)


class OpsHandler(http.server.BaseHTTPRequestHandler):
    server_version = 'kuryr-cni'
    sys_version = ''
    timeout = 10

    def do_GET(self):
        if self.path == '/metrics' and self.server.kind == 'metrics':
            return self._metrics()
        if self.path in ('/alive', '/ready') and self.server.kind == 'health':
            facts = health(self.server.registry)
            ok = facts[self.path[1:]]
            return self._send(200 if ok else 503, json.dumps(facts).encode(), 'application/json')
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


class OpsService(cotyledon.Service):
    """Serves the health and metrics sockets the parent opened until terminated."""

    name = 'ops'

    def __init__(self, worker_id, registry, health_sock, metrics_sock):
        super().__init__(worker_id)
        self.registry = registry
        self.socks = (health_sock, metrics_sock)
        self.servers = []

    def run(self):
        from prometheus_client import CollectorRegistry
        from prometheus_client import multiprocess
        setproctitle.setproctitle(TITLE)
        metrics_registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(metrics_registry)
        metrics_registry.register(_RegistryCollector(self.registry))
        health_sock, metrics_sock = self.socks
        self.servers = [_Server(health_sock, 'health', self.registry),
                        _Server(metrics_sock, 'metrics', self.registry, metrics_registry)]
        threading.Thread(target=self.servers[0].serve_forever, daemon=True).start()
        self.servers[1].serve_forever()

    def terminate(self):
        for srv in self.servers:
            srv.shutdown()
