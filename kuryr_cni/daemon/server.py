"""A bounded HTTP/1.1 server: one selector loop reads and writes, a fixed pool answers.

The CNI workers serve the unix socket with it, the ops process the health and
metrics ports. Whatever clients do, it keeps its size and keeps serving:

* connections are read and written by one selector loop, never by a thread of
  their own, so a client that connects and trickles costs a buffer, not a
  thread;
* at most ``Limits.connections`` connections are being read or written at
  once; at that cap the loop drops the oldest connection whose request is not
  complete yet to make room, so a new client is always heard;
* the request head (request line and headers) must be in within
  ``Limits.head_timeout`` seconds of the accept, the whole request within
  ``Limits.request_timeout``, and the answer taken within
  ``Limits.write_timeout``; a client that misses its deadline is dropped;
* complete requests go to ``Limits.threads`` request threads, started once,
  the one idle the shortest first: each thread a request wakes keeps what it
  built (a netlink handle, a connection to the registry), so a quiet worker
  keeps a few threads warm rather than warming, and growing, all of them.
  The loop accepts only while one of them is free, so a busy worker leaves
  new connections in the backlog for its siblings sharing the socket.

One request per connection: every answer says ``Connection: close``. The
application answers complete requests (:meth:`App.answer`, on a request
thread) and says how to answer malformed or oversized ones
(:meth:`App.refuse`, on the loop). Dropped connections are counted by reason
(``kuryr_cni_connections_dropped_total``) and logged at most once a minute
per reason.
"""

import collections
import errno
import heapq
import http
import itertools
import queue
import select
import selectors
import socket
import threading
import time
import typing

from oslo_log import log as logging

from kuryr_cni import metrics

LOG = logging.getLogger(__name__)

_ACCEPT_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_RECV_SIZE = 65536


class Limits(typing.NamedTuple):
    threads: int               # requests answered at once
    connections: int           # connections being read or written at once
    head_timeout: float        # seconds from accept to the end of the request head
    request_timeout: float     # seconds from accept to the end of the body
    write_timeout: float = 10  # seconds for the client to take the answer
    max_head: int = 16 * 1024  # bytes of request line and headers
    max_body: int = 0          # bytes of body; larger: 413 unread


class Request(typing.NamedTuple):
    method: str
    path: str
    headers: dict              # lower-cased names
    body: bytes


class Response(typing.NamedTuple):
    status: int
    body: bytes = b''
    content_type: str = 'application/json'

    def encode(self):
        reason = http.HTTPStatus(self.status).phrase
        head = ('HTTP/1.1 %d %s\r\nServer: kuryr-cni\r\nContent-Type: %s\r\n'
                'Content-Length: %d\r\nConnection: close\r\n\r\n'
                % (self.status, reason, self.content_type, len(self.body)))
        return head.encode('ascii') + self.body


class App(typing.Protocol):
    def answer(self, request: Request) -> Response:
        """Answer a complete request (on a request thread; may take long)."""

    def refuse(self, status: int, message: str) -> Response:
        """The answer to a request that is malformed (400, 411, 431) or too large (413)."""


class _BadRequest(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class _Conn:
    """One accepted connection and where it stands: reading, answered, or writing."""

    __slots__ = ('sock', 'accepted', 'deadline', 'why', 'buf', 'scanned', 'head_end', 'head',
                 'out')

    def __init__(self, sock, now, limits):
        self.sock = sock
        self.accepted = now
        self.deadline = now + limits.head_timeout
        self.why = 'head_timeout'        # the drop reason when the deadline passes
        self.buf = bytearray()
        self.scanned = 0                 # bytes of buf known to hold no end of head
        self.head_end = None             # offset of the body in buf, once the head is in
        self.head = None                 # (method, path, headers, body length)
        self.out = None                  # bytes of the answer still to write


class DropLog:
    """Counts dropped connections by reason; one log line per reason a minute at most."""

    INTERVAL = 60

    def __init__(self, server):
        self.server = server
        self.counts = collections.Counter()
        self._since = {}        # reason -> (count not logged yet, last logged)

    def drop(self, reason, detail=''):
        self.counts[reason] += 1
        metrics.connection_dropped(self.server, reason)
        now = time.monotonic()
        unlogged, logged_at = self._since.get(reason, (0, None))
        if logged_at is None or now - logged_at >= self.INTERVAL:
            LOG.warning('%s server: dropped %d connection(s) (%s)%s',
                        self.server, unlogged + 1, reason, ': ' + detail if detail else '')
            self._since[reason] = (0, now)
        else:
            self._since[reason] = (unlogged + 1, logged_at)


class _Handoff:
    """Hands each request to the request thread that went idle last (a stack, not a queue)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._idle = []                         # mailboxes of idle threads, last in on top
        self._waiting = collections.deque()     # requests no idle thread was there for

    def put(self, item):
        with self._lock:
            if not self._idle:
                self._waiting.append(item)
                return
            mailbox = self._idle.pop()
        mailbox.put(item)

    def take(self, mailbox):
        """The next request for the thread owning ``mailbox`` (blocks while there is none)."""
        with self._lock:
            if self._waiting:
                return self._waiting.popleft()
            self._idle.append(mailbox)
        return mailbox.get()


class BoundedServer:
    """Serve ``sock`` (listening, maybe shared with sibling processes) for ``app``.

    ``admit(conn)``, when given, is asked about every accepted connection
    before anything is read from it: None admits it, ``(reason, detail)``
    closes it unanswered and counts it under ``reason``.
    """

    def __init__(self, sock, app, limits, name, admit=None):
        self.sock = sock
        self.app = app
        self.limits = limits
        self.name = name
        self.admit = admit
        self.drops = DropLog(name)
        self._reading = collections.OrderedDict()   # conn -> None, oldest accepted first
        self._writing = set()
        self._deadlines = []     # heap of (deadline, sequence, conn); stale entries skipped
        self._sequence = itertools.count()
        self._busy = 0           # requests handed to the request threads, not yet answered
        self._requests = _Handoff()
        self._answered = collections.deque()        # (conn, unsent bytes) from the threads
        self._threads = []
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stopping = False
        self._stopped = threading.Event()
        self._listening = False
        self._accept_paused_until = 0.0     # set when out of file descriptors
        self._reported_open = None
        self.saturated = False

    # The loop ---------------------------------------------------------------------

    def serve_forever(self, tick=None, tick_interval=None):
        """Serve until :meth:`stop` and every request in flight is answered.

        ``tick()`` is called on this loop's thread at the end of every turn,
        at least every ``tick_interval`` s: a heartbeat, which stops when the
        loop stops turning, and the moment to read :attr:`saturated` and
        :attr:`connections`.
        """
        self.sock.setblocking(False)
        metrics.connections_limit(self.name, self.limits.connections)
        self._threads = [threading.Thread(target=self._answer_requests, daemon=True,
                                          name='%s-request-%d' % (self.name, i))
                         for i in range(self.limits.threads)]
        for thread in self._threads:
            thread.start()
        with selectors.DefaultSelector() as self._selector:
            self._selector.register(self._wake_r, selectors.EVENT_READ)
            try:
                while not (self._stopping and self._idle()):
                    self._turn(tick_interval)
                    if tick is not None:
                        tick()
            finally:
                for conn in list(self._reading) + list(self._writing):
                    self._close(conn)
                for _ in self._threads:
                    self._requests.put(None)
                self._stopped.set()

    def _turn(self, tick_interval):
        self._listen(self._may_accept())
        for key, events in self._selector.select(self._timeout(tick_interval)):
            if key.fileobj is self._wake_r:
                self._drain_wakes()
            elif key.fileobj is self.sock:
                self._accept()
            elif events & selectors.EVENT_WRITE:
                self._write(key.data)
            else:
                self._read(key.data)
        self._take_answered()
        self._expire(time.monotonic())
        self._report()

    def _may_accept(self):
        if self._accept_paused_until and time.monotonic() >= self._accept_paused_until:
            self._accept_paused_until = 0.0
        return (not self._stopping and not self._accept_paused_until
                and self._busy < self.limits.threads
                and (self._open() < self.limits.connections or bool(self._reading)))

    def _listen(self, wanted):
        if wanted != self._listening:
            if wanted:
                self._selector.register(self.sock, selectors.EVENT_READ)
            else:
                self._selector.unregister(self.sock)
            self._listening = wanted

    def _timeout(self, tick_interval):
        timeout = tick_interval
        if self._accept_paused_until:
            timeout = _earliest(timeout, self._accept_paused_until - time.monotonic())
        while self._deadlines and self._deadlines[0][2].deadline != self._deadlines[0][0]:
            heapq.heappop(self._deadlines)      # the connection moved on or was closed
        if self._deadlines:
            timeout = _earliest(timeout, self._deadlines[0][0] - time.monotonic())
        return timeout

    def _open(self):
        return len(self._reading) + len(self._writing)

    @property
    def connections(self):
        """Connections being read or written now (those the cap counts)."""
        return self._open()

    def _idle(self):
        return self._busy == 0 and not self._open() and not self._answered

    # Accepting --------------------------------------------------------------------

    def _accept(self):
        """Accept as many connections as there are free request threads."""
        for _ in range(self.limits.threads - self._busy):
            try:
                sock, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return              # none left, or a sibling process took it
            except OSError as exc:
                if exc.errno not in _ACCEPT_ERRORS:
                    raise
                # Out of file descriptors (the kernel says so before looking
                # at the backlog, so only a waiting client counts): the fd
                # limit is a lower cap, met the same way; with nothing to
                # drop, the client waits in the backlog a while.
                if not self._pending():
                    return
                if not self._evict_oldest():
                    LOG.warning('%s server: cannot accept: %s', self.name, exc)
                    self._accept_paused_until = time.monotonic() + 1
                return
            if self._refused(sock):
                continue
            if self._open() >= self.limits.connections:
                self._evict_oldest()
            self._start(sock)

    def _pending(self):
        """Whether a client waits in the backlog (without accepting it)."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        return bool(poller.poll(0))

    def _refused(self, sock):
        refusal = self.admit(sock) if self.admit is not None else None
        if refusal is not None:
            sock.close()
            self.drops.drop(*refusal)
        return refusal is not None

    def _evict_oldest(self):
        """Drop the oldest connection whose request is incomplete; False if there is none."""
        if not self._reading:
            return False
        conn = next(iter(self._reading))
        self._close(conn)
        self.drops.drop('evicted', 'at the cap of %d connections' % self.limits.connections)
        return True

    def _start(self, sock):
        sock.setblocking(False)
        conn = _Conn(sock, time.monotonic(), self.limits)
        self._reading[conn] = None
        self._watch_deadline(conn)
        self._selector.register(sock, selectors.EVENT_READ, conn)
        self._read(conn)            # a client usually sends its request before we accept

    # Reading ----------------------------------------------------------------------

    def _read(self, conn):
        try:
            data = conn.sock.recv(_RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b''
        if not data:
            self._close(conn)           # the client gave up: nothing to answer
            return
        conn.buf += data
        try:
            request = self._parse(conn)
        except _BadRequest as exc:
            self._respond(conn, self.app.refuse(exc.status, str(exc)).encode())
            return
        if request is not None:
            self._hand_over(conn, request)

    def _parse(self, conn):
        """The complete request in ``conn.buf``, or None while it is incomplete."""
        if conn.head is None:
            end = conn.buf.find(b'\r\n\r\n', conn.scanned)
            if end < 0 and len(conn.buf) <= self.limits.max_head:
                conn.scanned = max(0, len(conn.buf) - 3)
                return None
            if end < 0 or end > self.limits.max_head:
                raise _BadRequest(431, 'request head larger than %d bytes'
                                  % self.limits.max_head)
            conn.head = _parse_head(bytes(conn.buf[:end]), self.limits.max_body)
            conn.head_end = end + 4
            conn.deadline = conn.accepted + self.limits.request_timeout
            conn.why = 'request_timeout'
            self._watch_deadline(conn)
        method, path, headers, length = conn.head
        if len(conn.buf) - conn.head_end < length:
            return None
        body = bytes(conn.buf[conn.head_end:conn.head_end + length])
        return Request(method, path, headers, body)

    def _hand_over(self, conn, request):
        del self._reading[conn]
        self._selector.unregister(conn.sock)
        conn.deadline = None
        conn.buf = None
        self._busy += 1
        self._requests.put((conn, request))

    # Answering (on the request threads) -------------------------------------------

    def _answer_requests(self):
        mailbox = queue.SimpleQueue()
        while (item := self._requests.take(mailbox)) is not None:
            conn, request = item
            try:
                response = self.app.answer(request)
            except Exception:
                LOG.exception('Unexpected error answering %s %s', request.method, request.path)
                response = Response(500, b'internal error\n', 'text/plain')
            data = response.encode()
            self._answered.append((conn, data[_send_some(conn.sock, data):]))
            self._wake()

    def _wake(self):
        try:
            self._wake_w.send(b'\0')
        except (BlockingIOError, InterruptedError):
            pass                        # the loop has wake-ups pending already

    def _drain_wakes(self):
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _take_answered(self):
        while self._answered:
            conn, rest = self._answered.popleft()
            self._busy -= 1
            self._write_rest(conn, rest)

    # Writing ----------------------------------------------------------------------

    def _respond(self, conn, data):
        """Answer from the loop (a refusal)."""
        del self._reading[conn]
        self._selector.unregister(conn.sock)
        self._write_rest(conn, data[_send_some(conn.sock, data):])

    def _write_rest(self, conn, rest):
        """Close a connection whose answer is sent; else write the rest as the client reads."""
        if not rest:
            conn.sock.close()
            return
        conn.out = memoryview(rest)
        conn.deadline = time.monotonic() + self.limits.write_timeout
        conn.why = 'write_timeout'
        self._writing.add(conn)
        self._watch_deadline(conn)
        self._selector.register(conn.sock, selectors.EVENT_WRITE, conn)

    def _write(self, conn):
        conn.out = conn.out[_send_some(conn.sock, conn.out):]
        if not conn.out:
            self._close(conn)

    # Deadlines, closing, reporting ------------------------------------------------

    def _watch_deadline(self, conn):
        heapq.heappush(self._deadlines, (conn.deadline, next(self._sequence), conn))

    def _expire(self, now):
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, _, conn = heapq.heappop(self._deadlines)
            if conn.deadline == deadline:
                self._close(conn)
                self.drops.drop(conn.why)

    def _close(self, conn):
        conn.deadline = None
        if conn in self._reading:
            del self._reading[conn]
        self._writing.discard(conn)
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _report(self):
        """Publish the open connections, and whether the cap is reached.

        Saturated from the moment the cap is reached until the connections
        fall below seven eighths of it, so a flood at the cap does not make
        the flag (and the registry write behind it) flap at every turn.
        """
        count = self._open()
        if count != self._reported_open:
            metrics.connections_open(self.name, count)
            self._reported_open = count
        cap = self.limits.connections
        if count >= cap:
            self.saturated = True
        elif count < cap - max(1, cap // 8):
            self.saturated = False

    # Control (from other threads) -------------------------------------------------

    def stop(self, drain_timeout):
        """Stop accepting; wait up to ``drain_timeout`` s for requests in flight.

        Returns whether everything was answered in time.
        """
        self._stopping = True
        self._wake()
        return not self._threads or self._stopped.wait(drain_timeout)

    @property
    def active(self):
        """Requests being answered now."""
        return self._busy


def _send_some(sock, data):
    """Bytes of ``data`` sent without waiting; all of them when the client is gone."""
    try:
        return sock.send(data)
    except (BlockingIOError, InterruptedError):
        return 0
    except OSError:
        return len(data)


def _earliest(timeout, due):
    due = max(0.0, due)
    return due if timeout is None else min(timeout, due)


def _parse_head(head, max_body):
    """``(method, path, headers, body length)`` of a request head, or _BadRequest."""
    try:
        lines = head.decode('latin-1').split('\r\n')
        method, path, version = lines[0].split(' ')
    except ValueError:
        raise _BadRequest(400, 'malformed request line') from None
    if not version.startswith('HTTP/1.'):
        raise _BadRequest(400, 'unsupported protocol %s' % version[:20])
    headers = {}
    for line in lines[1:]:
        name, colon, value = line.partition(':')
        if not colon or not name or name != name.strip():
            raise _BadRequest(400, 'malformed header line')
        headers[name.lower()] = value.strip()
    if 'transfer-encoding' in headers:
        raise _BadRequest(411, 'Content-Length is required (no chunked bodies)')
    length = headers.get('content-length')
    if length is None:
        if method == 'POST':
            raise _BadRequest(411, 'Content-Length is required')
        return method, path, headers, 0
    if not length.isdigit():
        raise _BadRequest(400, 'invalid Content-Length')
    if int(length) > max_body:
        raise _BadRequest(413, 'request body larger than %d bytes' % max_body)
    return method, path, headers, int(length)
