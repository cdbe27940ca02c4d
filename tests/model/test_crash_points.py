"""Every crash point of every path, exhaustively (issue 32, item 2).

The state machine draws its crash points at random; here each path of
tests/model/paths.py (the model's DURABLE_STEPS) is run from its given state
once for every point a crash can fall on: before its first durable call and
after each. After the crash the runtime does what it does (retries the DEL,
DELs the sandbox whose ADD failed), the daemon restarts and recovers, and
every invariant of tests/model/real_protocol.py must hold, as must the
wind-down's: nothing of a deleted sandbox remains, and after every DEL nothing
at all.
"""

import pytest

from tests.model import paths
from tests.model import protocol
from tests.model import real_protocol as rp

POINTS = [(path, n) for path in sorted(paths.PATHS)
          for n in range(len(protocol.DURABLE_STEPS[path]) + 1)]


@pytest.mark.parametrize('path,crash_after', POINTS,
                         ids=['%s-%d' % point for point in POINTS])
def test_a_crash_here_loses_nothing(path, crash_after):
    given, when = paths.PATHS[path]
    with rp.Protocol().driven() as machine:
        given(machine)
        machine.assert_invariants()
        when(machine, crash_after)
        machine.assert_invariants()
