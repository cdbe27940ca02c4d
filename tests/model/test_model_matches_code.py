"""Issue 32, item 3: the model and the code stay one.

The model (tests/model/protocol.py) lists, for each path of the real code,
the durable filesystem calls it makes when nothing fails
(``protocol.DURABLE_STEPS``): the points a crash can fall between, which it
explores. Here each path runs in the real code (tests/model/paths.py; every
``open`` for writing, ``write``, ``fsync``, ``rename``, ``unlink`` and
``flock`` of the state modules counted) and its calls must be the model's,
in order: a durable step added to the code without its crash point in the
model fails this test, and so does one the model has and the code lost.

Counting only the paths measured here would miss a durable step on a path
not among them (the adoption's went unnoticed so): so
:func:`test_every_code_path_making_a_durable_call_is_crashed_at` reads the
whole package (tests/model/durable_sites.py: every function calling a durable
function of the wrapped modules) and requires each to be on the stack of a
durable call of some path here, which tests/model/test_crash_points.py then
crashes after.
"""

import pytest

from tests.model import crashpoints
from tests.model import durable_sites
from tests.model import paths
from tests.model import protocol
from tests.model import real_protocol as rp

# Code paths with a durable call that no path crashes at, and why.
NOT_CRASHED = {
    'kuryr_cni.daemon.recovery:_give_up':
        'sets aside a queued DEL that failed, or waited for the watcher\'s list, for '
        'RETRY_AGE_LIMIT (a day): the end of retrying, whose one durable call '
        '(DelQueue.set_aside, a rename) is its last step; the entry is then an operator\'s '
        '(tests/unit/test_recovery.py)',
}


def test_every_path_of_the_model_is_measured_here():
    assert sorted(paths.PATHS) == sorted(protocol.DURABLE_STEPS)


def _run(path):
    """Drive ``path`` on a fresh machine; returns the durable calls of its last worker."""
    given, when = paths.PATHS[path]
    machine = rp.Protocol()
    try:
        given(machine)
        when(machine)
        return paths.calls(machine, machine.last_worker)
    finally:
        machine.stop_daemon()
        machine.teardown_resources()


@pytest.mark.parametrize('path', sorted(paths.PATHS))
def test_the_code_makes_the_models_durable_calls(path):
    assert _run(path) == protocol.DURABLE_STEPS[path], (
        'the code and the model differ on %s: add the crash point to the model '
        '(tests/model/protocol.py STEPS and its planner) or to the code' % path)


def test_every_code_path_making_a_durable_call_is_crashed_at():
    sites = durable_sites.call_sites()
    assert set(NOT_CRASHED) <= sites, 'stale exceptions: %s' % (set(NOT_CRASHED) - sites)
    crashpoints.SITES.clear()
    for path in sorted(paths.PATHS):
        _run(path)
    missing = sites - crashpoints.SITES - set(NOT_CRASHED)
    assert not missing, (
        'code paths making durable calls that no path of tests/model/paths.py drives, so '
        'no crash point covers them: %s; add a path (and its DURABLE_STEPS) that runs them'
        % sorted(missing))
