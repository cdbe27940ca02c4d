"""systemd's notify protocol (``Type=notify``), spoken by the parent process.

READY=1 once the daemon is ready, STATUS= lines as its state changes, and
WATCHDOG=1 every half ``WatchdogSec`` while it is alive (``alive`` of
:func:`kuryr_cni.daemon.health.judge`, heartbeats included): a stuck worker pool
or watcher stops the pings and systemd restarts the service; an unreachable
API server does not (restarting cannot fix it). Without
NOTIFY_SOCKET (not under systemd) every call is a no-op.
"""

import os
import socket
import threading

from oslo_log import log as logging

LOG = logging.getLogger(__name__)

# A receiver that does not read (systemd stalled, a supervisor that never drains
# its socket) fills the datagram queue; a send would then block the parent,
# whose shutdown notifies too. Past this the notification is dropped.
SEND_TIMEOUT = 1.0


def notify(message, env=os.environ):
    address = env.get('NOTIFY_SOCKET')
    if not address:
        return False
    if address.startswith('@'):
        address = '\0' + address[1:]     # abstract namespace socket
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.settimeout(SEND_TIMEOUT)
        try:
            sock.connect(address)
            sock.sendall(message.encode())
        except OSError as exc:
            LOG.warning('systemd notification failed: %s', exc)
            return False
    return True


def watchdog_interval(env=os.environ):
    """Half of WatchdogSec, in seconds, or None when no watchdog is asked for."""
    usec = env.get('WATCHDOG_USEC')
    pid = env.get('WATCHDOG_PID')
    if not usec or not usec.isdigit() or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2e6


class Notifier:
    """Report the daemon's health to systemd from a thread of the parent.

    ``judge()`` returns the facts of :func:`kuryr_cni.daemon.health.judge`; it is
    asked every ``period`` seconds (the watchdog's half-interval when set).
    """

    def __init__(self, judge, period=1.0, env=os.environ):
        self.judge = judge
        self.env = env
        self.watchdog = watchdog_interval(env)
        self.period = min(period, self.watchdog) if self.watchdog else period
        self._stop = threading.Event()
        self._ready_sent = False
        self._last_status = None

    def start(self):
        if not self.env.get('NOTIFY_SOCKET'):
            return None
        thread = threading.Thread(target=self._loop, name='sd-notify', daemon=True)
        thread.start()
        return thread

    def stop(self, status='Shutting down'):
        self._stop.set()
        notify('STOPPING=1\nSTATUS=%s' % status, self.env)

    def _loop(self):
        while not self._stop.is_set():
            self.tick()
            self._stop.wait(self.period)

    def tick(self):
        facts = self.judge()
        status = _describe(facts, starting=not self._ready_sent)
        lines = []
        if status != self._last_status:
            lines.append('STATUS=' + status)
            self._last_status = status
        if facts.get('ready') and not self._ready_sent:
            lines.append('READY=1')
            self._ready_sent = True
        # Alive, not ready: an API server outage leaves the watcher unsynced,
        # and restarting the daemon would not bring the API server back.
        if self.watchdog and facts.get('alive'):
            lines.append('WATCHDOG=1')
        if lines:
            notify('\n'.join(lines), self.env)


def _describe(facts, starting):
    """The STATUS= line: the state, then what keeps the daemon from being ready."""
    if not facts.get('registry'):
        return 'Registry unavailable'
    if facts.get('shutting_down'):
        return 'Shutting down'
    if facts.get('ready'):
        return 'Ready: %d workers serving, watcher synced' % facts['workers']
    if starting:
        state = 'Starting'       # children being forked, first pod list pending
    else:
        state = 'Not ready' if facts.get('alive') else 'Unhealthy'
    return '%s: %s' % (state, '; '.join(facts.get('problems') or ['not ready']))
