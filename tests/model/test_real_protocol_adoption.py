"""The adoption's edges in the real-code state machine, each a short sequence replayed
step by step with every invariant checked (tests/model/real_protocol.py), where the
random runs of the CI profile rarely go: a kuryr-daemon port whose proof fails, and a
planted port in a sandbox's namespace; a crash between the adoption's record and tag.
"""

from tests.model import real_protocol as rp
from tests.model import test_real_protocol_regressions as regressions

POD0, POD1 = rp.PODS

# pod-0's VIF (variant 2) names pod-1's port, and pod-1's kuryr-daemon sandbox holds it
# unadopted when pod-0's ADD comes.
BORROWED_PORT = (('vifs', POD1, 0, True),
                 ('vifs', POD0, 2, True),
                 ('stop',),
                 ('kuryr_daemon_sandbox', 'p1-s0'),
                 ('restart',))


def test_an_add_leaves_a_port_of_its_iface_id_with_another_attached_mac():
    """pod-1's kuryr-daemon port carries port-1-0; pod-1's VIF moves to another port, so
    no pod's VIF proves it any more, and pod-0's VIF (variant 2) names port-1-0 with
    pod-0's MAC: pod-0's ADD is admitted, and the port, not proven pod-0's, must not be
    evicted by it nor adopted by its DEL. (Mutation: evict_foreign without ``if
    finding.proven`` removes it.)"""
    regressions.replay(*BORROWED_PORT,
                       ('vifs', POD1, 1, True),
                       ('add', 'p0-s0'),
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


def test_an_adoption_beside_a_borrowed_port_is_refused():
    """pod-0's record names pod-1's port (variant 2) while kuryr-daemon's port of pod-1's
    VIF is on br-int: pod-0's ADD is refused (the fence counts that port as pod-1's), and
    the scan then adopts pod-1's port for pod-1 alone. Failed on the code before the fix
    (the ADD was admitted, then the scan bound port-1-0 to both pods)."""
    with rp.Protocol().driven() as machine:
        for action, *args in BORROWED_PORT + (('add', 'p0-s0'), ('housekeeping',)):
            getattr(machine, action)(*args)
            machine.assert_invariants()
        assert 'p0-s0' not in machine.results, 'the ADD of the borrowed port answered success'
        assert machine.owners() == {POD1: 'p1-s0'}, machine.owners()


def test_a_queued_del_of_a_kuryr_daemon_sandbox_removes_its_port():
    """The shim queues the DEL of kuryr-daemon's sandbox while the daemon is down; the
    start-up replay, before the watcher has the pod's VIFs, keeps it queued, and the
    first housekeeping round after the sync applies it: the port is adopted and removed.
    Failed on the code before the fix (the replay answered noop and dropped the entry:
    the port stayed on br-int)."""
    regressions.replay(('vifs', POD0, 0, True),
                       ('stop',),
                       ('kuryr_daemon_sandbox', 'p0-s0'),
                       ('delete', 'p0-s0'),
                       ('restart',))


def test_no_adoption_of_a_port_another_pod_holds():
    """pod-1's VIF names another port while pod-0's ADD takes port-1-0 (variant 2), then
    names port-1-0 again: the scan must not adopt kuryr-daemon's port of it (pod-0 holds
    the port), and pod-1's DEL of that sandbox removes it unrecorded. Failed on the code
    before the fix (the scan bound port-1-0 to both pods); without the removal at the
    DEL, kuryr-daemon's port stays on br-int."""
    tap = rp.foreign_node.foreign.tap_name('port-1-0')
    with rp.Protocol().driven() as machine:
        for action, *args in BORROWED_PORT + (('vifs', POD1, 1, True), ('add', 'p0-s0'),
                                              ('vifs', POD1, 0, True), ('housekeeping',)):
            getattr(machine, action)(*args)
            machine.assert_invariants()
        assert machine.owners() == {POD0: 'p0-s0'}, machine.owners()
        assert machine.node.kernel.rows[tap].owner is None
        machine.delete('p1-s0')
        machine.assert_invariants()
        assert tap not in machine.node.kernel.rows
