"""The adoption's edges in the real-code state machine, each a short sequence replayed
step by step with every invariant checked (tests/model/real_protocol.py), where the
random runs of the CI profile rarely go: a kuryr-daemon port whose proof fails, and a
planted port in a sandbox's namespace; a crash between the adoption's record and tag.
"""

import pytest

from tests.model import real_protocol as rp
from tests.model import test_real_protocol_regressions as regressions

POD0, POD1 = rp.PODS

# pod-0's VIF (variant 2) names pod-1's port, and pod-1's kuryr-daemon sandbox holds it
# unadopted when pod-0's ADD comes (admitted: no binding holds the port yet).
BORROWED_PORT_ADMITTED = (('vifs', POD1, 0, True),
                          ('vifs', POD0, 2, True),
                          ('stop',),
                          ('kuryr_daemon_sandbox', 'p1-s0'),
                          ('restart',),
                          ('add', 'p0-s0'))


def test_an_add_leaves_a_port_of_its_iface_id_with_another_attached_mac():
    """pod-1's kuryr-daemon port carries port-1-0; pod-0's VIF (variant 2) names the same
    port with pod-0's MAC: not proven pod-0's, so pod-0's ADD must not evict it, nor its
    DEL adopt it. (Mutation: evict_foreign without ``if finding.proven`` removes it.)"""
    regressions.replay(*BORROWED_PORT_ADMITTED,
                       ('delete', 'p0-s0'))


def test_a_planted_port_in_a_sandboxs_namespace_is_never_taken():
    """A port naming no pod's VIF, its pod end beside a kuryr-daemon sandbox's: the
    scan, the DEL's adoption, a new sandbox's eviction and housekeeping leave it. (No
    mutation of kuryr_cni reaches it: like Finder._rows, the stand-in's find_foreign
    selects rows by the VIF's iface-id; this shows nothing else takes it.)"""
    regressions.replay(('vifs', POD0, 0, True),
                       ('stop',),
                       ('kuryr_daemon_sandbox', 'p0-s0'),
                       ('plant', 'p0-s0'),
                       ('restart',),
                       ('housekeeping',),
                       ('add', 'p0-s1'),
                       ('delete', 'p0-s0'))


def test_a_crash_between_the_record_and_the_tags_loses_nothing():
    """The DEL adopting kuryr-daemon's port dies right after the record's rename: the
    record names the untagged port, and the retried DEL removes it."""
    regressions.replay(('vifs', POD0, 0, True),
                       ('stop',),
                       ('kuryr_daemon_sandbox', 'p0-s0'),
                       ('restart',),
                       ('delete', 'p0-s0', 6),     # hold (2), then open, write, fsync, rename
                       ('restart',),
                       ('delete', 'p0-s0'))


# Open gaps of the code (real_protocol.EXCLUDED_IN_CI, doc/source/ownership.rst "Open"):
# strict, so each turns into a failure the day its gap is closed.

@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason=rp.ADOPTION_BESIDE_A_BORROWED_PORT)
def test_open_an_adoption_beside_a_borrowed_port_binds_one_port_to_two_pods():
    """pod-0's record names pod-1's port (variant 2); pod-0's ADD is admitted, as pod-1
    holds nothing yet; the scan then adopts pod-1's kuryr-daemon port: two pods of the
    node hold port-1-0."""
    regressions.replay(*BORROWED_PORT_ADMITTED,
                       ('housekeeping',))


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason=rp.QUEUED_DEL_OF_KURYR_DAEMON_SANDBOX)
def test_open_a_queued_del_of_a_kuryr_daemon_sandbox_leaves_its_port():
    """The shim queues the DEL of kuryr-daemon's sandbox while the daemon is down; the
    start-up replay runs before the watcher has the pod's VIFs, so proves nothing,
    answers noop and drops the entry: kuryr-daemon's port stays on br-int."""
    regressions.replay(('vifs', POD0, 0, True),
                       ('stop',),
                       ('kuryr_daemon_sandbox', 'p0-s0'),
                       ('delete', 'p0-s0'),
                       ('restart',))
