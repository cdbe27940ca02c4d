"""What the state machine of tests/model/real_protocol.py found, each as the short sequence
it shrank to, replayed step by step with every invariant checked after each step and
the wind-down's checks at the end (as Hypothesis runs it).

Each names the hole of issue 31 it found and the test fails on the code before its fix.
"""

from tests.model import real_protocol as rp

POD0, POD1 = rp.PODS


def replay(*steps, machine=None):
    """Run ``steps`` (``(action, args...)``) on a fresh :class:`rp.Protocol`, then wind down."""
    with (machine or rp.Protocol()).driven() as machine:
        for action, *args in steps:
            getattr(machine, action)(*args)
            machine.assert_invariants()


def test_failed_plug_whose_rollback_fails_keeps_its_record():
    """Hole 5: the owner's DEL must still find and remove what the failed plug left."""
    replay(('vifs', POD0, 0, True),
           ('kernel_refuses_next', False),     # the plug fails half-way ...
           ('kernel_refuses_next', True),      # ... and so does its rollback
           ('add', 'p0-s0'))


def test_queued_del_failing_for_a_passing_reason_is_applied_later():
    """Hole 2: a queued DEL refused once by the kernel must not be set aside for good."""
    replay(('vifs', POD0, 0, True),
           ('add', 'p0-s0'),
           ('stop',),
           ('delete', 'p0-s0'),                # queued by the shim: "success"
           ('kernel_refuses_next', True),
           ('restart',))                       # the replay meets the refusal


def test_second_add_of_a_sandbox_stays_in_flight_when_the_first_ends():
    """Hole 12: the first of two ADDs of one sandbox to end must not end the other's mark."""
    replay(('vifs', POD0, 0, False),
           ('add', 'p0-s1'),
           ('add', 'p0-s1'),
           ('time_out', 0))


def test_two_pods_naming_one_port_are_not_both_bound():
    """Hole 8: a port ID is bound to one pod of the node, whatever MAC and IP come with it."""
    replay(('vifs', POD0, 0, True),
           ('add', 'p0-s0'),
           ('vifs', POD1, 2, True),             # pod-1's VIF names pod-0's port
           ('add', 'p1-s0'))


def test_lock_file_of_an_add_killed_before_its_first_record_goes():
    """Found by the state machine: an ADD killed after making the pod's lock file, before
    writing any record, left the lock file for good when the sandbox's DEL came without
    the pod's name (it finds no binding, so takes no lock, so removes none)."""
    replay(('vifs', POD0, 0, False),
           ('add', 'p0-s0', 1),                 # killed right after creating the lock file
           ('delete', 'p0-s0', None, False))    # CNI_ARGS without K8S_POD_NAME


def test_del_of_a_sandbox_whose_add_waits_for_its_vifs_stops_that_add():
    """Found by the state machine (DEL inside RunPodSandbox, before the VIFs exist): the
    DEL finds no binding and answers success; when the VIFs appear, the ADD still
    waiting claims the pod and plugs the sandbox the runtime deleted, whose devices
    then stayed until a GC or a newer sandbox's ADD evicted them. The DEL now marks
    the ADDs of its sandbox in flight, and the ADD, told so at its claim, fails."""
    replay(('add', 'p0-s0'),                    # waits: no VIFs published yet
           ('delete', 'p0-s0'),                 # the runtime gives up on the sandbox
           ('vifs', POD0, 0, True))             # the ADD goes on and plugs it


def test_housekeeping_removes_that_lock_file_while_the_daemon_runs():
    """The same, without a restart: the next housekeeping round removes the free lock file."""
    machine = rp.Protocol()
    replay(('vifs', POD0, 0, False),
           ('add', 'p0-s0', 1),
           ('delete', 'p0-s0', None, False),
           ('housekeeping',),
           ('assert_no_lock_files',),
           machine=machine)


def test_lock_file_of_an_add_killed_before_a_restart_goes():
    """The same across a restart: the registry forgot the dead ADD, so the DEL without
    the pod's name cannot find the pod; PodLocks.remove_unused (restore, housekeeping)
    removes the file. Fails with remove_unused doing nothing."""
    replay(('vifs', POD0, 0, False),
           ('add', 'p0-s0', 1),
           ('restart',),
           ('delete', 'p0-s0', None, False))
