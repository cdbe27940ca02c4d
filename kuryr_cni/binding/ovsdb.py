"""A small OVSDB client (RFC 7047 JSON-RPC) with a deadline on every transaction.

The ``ovs`` driver needs three things of the ``Open_vSwitch`` database: read
a few rows, and add or remove one port in one atomic transaction. That is one
``transact`` request per call over a fresh connection to
``[binding] ovsdb_connection`` (``unix:<path>`` or ``tcp:<host>:<port>``),
bounded as a whole by a timeout: ``ovs-vsctl`` without ``--timeout`` waits
forever for a busy or dead ``ovsdb-server``, and so would the OVS IDL's
reconnecting loop. No schema is fetched and no cache kept; a connection costs
less than a millisecond on a unix socket.

Errors: an unreachable or silent server raises :class:`Unavailable`
(:class:`errors.TryAgainLater`, code 11); a transaction the server refuses
raises :class:`TransactionFailed` (:class:`errors.BindingFailed`), with the
server's error and details.
"""

import codecs
import json
import socket
import time

from kuryr_cni import errors
from kuryr_cni import netns

DATABASE = 'Open_vSwitch'
MAX_REPLY_CHARS = 16 * 1024 * 1024
WAIT_MARGIN = 2.0       # seconds the client gives a server-side wait beyond its own timeout


class Unavailable(errors.TryAgainLater):
    """OVSDB could not be reached, or did not answer in time."""


class TransactionFailed(errors.BindingFailed):
    """OVSDB refused a transaction (it was rolled back as a whole)."""


class Client:
    """Transactions against one OVSDB server.

    ``connection`` is ``unix:<path>`` or ``tcp:<host>:<port>`` (``[v6]:port``
    for IPv6); a TCP connection is made from ``host_netns`` (None: the
    daemon's own namespace). Stateless: safe to share between threads.
    """

    def __init__(self, connection, timeout=10.0, host_netns=None):
        self.connection = connection
        self.timeout = timeout
        self.host_netns = host_netns
        self._family, self._address = parse_connection(connection)

    def transact(self, *operations, timeout=None, on_connect=None):
        """Run ``operations`` (RFC 7047 §5.2 objects) atomically; return their results.

        Raises :class:`TransactionFailed` when any operation, or the commit,
        failed: the server then changed nothing. ``timeout`` and
        ``on_connect``: see :meth:`call`.
        """
        reply = self.call('transact', [DATABASE, *operations], timeout, on_connect)
        results = reply if isinstance(reply, list) else []
        failures = [r for r in results if isinstance(r, dict) and 'error' in r]
        if len(results) < len(operations) or failures:
            failure = failures[0] if failures else {'error': 'short reply %r' % (reply,)}
            raise TransactionFailed('OVSDB transaction on %s failed: %s'
                                    % (self.connection, failure['error']),
                                    failure.get('details') or '')
        return results

    def wait_for_row(self, table, where, timeout, on_connect=None):
        """Return once a row of ``table`` matches ``where``, within ``timeout`` seconds.

        One "wait" operation (RFC 7047 §5.2.6): the server holds the
        transaction and answers when a commit makes a row match, so nothing
        polls. No match in time raises :class:`Unavailable`. ``on_connect``:
        see :meth:`call` (how another thread ends the wait early).
        """
        try:
            self.transact({'op': 'wait', 'table': table, 'where': where, 'columns': ['_uuid'],
                           'until': '!=', 'rows': [], 'timeout': max(0, int(timeout * 1000))},
                          timeout=timeout + WAIT_MARGIN, on_connect=on_connect)
        except TransactionFailed as exc:
            if 'timed out' not in exc.msg:
                raise
            raise Unavailable('no %s row matched %s within %g s' % (table, where, timeout)) \
                from None

    def call(self, method, params, timeout=None, on_connect=None):
        """Send one JSON-RPC request and return its ``result`` within ``timeout`` seconds.

        ``timeout`` None is the client's. ``on_connect(sock)``, when given, is
        called with the connected socket: a ``shutdown`` of it from another
        thread ends the call at once (with :class:`Unavailable`).
        """
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        request = {'method': method, 'params': params, 'id': 0}
        with self._connect(deadline) as sock:
            if on_connect is not None:
                on_connect(sock)
            _send(sock, request, deadline, self.connection)
            for message in _messages(sock, deadline, self.connection):
                if message.get('method') == 'echo':
                    # The server's keepalive: it drops clients that do not answer.
                    _send(sock, {'result': message.get('params'), 'error': None,
                                 'id': message.get('id')}, deadline, self.connection)
                elif message.get('id') == 0 and 'method' not in message:
                    if message.get('error') is not None:
                        raise TransactionFailed('OVSDB %s on %s failed: %s'
                                                % (method, self.connection, message['error']))
                    return message.get('result')
        raise Unavailable('OVSDB at %s closed the connection before answering'
                          % self.connection)

    def _connect(self, deadline):
        try:
            sock = netns.socket_in(self.host_netns if self._family != socket.AF_UNIX else None,
                                   self._family, socket.SOCK_STREAM)
        except OSError as exc:
            raise Unavailable('cannot make a socket for OVSDB: %s' % exc) from None
        try:
            sock.settimeout(_remaining(deadline, self.connection))
            sock.connect(self._address)
        except (OSError, socket.timeout) as exc:
            sock.close()
            raise Unavailable('cannot reach OVSDB at %s: %s'
                              % (self.connection, exc.strerror or exc)) from None
        return sock


def parse_connection(connection):
    """``(address family, address)`` of an ``[binding] ovsdb_connection`` value."""
    kind, _, rest = (connection or '').partition(':')
    if kind == 'unix' and rest:
        return socket.AF_UNIX, rest
    if kind == 'tcp':
        host, sep, port = rest.rpartition(':')
        if sep and port.isdigit() and host:
            if host.startswith('[') and host.endswith(']'):
                return socket.AF_INET6, (host[1:-1], int(port))
            return socket.AF_INET, (host, int(port))
    raise errors.InvalidConfig('[binding] ovsdb_connection must be unix:<path> or '
                               'tcp:<host>:<port>, not %r' % connection)


def _remaining(deadline, connection):
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise Unavailable('OVSDB at %s did not answer in time' % connection)
    return remaining


def _send(sock, message, deadline, connection):
    try:
        sock.settimeout(_remaining(deadline, connection))
        sock.sendall(json.dumps(message).encode())
    except (OSError, socket.timeout) as exc:
        raise Unavailable('cannot send to OVSDB at %s: %s'
                          % (connection, getattr(exc, 'strerror', None) or exc)) from None


def _messages(sock, deadline, connection):
    """Yield the JSON objects the server sends (a stream without delimiters)."""
    decoder = json.JSONDecoder()
    text = codecs.getincrementaldecoder('utf-8')()   # a character may span two reads
    pending = ''
    while True:
        try:
            sock.settimeout(_remaining(deadline, connection))
            data = sock.recv(65536)
        except socket.timeout:
            raise Unavailable('OVSDB at %s did not answer in time' % connection) from None
        except OSError as exc:
            raise Unavailable('connection to OVSDB at %s broke: %s'
                              % (connection, exc.strerror or exc)) from None
        if not data:
            return
        try:
            pending += text.decode(data)
        except UnicodeDecodeError:
            raise Unavailable('OVSDB at %s sent invalid UTF-8' % connection) from None
        if len(pending) > MAX_REPLY_CHARS:
            raise Unavailable('OVSDB at %s sent a message larger than %d characters'
                              % (connection, MAX_REPLY_CHARS))
        while True:
            pending = pending.lstrip()
            try:
                message, end = decoder.raw_decode(pending)
            except ValueError:
                break         # empty or incomplete: read more
            pending = pending[end:]
            if isinstance(message, dict):
                yield message
