"""A stand-in daemon that answers every shim request at once, for one bench phase.

It measures the shim alone: with the daemon's work taken away, what is left
of an operation's CPU is what any daemon behind this shim builds on (the
exec, the shim's own code, the socket round trip). ADD gets a fixed
result of the size and shape the real daemon sends, every other call 204.
"""

import http.server
import json
import os
import socketserver
import threading

RESULT = json.dumps({
    'cniVersion': '1.0.0',
    'interfaces': [{'name': 'eth0', 'mac': 'fa:16:3e:00:00:02',
                    'sandbox': '/run/netns/kc-bench-stub'}],
    'ips': [{'address': '10.10.0.2/16', 'gateway': '10.10.0.1', 'interface': 0}],
    'routes': [{'dst': '0.0.0.0/0', 'gw': '10.10.0.1'}],
}).encode()
MAX_BODY = 1024 * 1024


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    timeout = 30

    def do_POST(self):
        length = int(self.headers.get('Content-Length') or 0)
        self.rfile.read(min(length, MAX_BODY))
        if self.path == '/addNetwork':
            self.send_response(200)
            self.send_header('Content-Type', 'application/json')
            self.send_header('Content-Length', str(len(RESULT)))
            self.end_headers()
            self.wfile.write(RESULT)
        else:
            self.send_response(204)
            self.end_headers()
        self.close_connection = True

    def log_message(self, *args):
        pass


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = 256     # a burst of shims, not the default 5


class StubDaemon:
    """Serve ``path`` from a background thread until :meth:`close`."""

    def __init__(self, path):
        self.path = path
        self._server = _Server(path, _Handler)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name='bench-stub-daemon', daemon=True)
        self._thread.start()

    def close(self):
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
        os.unlink(self.path)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
