"""Open the daemon's listening sockets, refusing unsafe places (DESIGN §4.2).

Only root may talk to the daemon: the unix socket is 0600 inside a 0700
directory, and start-up stops when that directory is not root's or is writable
by others. The optional TCP listener accepts loopback addresses only.
"""

import contextlib
import ipaddress
import os
import socket
import stat

BACKLOG = 1024    # the default of 5 stalls bursts of pod starts by ~1 s


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


def open_tcp(bind_address):
    host, _, port = bind_address.rpartition(':')
    host = host.strip('[]')
    try:
        address = ipaddress.ip_address(host)
        port = int(port)
    except ValueError:
        raise UnsafeSetup('bind_address %r is not "<ip>:<port>"' % bind_address) from None
    if not address.is_loopback:
        raise UnsafeSetup('bind_address %s is not a loopback address' % host)
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    return sock


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
