"""Kubernetes API servers that misbehave on purpose, for the watcher's bounds (issue 20).

Each speaks just enough HTTP/1.1 for the official client to send its list
and watch and read the answer, and then misbehaves in one way (``BEHAVIOURS``).
None sends more than ``ceiling`` bytes in one answer, so that a watcher
without bounds (main before issue 20) grows by that much, measurably, rather
than until the machine runs out of memory. Every answer waits for
:attr:`HostileAPI.go`, so a test can measure the watcher before it reads
anything.
"""

import json
import socket
import threading
import urllib.parse

NODE = 'node-1'
CEILING = 256 * 1024 * 1024     # bytes of one answer at most, whatever the behaviour
GATE_TIMEOUT = 120
SEND_TIMEOUT = 30
PIECE = 1024 * 1024             # bytes sent at a time in the fast streams

LIST_HEAD = b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":['


def pod(index, rv=1, annotations=None):
    """A small, valid pod of the node, as JSON bytes."""
    meta = {'name': 'pod-%d' % index, 'namespace': 'default', 'uid': 'uid-%d' % index,
            'resourceVersion': str(rv)}
    if annotations:
        meta['annotations'] = annotations
    return json.dumps({'metadata': meta, 'spec': {'nodeName': NODE}},
                      separators=(',', ':')).encode()


def _repeat(piece, size=PIECE):
    return piece * max(1, size // len(piece))


class HostileAPI:
    """Serves ``behaviour`` on the listening socket ``sock`` until :meth:`close`.

    Behaviours:

    - ``endless-list``: a pod list whose ``items`` never end, streamed fast
      (objects without a node, as in the issue's report);
    - ``trickling-list``: a valid list head, then one byte every half second;
    - ``endless-watch``: a valid one-pod list, then a watch of MODIFIED
      events of that pod, streamed fast, for ever;
    - ``malformed``: a list that is not JSON;
    - ``huge-object``: a list whose one pod has an annotation never ending;
    - ``many-pods``: a valid list of 100,000 pods of the node;
    - ``echo-auth``: errors (401, 403, 500 in turn) whose message, and a
      watch event, quote the request's ``Authorization`` header, as a
      careless proxy might.

    Whatever the behaviour, a TLS client hello is answered with plain HTTP,
    which fails the handshake.
    """

    BEHAVIOURS = ('endless-list', 'trickling-list', 'endless-watch', 'malformed',
                  'huge-object', 'many-pods', 'echo-auth')
    ECHOED = (401, 'Unauthorized'), (403, 'Forbidden'), (500, 'Internal Server Error')

    def __init__(self, sock, behaviour, ceiling=CEILING):
        assert behaviour in self.BEHAVIOURS, behaviour
        self.sock = sock
        self.behaviour = behaviour
        self.ceiling = ceiling
        self.go = threading.Event()
        self.requests = []              # (is_watch, path with query), in arrival order
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._threads = []
        self.sock.settimeout(0.2)
        self.port = sock.getsockname()[1]
        self.url = 'http://127.0.0.1:%d' % self.port
        self._accept = threading.Thread(target=self._accept_loop, daemon=True)
        self._accept.start()

    def lists(self):
        with self._lock:
            return sum(1 for watch, _ in self.requests if not watch)

    def watches(self):
        with self._lock:
            return sum(1 for watch, _ in self.requests if watch)

    def close(self):
        self._closing.set()
        self.go.set()
        self._accept.join(5)
        for thread in self._threads:
            thread.join(5)
        self.sock.close()

    # Serving -------------------------------------------------------------------

    def _accept_loop(self):
        while not self._closing.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn):
        conn.settimeout(SEND_TIMEOUT)
        with conn:
            try:
                head = b''
                while b'\r\n\r\n' not in head:
                    data = conn.recv(65536)
                    if not data:
                        return
                    head += data
                    if head.startswith(b'\x16'):       # a TLS client hello
                        conn.sendall(b'HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n')
                        with self._lock:
                            self.requests.append((False, 'TLS'))
                        return
                target = head.split(b' ', 2)[1].decode()
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query)
                watch = query.get('watch', ['false'])[0] in ('true', '1')
                with self._lock:
                    self.requests.append((watch, target))
                if not self.go.wait(GATE_TIMEOUT) or self._closing.is_set():
                    return
                if self.behaviour == 'echo-auth':
                    self._echo(conn, head, len(self.requests))
                    return
                self._answer(conn, watch)
            except OSError:
                return      # the watcher cut it: what is being tested

    def _echo(self, conn, head, count):
        authorization = ''
        for line in head.decode(errors='replace').split('\r\n'):
            name, _, value = line.partition(':')
            if name.lower() == 'authorization':
                authorization = value.strip()
        code, reason = self.ECHOED[count % len(self.ECHOED)]
        body = json.dumps({'kind': 'Status', 'apiVersion': 'v1', 'status': 'Failure',
                           'code': code, 'reason': reason,
                           'message': 'refused: Authorization: %s' % authorization}).encode()
        conn.sendall(b'HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n'
                     b'Content-Length: %d\r\nConnection: close\r\n\r\n%s'
                     % (code, reason.encode(), len(body), body))

    def _answer(self, conn, watch):
        conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n'
                     b'Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n')
        sent = 0
        for piece in getattr(self, '_' + self.behaviour.replace('-', '_'))(watch):
            if self._closing.is_set() or sent >= self.ceiling:
                return
            if piece is None:           # a pause of the trickle
                if self._closing.wait(0.5):
                    return
                continue
            conn.sendall(b'%x\r\n%s\r\n' % (len(piece), piece))
            sent += len(piece)
        conn.sendall(b'0\r\n\r\n')

    # The behaviours: each yields the pieces of one answer (None: pause) --------------

    def _endless_list(self, watch):
        yield LIST_HEAD
        item = _repeat(b'{"metadata":{"name":"x","namespace":"default","uid":"u",'
                       b'"resourceVersion":"1"}},')
        while True:
            yield item

    def _trickling_list(self, watch):
        yield LIST_HEAD
        for byte in pod(1) + b',' + pod(2):
            yield None
            yield bytes([byte])
        while True:
            yield None
            yield b' '

    def _endless_watch(self, watch):
        if not watch:
            yield LIST_HEAD + pod(1) + b']}'
            return
        event = b'{"type":"MODIFIED","object":%s}\n' % pod(1, rv=2)
        chunk = _repeat(event)
        while True:
            yield chunk

    def _malformed(self, watch):
        yield LIST_HEAD + pod(1) + b',{"metadata":{"name":]]}}'

    def _huge_object(self, watch):
        yield LIST_HEAD + pod(1)[:-1] + b',"x":{"annotations":{"a":"'
        filler = _repeat(b'a')
        while True:
            yield filler

    def _many_pods(self, watch):
        yield LIST_HEAD
        batch = []
        for index in range(100000):
            batch.append(pod(index))
            if len(batch) == 1000:
                yield b','.join(batch) + (b']}' if index == 99999 else b',')
                batch = []


def start(netns_path, behaviour, **kwargs):
    """A :class:`HostileAPI` listening on 127.0.0.1 inside the namespace ``netns_path``."""
    from kuryr_cni import netns
    sock = netns.socket_in(netns_path, socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(('127.0.0.1', 0))
    sock.listen(64)
    return HostileAPI(sock, behaviour, **kwargs)


def peak_rss_mib(pid):
    """``(VmHWM, VmRSS)`` of ``pid`` in MiB: its peak resident size so far, and now."""
    with open('/proc/%d/status' % pid) as f:
        fields = dict(line.split(':', 1) for line in f if ':' in line)
    return tuple(int(fields[k].split()[0]) / 1024 for k in ('VmHWM', 'VmRSS'))
