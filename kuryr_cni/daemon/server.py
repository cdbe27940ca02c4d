"""A bounded, threaded HTTP/1.1 server on an already listening socket.

Every worker process serves the one socket its parent opened (a pre-forked
pool). A worker takes a connection only when it has a free slot, so a busy
worker leaves new connections in the backlog for its siblings, and at most
``concurrency`` requests run in one worker. Each connection gets a socket
timeout, so a client that connects and sends nothing cannot hold a slot.
"""

import concurrent.futures
import contextlib
import http.server
import selectors
import socket
import threading
import time

from oslo_log import log as logging

LOG = logging.getLogger(__name__)


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """Base handler: HTTP/1.1, one request per connection, logs through oslo.log."""

    protocol_version = 'HTTP/1.1'
    server_version = 'kuryr-cni'
    sys_version = ''
    timeout = 10          # seconds per receive/send on the connection
    read_deadline = 15    # seconds to receive the whole request, however it trickles in

    def setup(self):
        super().setup()
        # The server's context may set it ([cni_daemon] client_timeout).
        self.read_deadline = self.server.context.get('read_deadline') or self.read_deadline
        self.server.read_deadlines.watch(self, time.monotonic() + self.read_deadline)

    def _abort_read(self):
        LOG.info('Dropping a client that did not send its request within %ss', self.read_deadline)
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def request_received(self):
        """Call once the whole request is read: from here on the work may take long."""
        self.server.read_deadlines.release(self)

    def finish(self):
        self.server.read_deadlines.release(self)
        super().finish()

    def log_message(self, fmt, *args):
        LOG.debug('%s %s', self.requestline, fmt % args)

    def log_error(self, fmt, *args):
        LOG.info('Bad HTTP request: ' + fmt, *args)

    def send_json(self, status, payload_bytes, content_type='application/json'):
        self.send_response(status)
        self.send_header('Content-Type', content_type)
        self.send_header('Content-Length', str(len(payload_bytes)))
        self.send_header('Connection', 'close')
        self.end_headers()
        if payload_bytes:
            self.wfile.write(payload_bytes)
        self.close_connection = True


class ReadDeadlines:
    """Drops the clients whose request is not in by its deadline, from one thread.

    One thread per server instead of a timer thread per connection: starting
    and cancelling a timer cost ~0.2 ms of CPU per request. Handlers are
    watched from :meth:`QuietHandler.setup` until their request is read (or
    the connection ends); an expired one gets ``_abort_read()`` called.
    """

    def __init__(self):
        self._due = {}      # handler -> time.monotonic() by which its request must be in
        self._changed = threading.Condition()
        self._thread = None
        self._sleeping_until = None     # the watcher's wake-up time; None: until notified
        self._stopped = False

    def watch(self, handler, deadline):
        with self._changed:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name='read-deadlines',
                                                daemon=True)
                self._thread.start()
            self._due[handler] = deadline
            # Only an earlier deadline needs the watcher awake (waking it costs CPU).
            if self._sleeping_until is None or deadline < self._sleeping_until:
                self._changed.notify()

    def release(self, handler):
        with self._changed:
            self._due.pop(handler, None)

    def stop(self):
        with self._changed:
            self._stopped = True
            self._changed.notify()

    def _run(self):
        while True:
            with self._changed:
                if self._stopped:
                    return
                now = time.monotonic()
                expired = [handler for handler, due in self._due.items() if due <= now]
                for handler in expired:
                    del self._due[handler]
                if not expired:
                    self._sleeping_until = min(self._due.values()) if self._due else None
                    self._changed.wait(None if self._sleeping_until is None
                                       else self._sleeping_until - now)
                    continue
            for handler in expired:
                handler._abort_read()


class BoundedServer:
    """Accept connections from ``sock`` and serve each in a thread, ``concurrency`` at most."""

    def __init__(self, sock, handler_class, concurrency, **handler_context):
        self.sock = sock
        self.handler_class = handler_class
        self.context = handler_context
        self._slots = threading.BoundedSemaphore(concurrency)
        # Request threads are kept and reused (made as needed, ``concurrency`` at
        # most): a new thread per request would also open a new connection to the
        # registry Manager (its proxies connect once per thread), ~0.5 ms each.
        self._pool = concurrent.futures.ThreadPoolExecutor(concurrency,
                                                           thread_name_prefix='request')
        self._concurrency = concurrency
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._idle = threading.Condition()
        self._active = 0
        self.read_deadlines = ReadDeadlines()

    def serve_forever(self, tick=None, tick_interval=None):
        """Serve until :meth:`stop`; call ``tick()`` every ``tick_interval`` s at most.

        ``tick`` runs on this loop's own thread (a heartbeat): it stops being
        called when the loop stops turning.
        """
        self.sock.setblocking(False)
        with selectors.DefaultSelector() as selector:
            selector.register(self.sock, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while not self._stopping.is_set():
                if tick is not None:
                    tick()
                if not self._slots.acquire(timeout=tick_interval):
                    continue          # every slot busy: time to tick again
                if not self._accept_one(selector, tick_interval):
                    self._slots.release()

    def _accept_one(self, selector, timeout=None):
        events = selector.select(timeout)
        if self._stopping.is_set() or not any(key.fileobj is self.sock for key, _ in events):
            return False
        try:
            conn, address = self.sock.accept()
        except (BlockingIOError, InterruptedError):
            return False      # a sibling worker took it
        conn.setblocking(True)
        with self._idle:
            self._active += 1
        self._pool.submit(self._serve, conn, address)
        return True

    def _serve(self, conn, address):
        try:
            self.handler_class(conn, address, self)
        except Exception:
            LOG.exception('Unexpected error serving a connection')
        finally:
            try:
                conn.close()
            finally:
                self._slots.release()
                with self._idle:
                    self._active -= 1
                    self._idle.notify_all()

    def stop(self, drain_timeout):
        """Stop accepting; wait up to ``drain_timeout`` s for requests in flight."""
        self._stopping.set()
        self._wake_w.send(b'x')
        with self._idle:
            drained = self._idle.wait_for(lambda: self._active == 0, timeout=drain_timeout)
        self.read_deadlines.stop()
        return drained

    @property
    def active(self):
        return self._active
