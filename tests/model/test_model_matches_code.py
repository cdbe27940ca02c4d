"""Issue 32, item 3: the model and the code stay one.

The model (tests/model/protocol.py) lists, for each path of the real code,
the durable filesystem calls it makes when nothing fails
(``protocol.DURABLE_STEPS``): the points a crash can fall between, which it
explores. Here each path runs in the real code (tests/model/paths.py; every
``open`` for writing, ``write``, ``fsync``, ``rename``, ``unlink`` and
``flock`` of the state modules counted) and its calls must be the model's,
in order: a durable step added to the code without its crash point in the
model fails this test, and so does one the model has and the code lost.
"""

import pytest

from tests.model import paths
from tests.model import protocol
from tests.model import real_protocol as rp


def test_every_path_of_the_model_is_measured_here():
    assert sorted(paths.PATHS) == sorted(protocol.DURABLE_STEPS)


@pytest.mark.parametrize('path', sorted(paths.PATHS))
def test_the_code_makes_the_models_durable_calls(path):
    given, when = paths.PATHS[path]
    machine = rp.Protocol()
    try:
        given(machine)
        when(machine)
        measured = paths.calls(machine, machine.last_worker)
    finally:
        machine.stop_daemon()
        machine.teardown_resources()
    assert measured == protocol.DURABLE_STEPS[path], (
        'the code and the model differ on %s: add the crash point to the model '
        '(tests/model/protocol.py STEPS and its planner) or to the code' % path)
