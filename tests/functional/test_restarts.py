"""Daemon restarts under a steady stream of ADDs through the real shim: none fails.

Three ways a node's daemon restarts: ``systemctl restart`` (SIGTERM, the old
daemon drains and exits, then the next starts), a DaemonSet-style replace
(the next started as the old one is told to stop), and a crash (SIGKILL of
the whole process group, the supervisor starting the next). Meanwhile ADDs
arrive at :data:`RATE` a second, as a busy node's kubelet sends them: each
must succeed (the shim waits for the next daemon), and each pod must be
plugged once. The tests count failures; the longest ADD and the outage are
printed (``-s``), not asserted. A planned stop also answers the ADD it has in
flight before it exits.
"""

import concurrent.futures
import os
import signal
import time

import pytest

from tools.testbed import host as testhost

from tests import pace
from tests import wait
from tests.functional import conftest
from tests.functional import helpers

pytestmark = pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON)

RATE = 10               # ADDs a second
PODS = 240              # a restart of ~22 s at RATE (addresses end at .250)
STATUS_INTERVAL = 0.25  # seconds between STATUS calls, kubelet's poll much sped up
STATUS_PATIENCE = 4     # seconds: shim/wait.go's statusPatience


def _systemctl_restart(node, drained):
    old = node.daemon
    os.kill(old.pid, signal.SIGTERM)
    # The socket's name goes first: new ADDs wait for the next daemon meanwhile.
    wait.until(lambda: not os.path.exists(node.socket), 30, 'the socket withdrawn')
    drained()
    assert old.wait(60) == 0
    node.start_daemon()


def _daemonset_replace(node, drained):
    old = node.daemon
    log_start = len(_log(node))
    os.kill(old.pid, signal.SIGTERM)
    node.start_daemon(wait=False)
    # The next daemon waits for the old one's drain instead of refusing to start.
    wait.until(lambda: WAITING in _log(node)[log_start:], 60, 'the next daemon waiting')
    drained()
    node.wait_ready()
    assert old.wait(60) == 0


def _killed_and_restarted(node, drained):
    os.killpg(node.daemon.pid, signal.SIGKILL)
    node.daemon.wait(30)
    node.start_daemon()


RESTARTS = {'systemctl': _systemctl_restart, 'replace': _daemonset_replace,
            'kill': _killed_and_restarted}
WAITING = 'Waiting up to'     # kuryr_cni.daemon.main._lock_dir's line


def _log(node):
    with open(os.path.join(node.workdir, 'daemon.log'), errors='replace') as f:
        return f.read()


@pytest.mark.parametrize('restart', sorted(RESTARTS))
def test_no_add_fails_while_the_daemon_restarts(daemon, runtime, restart):
    """And a planned stop answers the ADD in flight when it came: one waiting for its
    VIFs to be active, which they become only once the stop has begun."""
    node = daemon
    sandboxes = helpers.make_pods(node, range(2, 2 + PODS))
    planned = restart != 'kill'
    (slow,) = helpers.make_pods(node, [2 + PODS], active=False)
    statuses = pace.Stream(lambda _: runtime.status(), [None] * 400, 1 / STATUS_INTERVAL)
    with concurrent.futures.ThreadPoolExecutor(1) as pool, \
            pace.Stream(runtime.add, sandboxes, RATE) as adds, statuses:
        in_flight = helpers.add_in_background(pool, node, runtime, slow) if planned else None
        adds.wait_sent(RATE)                        # a second of ADDs to the old daemon
        down = time.monotonic()
        RESTARTS[restart](node, lambda: node.api.set_vifs(
            'default', slow.pod_name, node.vifs(2 + PODS)))
        up = time.monotonic()
        adds.wait_sent(adds.wait_sent(0) + RATE)    # and a second to the next one
    failed = [c.outcome for c in adds.calls if not c.outcome.ok]
    assert failed == [], failed
    if planned:
        assert in_flight.result().ok, in_flight.result()
    # ADDs did arrive while no daemon served, or this proved nothing.
    during = [c for c in adds.calls if down <= c.started <= up]
    assert during
    # Each pod plugged once, by the daemon that runs now (a retried ADD included).
    assert helpers.metric(node, 'kuryr_cni_attachments') == len(adds.calls) + planned
    assert all(node.ping(s.netns, testhost.GATEWAY)
               for s in sandboxes[:len(adds.calls):13])
    # STATUS fails only when the daemon was away longer than the shim waits for it.
    status_failed = [c for c in statuses.calls if not c.outcome.ok]
    assert all(up - c.started > STATUS_PATIENCE for c in status_failed), status_failed
    print('\n%s: %d ADDs, 0 failed; %d sent during the %.2f s restart, longest %.2f s; '
          '%d STATUS, %d failed' % (
              restart, len(adds.calls), len(during), up - down,
              max(c.ended - c.started for c in during), len(statuses.calls),
              len(status_failed)))
