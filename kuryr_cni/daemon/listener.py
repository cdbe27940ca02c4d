"""Open the daemon's listening sockets, refusing unsafe places and peers (DESIGN §4.2).

Only root may talk to the daemon, over the unix socket alone: it is 0600
inside a 0700 directory, start-up stops when that directory is not root's or
is writable by others, and every connection's peer must be uid 0
(:func:`refuse_non_root`). There is no TCP listener for the CNI API: anyone on
the node, hostNetwork pods included, could reach one. The ops ports (health,
metrics) are TCP and answer GETs only.
"""

import contextlib
import os
import socket
import stat
import struct

ANY = '::'        # every address of both families, the ops ports' default
BACKLOG = 1024    # the default of 5 stalls bursts of pod starts by ~1 s; floods need room too


class UnsafeSetup(Exception):
    """The daemon refuses to start; the message says why."""


def ensure_private_dir(path):
    """Create ``path`` 0700 when missing; refuse one that others could write."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if st.st_uid != os.geteuid():
        raise UnsafeSetup('%s belongs to uid %d, not to the daemon\'s uid %d'
                          % (path, st.st_uid, os.geteuid()))
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeSetup('%s is writable by group or others (mode %o)'
                          % (path, stat.S_IMODE(st.st_mode)))
    return path


def open_unix(path):
    ensure_private_dir(os.path.dirname(path))
    refuse_live_daemon(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.listen(BACKLOG)
    return sock


def open_tcp(host, port):
    """A listening TCP socket for the ops ports (health, metrics).

    ``::`` serves both families (IPV6_V6ONLY off, whatever net.ipv6.bindv6only
    says), as an IPv6-only node needs; where IPv6 is off in this network
    namespace, or absent from the kernel, it is 0.0.0.0 instead.
    """
    if host == ANY and not ipv6_on():
        host = '0.0.0.0'
    family = socket.AF_INET6 if ':' in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    return sock


def ipv6_on(proc_sys='/proc/sys/net/ipv6'):
    """Whether this network namespace has IPv6 (its ``all.disable_ipv6`` is not 1)."""
    try:
        with open(os.path.join(proc_sys, 'conf', 'all', 'disable_ipv6')) as f:
            return f.read().strip() != '1'
    except OSError:
        return False        # no /proc/sys/net/ipv6: the kernel has no IPv6 (ipv6.disable=1)


def refuse_non_root(conn):
    """Whom a server must refuse on the unix socket: ``(reason, detail)`` or None for root.

    The socket's mode keeps others out; this keeps them out of a socket whose
    mode someone loosened. ``SO_PEERCRED`` gives the peer's credentials as of
    its ``connect()``.
    """
    try:
        pid, uid, _ = struct.unpack('3i', conn.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize('3i')))
    except OSError as exc:
        return 'peer_uid', 'peer credentials unavailable: %s' % exc
    if uid != 0:
        return 'peer_uid', 'peer uid %d (pid %d) is not root' % (uid, pid)
    return None


def refuse_live_daemon(path):
    """Raise UnsafeSetup when a daemon answers on the unix socket ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1)
    try:
        probe.connect(path)
    except OSError:
        return          # nobody serves it: a leftover of a previous run
    finally:
        probe.close()
    raise UnsafeSetup('another daemon is already serving %s' % path)
