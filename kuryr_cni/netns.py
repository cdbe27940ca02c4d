"""The one way into a network namespace.

Everything in the daemon that touches a namespace other than its own goes
through this module: validating a ``CNI_NETNS`` path (:func:`check_netns`),
opening a checked descriptor of one (:func:`open_netns`), a netlink handle
bound to one (:func:`iproute`, or :func:`channel` for the batched requests of
plugging, :mod:`kuryr_cni.rtnl`) and any other socket created inside one
(:func:`socket_in`). No namespace is ever created here, and no netlink request
is sent before the namespace path has been checked.

How a socket gets into another namespace, and why a thread of its own
----------------------------------------------------------------------

A socket belongs, for its whole life, to the network namespace of the thread
that created it. ``setns(2)`` moves only the *calling thread*, not the
process: if a request-serving thread of the daemon entered a pod's namespace
and something went wrong before it came back, every later request served by
that thread would silently configure the wrong namespace, and the thread's
other sockets (and anything it opened meanwhile, e.g. an HTTP connection)
would end up in the pod. So we never call ``setns`` in a thread we care
about. One thread per process, the *namespace runner*, does nothing else: it
enters the namespace, creates the socket (or reads the device names),
returns to the daemon's own namespace and checks that it did; the socket
keeps its namespace and is handed back to the caller. A runner that could
not return ends, and the next call starts a new one. Code run in it must be
tiny and must not touch shared state (no logging handlers, no locks held by
others).

pyroute2's own ``IPRoute(netns=...)`` is not used: in pyroute2 0.9 it forks a
helper process per handle (~8 ms) and creates the namespace when it is
missing unless ``flags=0``. A throwaway thread per call cost ~1 ms (setting
up and tearing down a thread that dies in another namespace); the runner's
round trip costs ~0.03 ms.

Bounding netlink calls
----------------------

pyroute2 0.9's synchronous ``IPRoute`` runs every request to completion on an
asyncio event loop with no timeout of its own (a lost answer would block the
worker forever). :func:`iproute` therefore hands pyroute2 (through its public
``use_event_loop`` argument) an event loop whose ``run_until_complete`` wraps
every step in :func:`asyncio.wait_for`; a request that gets no answer within
the timeout raises :class:`NetlinkTimeout` (CNI code 11, try again later), and
the handle must then be dropped (leaving the ``with`` block does it). A
:func:`channel` waits on a blocking socket with the same timeout. The
timeout bounds the wait for the kernel's answer; it cannot interrupt a
``sendmsg`` blocked inside the kernel (e.g. on the RTNL lock), which no user
space tool can.

Handles on the daemon's own namespace are kept
-----------------------------------------------

Opening a handle costs ~0.4 ms of CPU (pyroute2 builds its marshal, request
proxy and asyncio transport each time), which was a tenth of a DEL. The
daemon's own namespace never changes under a process, so :func:`iproute`
(and :func:`channel`) with no path keeps the handle for the calling thread's
next block; a block that raises closes it instead (a timed-out request may
still be answered later), and a child process forgets what its parent kept
(a netlink socket shared across a fork would see the other process's
answers). Handles on other namespaces are closed when their block ends: a
path may name another namespace tomorrow.
"""

import asyncio
import contextlib
import ctypes
import errno
import fcntl
import ipaddress
import os
import queue
import socket
import stat
import sys
import threading

import pyroute2
from pyroute2.netlink.exceptions import NetlinkError

from kuryr_cni import errors
from kuryr_cni import rtnl

CLONE_NEWNET = 0x40000000
NS_GET_NSTYPE = 0xB703          # ioctl on a namespace file: its CLONE_NEW* type
OWN_NETNS = '/proc/self/ns/net'  # the daemon's own namespace (thread-group leader's)
NETLINK_TIMEOUT = 10.0           # seconds any one netlink request may wait for its answer

_SOL_NETLINK = 270
_NETLINK_EXT_ACK = 11            # ask the kernel for a text reason with each error
_NS_TYPES = {
    0x00020000: 'mount', 0x02000000: 'cgroup', 0x04000000: 'UTS', 0x08000000: 'IPC',
    0x10000000: 'user', 0x20000000: 'PID', CLONE_NEWNET: 'network', 0x00000080: 'time',
}

_libc = ctypes.CDLL(None, use_errno=True)   # Python 3.11 has no os.setns


class NamespaceNotFound(errors.InvalidEnvironment):
    """The namespace path does not exist (any more)."""


NetlinkTimeout = rtnl.NetlinkTimeout


def check_netns(path, host=None):
    """Raise InvalidEnvironment (code 4) unless ``path`` is a pod's network namespace.

    ``path`` must be an absolute path naming a network namespace file (as
    ``/run/netns/<name>`` or ``/proc/<pid>/ns/net`` do) and must not be the
    ``host`` namespace (a path; None means the daemon's own). The daemon's own
    namespace is always refused, even when ``host`` names another one.
    Missing paths raise :class:`NamespaceNotFound`, a subclass. Nothing is
    sent over netlink and nothing is created.
    """
    with open_netns(path, host=host):
        pass


def exists(path):
    """Whether ``path`` names a network namespace right now."""
    try:
        fd = _open_ns_file(path)
    except errors.InvalidEnvironment:
        return False
    os.close(fd)
    return True


@contextlib.contextmanager
def open_netns(path, host=None):
    """Yield a descriptor of the pod namespace ``path``, checked as by :func:`check_netns`.

    The checks are made on the descriptor itself, so the namespace they accept
    is the one every later use of the descriptor (:func:`iproute`,
    ``net_ns_fd``) reaches, even if the path is replaced meanwhile. The
    descriptor is closed when the block ends.
    """
    fd = _open_ns_file(path)
    try:
        here = os.fstat(fd)
        for other in (OWN_NETNS,) if host is None else (host, OWN_NETNS):
            try:
                there = os.stat(other)
            except OSError as exc:
                raise errors.InvalidEnvironment('cannot compare %s with host namespace %s: %s'
                                                % (path, other, exc.strerror)) from None
            if (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino):
                raise errors.InvalidEnvironment(
                    'CNI_NETNS %s is the host network namespace, not a pod\'s' % path)
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def iproute(path=None, *, timeout=NETLINK_TIMEOUT, echo=False):
    """Yield a pyroute2 ``IPRoute`` bound to a network namespace.

    ``path`` is a namespace path, an open descriptor of one (from
    :func:`open_netns`) or None for the daemon's own namespace. The namespace
    is never created: a missing path raises :class:`NamespaceNotFound`, a
    file that is no network namespace :class:`errors.InvalidEnvironment`.
    Every request waits at most ``timeout`` seconds for the kernel's answer,
    else raises :class:`NetlinkTimeout`. ``echo`` asks the kernel to send
    back what each change created (``NLM_F_ECHO``), which saves a lookup.
    The handle belongs to the calling thread. It is closed when the block
    ends, except one on the daemon's own namespace that no error ended, which
    the thread keeps for its next block (see the module docstring).
    """
    with _handle(path, ('iproute', timeout, echo),
                 lambda: _Handle(path, timeout, echo)) as handle:
        yield handle.ipr


@contextlib.contextmanager
def channel(path=None, *, timeout=NETLINK_TIMEOUT):
    """Yield a :class:`kuryr_cni.rtnl.Channel` bound to a network namespace.

    As :func:`iproute` (``path``, ``timeout``, a kept channel on the daemon's
    own namespace), for the batched requests of plugging.
    """
    def make():
        sock = socket_in(path, socket.AF_NETLINK, socket.SOCK_DGRAM, socket.NETLINK_ROUTE)
        try:
            sock.setsockopt(_SOL_NETLINK, _NETLINK_EXT_ACK, 1)
            return rtnl.Channel(sock, timeout, _where(path))
        except BaseException:
            sock.close()
            raise
    with _handle(path, ('channel', timeout), make) as handle:
        yield handle


@contextlib.contextmanager
def _handle(path, key, make):
    """A new handle from ``make()`` on ``path``, closed after; on None, the thread's kept one."""
    if path is None:
        with _kept_handle(key, make) as handle:
            yield handle
        return
    handle = make()
    try:
        yield handle
    finally:
        handle.close()


class _Handle:
    """A pyroute2 ``IPRoute`` with the socket and bounded loop it runs on."""

    def __init__(self, path, timeout, echo):
        self.sock = socket_in(path, socket.AF_NETLINK, socket.SOCK_DGRAM, socket.NETLINK_ROUTE)
        self.loop = _BoundedLoop(timeout, _where(path))
        self.ipr = None
        try:
            self.sock.setsockopt(_SOL_NETLINK, _NETLINK_EXT_ACK, 1)
            self.ipr = pyroute2.IPRoute(use_socket=self.sock, use_event_loop=self.loop,
                                        nlm_echo=echo)
        except BaseException:
            self.close()
            raise

    def close(self):
        try:
            if self.ipr is not None:
                self.ipr.close()
                self.loop.drain()       # let the transport finish closing the socket
        finally:
            self.loop.close()
            self.sock.close()


class _KeptHandles(threading.local):
    """The calling thread's idle handles on the daemon's own namespace."""

    def __init__(self):
        self.idle = {}      # key -> handle


_kept = _KeptHandles()


def _forget_kept_handles():
    # In a child after fork: the parent keeps using those sockets; dropping
    # the references leaves the parent's descriptors alone.
    global _kept
    _kept = _KeptHandles()


os.register_at_fork(after_in_child=_forget_kept_handles)


@contextlib.contextmanager
def _kept_handle(key, make):
    idle = _kept.idle
    # Taken out while in use, so a nested block on the same thread opens its own.
    handle = idle.pop(key, None) or make()
    try:
        yield handle
    except BaseException:
        handle.close()
        raise
    if key in idle:
        handle.close()      # a nested block kept one already
    else:
        idle[key] = handle


def link_names(path, host=None):
    """Names of the network devices in the pod namespace ``path``.

    ``path`` is checked as by :func:`check_netns`. The names come from
    ``if_nameindex(3)`` called by the namespace runner: a read of ~0.05 ms,
    where a netlink handle and a dump of the links take ~2 ms.
    """
    with open_netns(path, host=host) as fd:
        return {name for _index, name in _in_netns(fd, socket.if_nameindex)}


def link_name(index, path=None):
    """The name of device ``index`` in namespace ``path`` (None: the daemon's own), or None.

    ``if_indextoname(3)``: a few microseconds, where a netlink lookup decodes
    a whole link message (~0.5 ms of CPU). ``path`` is not checked as a pod's
    namespace is: it is for the host side.
    """
    def name():
        try:
            return socket.if_indextoname(index)
        except OSError:
            return None
    return _call_in(path, name)


def listening_addresses(port, path=None, uid=None):
    """Local addresses of the TCP sockets listening on ``port`` in namespace ``path``.

    ``path`` is a namespace path or None (the daemon's own); ``uid``: only
    sockets of that user. Read from the namespace's ``/proc/net/tcp`` and
    ``tcp6`` (each socket once: one listening on ``::`` is one address,
    ``::``), as ``netstat`` reads them.
    """
    def read():
        found = []
        for table, width in (('tcp', 8), ('tcp6', 32)):
            try:
                with open('/proc/thread-self/net/' + table) as f:
                    rows = f.read().splitlines()[1:]
            except FileNotFoundError:       # no IPv6 in this kernel
                continue
            for row in rows:
                fields = row.split()
                local, state, owner = fields[1], fields[3], int(fields[7])
                address, _, hex_port = local.partition(':')
                if state == _TCP_LISTEN and int(hex_port, 16) == port and \
                        len(address) == width and uid in (None, owner):
                    found.append(_proc_net_address(address))
        return found
    return _call_in(path, read)


_TCP_LISTEN = '0A'


def _proc_net_address(text):
    """An address as /proc/net/tcp{,6} prints it: 32-bit words in host byte order."""
    raw = b''.join(int(text[i:i + 8], 16).to_bytes(4, sys.byteorder)
                   for i in range(0, len(text), 8))
    return str(ipaddress.ip_address(raw))


def link_index(name, path):
    """The index of device ``name`` in namespace ``path`` (a path, a descriptor, None: here)."""
    return _call_in(path, lambda: socket.if_nametoindex(name))


def device_names(path=None):
    """Names of the devices in namespace ``path`` (None: the daemon's own).

    ``if_nameindex(3)``, as :func:`link_names` but for the host side:
    ``path`` is not checked as a pod's namespace is. Far cheaper than a
    netlink dump, which decodes every link (~1 ms each).
    """
    return [name for _index, name in _call_in(path, socket.if_nameindex)]


def socket_in(path, family, type, proto=0):
    """Return a new socket created inside a network namespace.

    ``path`` is a namespace path, an open descriptor of one, or None for the
    daemon's own namespace. The socket stays in that namespace for its life
    (e.g. to reach a TCP port of a server running in a test namespace).
    """
    return _call_in(path, lambda: socket.socket(family, type, proto))


def _call_in(path, create):
    """``create()`` in namespace ``path`` (a path, an open descriptor, None: here)."""
    if path is None:
        return create()
    if isinstance(path, int):
        return _in_netns(path, create)
    fd = _open_ns_file(path)
    try:
        return _in_netns(fd, create)
    finally:
        os.close(fd)


def _in_netns(fd, create):
    """Call ``create()`` in the namespace runner, entered into namespace ``fd``.

    See the module docstring for why the calling thread must never enter a
    namespace itself. ``create`` must only build and return an object bound
    to the namespace (a socket) or read the namespace (its device names).
    Calls from several threads take turns; each waits at most
    :data:`NETLINK_TIMEOUT` seconds for its turn and its answer.
    """
    job = _Job(fd, create)
    _runner().submit(job)
    if not job.done.wait(NETLINK_TIMEOUT):
        raise NetlinkTimeout('entering network namespace fd %d took more than %g s'
                             % (fd, NETLINK_TIMEOUT))
    if job.error is not None:
        raise job.error
    return job.result


class _Job:
    def __init__(self, fd, create):
        self.fd = fd
        self.create = create
        self.result = self.error = None
        self.done = threading.Event()


class _Runner:
    """The thread that alone enters namespaces; it ends if it cannot come back."""

    def __init__(self):
        # Opened by the caller, whose namespace (it never enters one) is the one to
        # come back to: out of descriptors, the call fails here, at once, rather
        # than leaving a runner that died at its start and times out every call.
        self.home = os.open('/proc/thread-self/ns/net', os.O_RDONLY | os.O_CLOEXEC)
        self.jobs = queue.SimpleQueue()
        self.alive = True
        self.thread = threading.Thread(target=self._run, name='kuryr-cni-netns', daemon=True)
        try:
            self.thread.start()
        except BaseException:
            os.close(self.home)
            raise

    def submit(self, job):
        self.jobs.put(job)

    def _run(self):
        home = self.home
        try:
            home_ino = os.fstat(home).st_ino
            while self.alive:
                job = self.jobs.get()
                try:
                    if _libc.setns(job.fd, CLONE_NEWNET) != 0:
                        code = ctypes.get_errno()
                        raise OSError(code, 'setns into network namespace: %s'
                                      % os.strerror(code))
                    job.result = job.create()
                except BaseException as exc:  # handed to the caller's thread
                    job.error = exc
                finally:
                    if not self._return_home(home, home_ino):
                        self.alive = False      # the next call starts a new runner
                    job.done.set()
        finally:
            os.close(home)

    @staticmethod
    def _return_home(home, home_ino):
        if _libc.setns(home, CLONE_NEWNET) != 0:
            return False
        try:
            return os.stat('/proc/thread-self/ns/net').st_ino == home_ino
        except OSError:
            return False


_runner_lock = threading.Lock()
_current_runner = None


def _runner():
    global _current_runner
    with _runner_lock:
        if _current_runner is None or not _current_runner.alive:
            _current_runner = _Runner()
        return _current_runner


def _forget_runner():
    # In a child after fork the runner thread does not exist.
    global _current_runner
    _current_runner = None


os.register_at_fork(after_in_child=_forget_runner)


def _open_ns_file(path):
    """Open ``path`` and make sure it is a network namespace file; return the fd."""
    if not isinstance(path, str) or not os.path.isabs(path) or '\0' in path:
        raise errors.InvalidEnvironment(
            'CNI_NETNS must be an absolute path to a network namespace, not %r' % (path,))
    try:
        # Refuse anything that is not a regular file before opening it: opening
        # a FIFO would block and opening a device may have side effects.
        # Namespace files (nsfs inodes, bind-mounted or under /proc) are regular.
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise NamespaceNotFound('network namespace %s does not exist' % path) from None
    except OSError as exc:
        raise errors.InvalidEnvironment('cannot reach network namespace %s: %s'
                                        % (path, exc.strerror)) from None
    if not stat.S_ISREG(mode):
        raise errors.InvalidEnvironment('%s is not a network namespace (it is a %s)'
                                        % (path, _file_kind(mode)))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise NamespaceNotFound('network namespace %s does not exist' % path) from None
    except OSError as exc:
        if exc.errno in errors.SHORTAGES:       # the daemon's shortage, not the request's fault
            raise errors.TryAgainLater('cannot open network namespace %s: %s'
                                       % (path, exc.strerror)) from None
        raise errors.InvalidEnvironment('cannot open network namespace %s: %s'
                                        % (path, exc.strerror)) from None
    try:
        ns_type = fcntl.ioctl(fd, NS_GET_NSTYPE)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.ENOTTY, errno.EINVAL):
            raise errors.InvalidEnvironment(
                '%s is not a network namespace (not a namespace file at all)' % path) from None
        raise errors.InvalidEnvironment('cannot inspect namespace file %s: %s'
                                        % (path, exc.strerror)) from None
    if ns_type != CLONE_NEWNET:
        os.close(fd)
        raise errors.InvalidEnvironment(
            '%s is a %s namespace, not a network namespace'
            % (path, _NS_TYPES.get(ns_type, 'unknown (%#x)' % ns_type)))
    return fd


def _file_kind(mode):
    for test, name in ((stat.S_ISDIR, 'directory'), (stat.S_ISFIFO, 'FIFO'),
                       (stat.S_ISSOCK, 'socket'), (stat.S_ISCHR, 'character device'),
                       (stat.S_ISBLK, 'block device')):
        if test(mode):
            return name
    return 'special file'


def _describe(path):
    return 'fd %d' % path if isinstance(path, int) else path


def _where(path):
    return ('the daemon\'s own namespace' if path is None
            else 'network namespace %s' % _describe(path))


class _BoundedLoop(asyncio.SelectorEventLoop):
    """An event loop whose every ``run_until_complete`` step has a deadline.

    pyroute2's synchronous API drives each request (and each step of a dump)
    through ``run_until_complete``; bounding that bounds every call.
    """

    def __init__(self, timeout, where):
        super().__init__()
        self._timeout = timeout
        self._where = where

    def run_until_complete(self, future):
        # A timer cancelling the step, not asyncio.wait_for: that wraps every
        # step in a second task, ~10% of the CPU of a netlink request.
        task = asyncio.ensure_future(future, loop=self)
        expired = []
        timer = self.call_later(self._timeout, lambda: expired.append(task.cancel()))
        try:
            return super().run_until_complete(task)
        except asyncio.CancelledError:
            if not expired:
                raise
            raise NetlinkTimeout('netlink request in %s got no answer within %g s'
                                 % (self._where, self._timeout)) from None
        finally:
            timer.cancel()

    def drain(self):
        """Run the callbacks already scheduled (transport teardown)."""
        super().run_until_complete(asyncio.sleep(0))


@contextlib.contextmanager
def kernel_errors(action):
    """Turn a kernel refusal raised in the block into :class:`errors.BindingFailed`.

    ``action`` says what was being done ("create veth kc1234 in ...");
    the netlink or OS error goes into ``details``. CNI errors (timeouts,
    invalid namespaces) pass through unchanged.
    """
    try:
        yield
    except errors.CNIError:
        raise
    except (NetlinkError, OSError) as exc:
        raise errors.BindingFailed('failed to %s' % action, describe(exc)) from exc


def check_answers(requests):
    """Raise what :func:`kernel_errors` makes of the first refused request of a batch.

    ``requests``: :class:`kuryr_cni.rtnl.Request` objects a channel has sent.
    """
    for request in requests:
        if request.error is not None:
            raise errors.BindingFailed('failed to %s' % request.action,
                                       describe(request.error)) from request.error


def describe(exc):
    """The error number and text of a netlink or OS error, for ``details``."""
    if isinstance(exc, NetlinkError):
        name = os.strerror(exc.code)
        text = exc.args[1] if len(exc.args) > 1 else None
        extra = ': %s' % text if text and text != name else ''
        return 'netlink error %d (%s)%s' % (exc.code, name, extra)
    if isinstance(exc, OSError) and exc.errno:
        return 'error %d (%s)' % (exc.errno, exc.strerror or os.strerror(exc.errno))
    return str(exc)
