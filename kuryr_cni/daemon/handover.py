"""A planned stop hands the node over to the next daemon.

A stopping daemon (SIGTERM: ``systemctl restart``, a DaemonSet update) first
marks its run dir ``daemon.stopping``, then withdraws its socket's name, and
only then drains: the requests in flight are answered, while a new shim finds
no socket and waits for the next daemon (the shim's ``wait.go``) instead of
queueing behind a daemon that will not answer it. Connections already waiting
in the old socket's backlog are reset when it closes; the shim sends those
again, since the daemon never read them.

The next daemon may start while the old one drains (a DaemonSet's surge, a
supervisor that does not wait): a run dir lock held under the mark is a
predecessor stopping, so it waits for the locks, bounded by the
predecessor's drain, where a lock held without the mark is another daemon,
refused at once. The mark is removed by the daemon that takes the lock after
it; one left by a daemon killed while draining is harmless (the lock it
marked is free).
"""

import contextlib
import os

STOPPING = 'daemon.stopping'   # in the run dir
MARGIN = 10                    # seconds on top of the predecessor's drain


def predecessor_patience(run_dir, drain_timeout):
    """Seconds to wait for the run dir's locks: the predecessor's drain when it is
    stopping, else 0 (a daemon holding them is refused)."""
    if os.path.lexists(os.path.join(run_dir, STOPPING)):
        return drain_timeout + MARGIN
    return 0


def took_over(run_dir):
    """After the run dir's lock is taken: the mark of the predecessor is spent."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(run_dir, STOPPING))


def withdraw(run_dir, socket_path):
    """At the start of a planned stop: mark the run dir, then remove the socket's name.

    In that order: a successor that finds no socket and the lock held must
    find the mark too. Failures are ignored: a stop must go on, and the shim
    still copes with a socket nobody answers on (reset connections, sent again).
    """
    with contextlib.suppress(OSError):
        fd = os.open(os.path.join(run_dir, STOPPING),
                     os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(socket_path)
