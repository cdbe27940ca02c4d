"""The parent's watch over the registry Manager process.

Every daemon process keeps its shared state in the registry Manager; without
it no request can be served, and cotyledon cannot restart it (it is not one of
cotyledon's services: it must exist before them, DESIGN §2). So the parent
watches the Manager from a thread, through a pidfd, and when the Manager dies
it logs why and asks cotyledon for the graceful shutdown (SIGTERM to itself):
workers finish or fail their requests in flight (code 11, retried by the
runtime) and the daemon exits with :data:`EXIT_REGISTRY_LOST`, so that its
supervisor (systemd ``Restart=on-failure``) starts it again with the state
reloaded from disk. Meanwhile ``/alive`` answers 503 ("registry unavailable").
"""

import os
import select
import signal
import threading

from oslo_log import log as logging

LOG = logging.getLogger(__name__)

EXIT_REGISTRY_LOST = 3


class ManagerGuard:
    """Stops the daemon when the process ``pid`` (the Manager) ends, unless disarmed."""

    def __init__(self, pid):
        self.pid = pid
        self.lost = False
        self._disarmed = threading.Event()
        self._fd = os.pidfd_open(pid)

    def start(self):
        threading.Thread(target=self._wait, name='manager-guard', daemon=True).start()
        return self

    def disarm(self):
        """The daemon is stopping the Manager itself: its end is no failure."""
        self._disarmed.set()

    def _wait(self):
        try:
            select.select([self._fd], [], [])     # readable once the process has ended
        finally:
            os.close(self._fd)
        if self._disarmed.is_set():
            return
        self.lost = True
        LOG.error('The registry Manager process %d died: stopping the daemon (exit status %d) '
                  'so that its supervisor restarts it with the state reloaded from disk',
                  self.pid, EXIT_REGISTRY_LOST)
        os.kill(os.getpid(), signal.SIGTERM)
