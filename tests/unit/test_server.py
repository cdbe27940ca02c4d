"""The bounded server of the CNI workers and the ops process (issue 13, items 2 and 7).

Real unix sockets and a real server loop on a thread of this process; the
application is a small echo. The tests learn what the loop did from its own
tick, called at the end of every turn (:class:`Watch`), never by sleeping.
"""

import contextlib
import json
import logging
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading

import pytest

from kuryr_cni.daemon import listener
from kuryr_cni.daemon import server

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GET = b'GET /echo HTTP/1.1\r\nHost: k\r\n\r\n'
WAIT = 10       # seconds any single step may take before the test fails


class EchoApp:
    """Answers with what it was asked; ``/hold`` waits for ``release`` first."""

    def __init__(self, body=b''):
        self.body = body
        self.release = threading.Event()
        self.holding = threading.Event()
        self.answered = []

    def answer(self, request):
        if request.path == '/hold':
            self.holding.set()
            assert self.release.wait(WAIT)
        self.answered.append(request.path)
        payload = self.body or json.dumps({'method': request.method, 'path': request.path,
                                           'body': request.body.decode()}).encode()
        return server.Response(200, payload)

    def refuse(self, status, message):
        return server.Response(status, message.encode(), 'text/plain')


class Watch:
    """Conditions on the server, checked by its tick at the end of every loop turn."""

    def __init__(self):
        self._waits = []
        self._lock = threading.Lock()
        self.ticks = 0

    def tick(self):
        self.ticks += 1
        with self._lock:
            for predicate, event in self._waits:
                if predicate():
                    event.set()

    def until(self, predicate, what):
        event = threading.Event()
        with self._lock:
            self._waits.append((predicate, event))
        assert event.wait(WAIT), 'the server never reached: %s' % what


class Served:
    """A server on a unix socket in a temporary directory, run by :meth:`start`.

    Clients may connect before it starts: the backlog keeps their order.
    """

    def __init__(self, path, app, admit=None, **limits):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(64)
        options = dict(threads=2, connections=16, head_timeout=WAIT, request_timeout=WAIT,
                       max_body=1024)
        options.update(limits)
        self.srv = server.BoundedServer(self.sock, app, server.Limits(**options), 'test',
                                        admit=admit)
        self.watch = Watch()
        self.thread = threading.Thread(target=self.srv.serve_forever,
                                       args=(self.watch.tick, 0.05), daemon=True)

    def start(self):
        self.thread.start()
        return self

    def connect(self, data=b''):
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.settimeout(WAIT)
        client.connect(self.path)
        if data:
            client.sendall(data)
        return client

    def until(self, predicate, what):
        self.watch.until(lambda: predicate(self.srv), what)

    def close(self):
        if self.thread.ident is not None:
            assert self.srv.stop(drain_timeout=WAIT)
            self.thread.join(WAIT)
            assert not self.thread.is_alive()
        self.sock.close()


@pytest.fixture
def serve(tmp_path):
    """``serve(app, admit=None, **limits)`` -> a :class:`Served`, stopped afterwards."""
    made = []

    def make(app, admit=None, **limits):
        made.append(Served(str(tmp_path / ('s%d' % len(made))), app, admit, **limits))
        return made[-1]

    yield make
    for served in made:
        served.close()


def response(client):
    """``(status, body)`` of the answer, read until the server closes."""
    data = b''
    while chunk := client.recv(65536):
        data += chunk
    client.close()
    head, _, body = data.partition(b'\r\n\r\n')
    assert b'\r\nConnection: close\r\n' in head + b'\r\n'
    return int(head.split()[1]), body


def closed_unanswered(client):
    with client:
        try:
            return client.recv(100) == b''
        except ConnectionResetError:
            return True


def still_open(client):
    client.setblocking(False)
    try:
        client.recv(100)
    except BlockingIOError:
        return True
    finally:
        client.settimeout(WAIT)
    return False


def test_a_request_is_answered_and_the_connection_closed(serve):
    served = serve(EchoApp()).start()
    status, body = response(served.connect(b'POST /x HTTP/1.1\r\nHost: k\r\n'
                                           b'Content-Length: 5\r\n\r\nhello'))
    assert (status, json.loads(body)) == (200, {'method': 'POST', 'path': '/x', 'body': 'hello'})
    status, body = response(served.connect(b'GET /y HTTP/1.0\r\n\r\n'))
    assert (status, json.loads(body)['path']) == (200, '/y')


@pytest.mark.parametrize('data, status', [
    (b'GARBAGE\r\n\r\n', 400),
    (b'GET / SPDY/3\r\n\r\n', 400),
    (b'GET / HTTP/1.1\r\n folded: header\r\n\r\n', 400),
    (b'POST / HTTP/1.1\r\nHost: k\r\n\r\n', 411),
    (b'POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n', 411),
    (b'POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n', 400),
    (b'POST / HTTP/1.1\r\nContent-Length: 1025\r\n\r\n{', 413),
    (b'GET / HTTP/1.1\r\nX: ' + b'a' * 2000 + b'\r\n\r\n', 431),
    (b'GET / HTTP/1.1\r\nX: ' + b'a' * 2000, 431),
])
def test_a_malformed_or_oversized_request_gets_the_apps_refusal(serve, data, status):
    app = EchoApp()
    served = serve(app, max_head=1024).start()
    assert response(served.connect(data))[0] == status
    assert app.answered == []


def test_clients_late_with_their_request_are_dropped_by_reason(serve):
    app = EchoApp()
    served = serve(app, head_timeout=0.2, request_timeout=0.4)
    silent = served.connect()
    half_head = served.connect(b'GET /echo HTTP/1.1\r\nHo')
    half_body = served.connect(b'POST /x HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc')
    served.start()
    assert response(served.connect(GET))[0] == 200
    assert all(closed_unanswered(c) for c in (silent, half_head, half_body))
    served.until(lambda srv: srv.connections == 0, 'every connection closed')
    assert served.srv.drops.counts == {'head_timeout': 2, 'request_timeout': 1}
    assert app.answered == ['/echo']


def test_slow_clients_hold_no_request_thread(serve):
    # One request thread, and ten clients that send half a head and stop.
    served = serve(EchoApp(), threads=1)
    slow = [served.connect(b'GET /echo HT') for _ in range(10)]
    served.start()
    served.until(lambda srv: srv.connections == 10, 'ten slow clients accepted')
    assert response(served.connect(GET))[0] == 200
    assert all(still_open(c) for c in slow)
    for client in slow:
        client.close()
    served.until(lambda srv: srv.connections == 0, 'the slow clients gone')
    assert served.srv.drops.counts == {}


def test_at_the_cap_the_oldest_incomplete_connection_makes_room(serve):
    served = serve(EchoApp(), connections=3)
    oldest, second, third = (served.connect() for _ in range(3))
    newest = served.connect(GET)      # accepted after the three, in backlog order
    served.start()
    assert response(newest)[0] == 200
    assert closed_unanswered(oldest)
    assert still_open(second) and still_open(third)
    assert served.srv.drops.counts == {'evicted': 1}
    second.close()
    third.close()


def test_saturated_from_the_cap_until_seven_eighths_of_it(serve):
    served = serve(EchoApp(), connections=8).start()
    clients = [served.connect() for _ in range(8)]
    served.until(lambda srv: srv.saturated and srv.connections == 8, 'saturated at the cap')
    clients.pop().close()
    served.until(lambda srv: srv.connections == 7, 'seven connections')
    assert served.srv.saturated
    clients.pop().close()
    served.until(lambda srv: srv.connections == 6, 'six connections')
    assert not served.srv.saturated
    for client in clients:
        client.close()


def test_an_answer_not_taken_in_time_is_dropped_and_frees_the_thread(serve):
    # Far more than the socket buffers hold, to a client that never reads.
    served = serve(EchoApp(body=b'x' * (8 << 20)), threads=1, write_timeout=0.3).start()
    with served.connect(GET):
        served.until(lambda srv: srv.drops.counts['write_timeout'] == 1, 'the answer dropped')
    assert response(served.connect(GET))[0] == 200
    assert served.srv.drops.counts == {'write_timeout': 1}


def test_a_refused_peer_is_closed_unanswered_before_anything_is_read(serve):
    app = EchoApp()
    served = serve(app, admit=lambda conn: ('peer_uid', 'not root')).start()
    client = served.connect()
    try:
        client.sendall(b'POST /delNetwork HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}')
    except (BrokenPipeError, ConnectionResetError):
        pass                # closed before the request even went out: refused all the same
    assert closed_unanswered(client)
    served.until(lambda srv: srv.drops.counts['peer_uid'] == 1, 'the peer refused')
    assert app.answered == [] and served.srv.connections == 0


def test_root_peers_are_admitted_and_others_refused():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        refusal = listener.refuse_non_root(ours)
    if os.geteuid() == 0:
        assert refusal is None
    else:
        assert refusal == ('peer_uid', 'peer uid %d (pid %d) is not root'
                           % (os.geteuid(), os.getpid()))


def test_stop_answers_the_requests_in_flight_then_accepts_no_more(serve):
    app = EchoApp()
    served = serve(app).start()
    held = served.connect(b'GET /hold HTTP/1.1\r\n\r\n')
    assert app.holding.wait(WAIT)
    stopped = []
    stopper = threading.Thread(target=lambda: stopped.append(served.srv.stop(WAIT)))
    stopper.start()
    app.release.set()
    assert response(held)[0] == 200
    stopper.join(WAIT)
    assert stopped == [True]
    with served.connect(GET):
        late, _ = served.sock.accept()      # left in the backlog: ours to take
        late.close()
    assert app.answered == ['/hold']


def test_the_loop_ticks_while_idle_and_ends_with_stop(serve):
    served = serve(EchoApp()).start()
    served.until(lambda srv: served.watch.ticks >= 3, 'three ticks')
    assert served.srv.stop(drain_timeout=WAIT)
    served.thread.join(WAIT)
    assert not served.thread.is_alive()


# Running out of file descriptors. The limit is per process and bounds
# descriptor numbers, and other tests leave threads behind that open some: these
# scenarios run alone, in a fresh interpreter.

def test_out_of_file_descriptors_the_oldest_incomplete_connection_makes_room():
    _run_alone('oldest_makes_room_for_a_descriptor')


def test_out_of_file_descriptors_with_nothing_to_drop_new_clients_wait():
    _run_alone('nothing_to_drop_for_a_descriptor')


def _run_alone(scenario):
    code = 'from tests.unit import test_server; test_server.%s()' % scenario
    proc = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def oldest_makes_room_for_a_descriptor():
    with _served_alone(EchoApp()) as served:
        first, second = served.connect(), served.connect()
        served.until(lambda srv: srv.connections == 2, 'two silent clients')
        # The newest client's end takes the last descriptor: the server's end
        # gets one only once an older connection is gone.
        with _one_more_descriptor():
            newest = served.connect(GET)
            served.until(lambda srv: srv.drops.counts['evicted'] == 1, 'the oldest dropped')
        assert response(newest)[0] == 200
        assert closed_unanswered(first)
        assert still_open(second)
        assert served.srv.drops.counts == {'evicted': 1}
        second.close()


def nothing_to_drop_for_a_descriptor():
    logged = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger('kuryr_cni.daemon.server').addHandler(handler)
    with _served_alone(EchoApp()) as served:
        with _one_more_descriptor():
            waiting = served.connect(GET)       # the last descriptor: none for the server
            served.until(lambda srv: any('cannot accept' in m for m in logged),
                         'accepting paused')
        assert response(waiting)[0] == 200      # once the pause is over
        turns = served.watch.ticks
        threading.Event().wait(0.5)             # a window to count turns in, not a wait
        # Idle again: a turn per 0.05 s tick, not a spin.
        assert served.watch.ticks - turns < 50
        assert served.srv.drops.counts == {}


@contextlib.contextmanager
def _served_alone(app):
    with tempfile.TemporaryDirectory() as directory:
        served = Served(os.path.join(directory, 's'), app).start()
        try:
            served.until(lambda srv: served.watch.ticks >= 1, 'the loop turning')
            yield served
        finally:
            served.close()


@contextlib.contextmanager
def _one_more_descriptor():
    """Let this process open exactly one more file descriptor, meanwhile.

    The limit bounds descriptor numbers, not their count: every free number
    below the highest one in use is taken first.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(fd) for fd in os.listdir('/proc/self/fd'))
    fillers = []
    while (fd := os.dup(0)) <= highest:
        fillers.append(fd)
    os.close(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, (fd + 1, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for filler in fillers:
            os.close(filler)
