"""The ping meter that the traffic tests rely on (helpers.Pinger) counts an outage, and
nothing but an outage: a request in flight at its stop is not lost."""

import os
import subprocess
import sys

import pytest

from tests import wait
from tests.functional import conftest
from tests.functional import helpers

pytestmark = pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON)

PEER = '10.77.0.2'
SLOW = 0.3                  # seconds the slow peer takes to answer
SLOW_ECHO = os.path.join(os.path.dirname(__file__), 'slow_echo.py')


@pytest.fixture
def pair(netns_factory):
    """Two namespaces on a veth: ``here`` (10.77.0.1) pings ``there`` (PEER)."""
    here, there = netns_factory(), netns_factory()
    here.ip('link', 'add', 'name', 'p0', 'type', 'veth', 'peer', 'name', 'p1',
            'netns', there.name)
    here.ip('addr', 'add', '10.77.0.1/24', 'dev', 'p0')
    there.ip('addr', 'add', PEER + '/24', 'dev', 'p1')
    here.ip('link', 'set', 'p0', 'up')
    there.ip('link', 'set', 'p1', 'up')
    wait.until(lambda: here.pings(PEER), 10, 'the veth pair to carry pings')
    return here, there


def _answers(pinger, count):
    wait.until(lambda: len(pinger.answered()) >= count, 20, '%d answers' % count, 0.05)


@pytest.fixture
def slow_peer(pair):
    """``pair`` whose peer answers 0.3 s late: about three requests always in flight."""
    here, there = pair
    assert there.run('sysctl', '-q', '-w', 'net.ipv4.icmp_echo_ignore_all=1').returncode == 0
    responder = subprocess.Popen([conftest.IP, 'netns', 'exec', there.name, sys.executable,
                                  SLOW_ECHO, str(SLOW)], stdout=subprocess.PIPE, text=True)
    try:
        assert responder.stdout.readline() == 'ready\n'
        yield here
    finally:
        responder.kill()
        responder.wait(30)


def test_requests_in_flight_at_the_stop_are_not_lost(slow_peer):
    pinger = helpers.Pinger(slow_peer.path, PEER)
    _answers(pinger, 3)
    sent, lost = pinger.stop()
    assert sent >= 4 and lost == 0, (sent, lost)
    # What ping itself counted: the requests in flight at its interrupt, lost.
    own = pinger.SUMMARY.search(''.join(pinger.lines))
    assert int(own.group(1)) - int(own.group(2)) >= 2, own.group(0)


def _outage(pinger, there, requests):
    """Stop ``there`` answering until ``requests`` requests went unanswered."""
    _answers(pinger, 3)
    there.ip('addr', 'del', PEER + '/24', 'dev', 'p1')
    wait.until(lambda: len(pinger.unanswered()) >= requests, 20,
               '%d requests into the outage' % requests, 0.05)


def test_an_outage_in_the_middle_is_lost(pair):
    here, there = pair
    pinger = helpers.Pinger(here.path, PEER)
    _outage(pinger, there, 5)
    there.ip('addr', 'add', PEER + '/24', 'dev', 'p1')
    sent, lost = pinger.stop()
    assert lost == len(pinger.unanswered()) and lost >= 5 and sent > lost + 3, (sent, lost)


def test_an_outage_at_the_stop_is_lost(pair):
    here, there = pair
    pinger = helpers.Pinger(here.path, PEER)
    _outage(pinger, there, 2)
    sent, lost = pinger.stop(within=1)      # never caught up: all unanswered are lost
    assert lost >= 2 and sent - lost >= 3, (sent, lost)
