"""A plain-HTTP stand-in for the API server's discovery: any GET gets an APIVersions."""

import http.server


class APIVersions(http.server.BaseHTTPRequestHandler):
    """The handler; a subclass with ``seen``, a list, keeps each request's Authorization."""

    protocol_version = 'HTTP/1.0'       # one connection per request
    seen = None

    def do_GET(self):
        if self.seen is not None:
            self.seen.append(self.headers.get('Authorization'))
        body = b'{"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}'
        self.send_response(200)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass
