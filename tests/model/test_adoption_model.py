"""Issue 32 item 1 for the adoption: its model explored exhaustively, and shown to need
its rules (tests/model/adoption_model.py)."""

import os

import pytest

from tests.model import adoption_model as model

LONG = os.environ.get('KURYR_CNI_MODEL_LONG') == '1'
CRASHES = 8 if LONG else 4


def _report(bounds, result):
    print('adoption model %s: %d states, %d transitions, %d ends checked, %.2f s '
          '(%.2f s CPU)%s' % (bounds, result.states, result.transitions, result.ends,
                              result.seconds, result.cpu_seconds,
                              '' if result.violation is None else ': ' + result.violation))


@pytest.mark.parametrize('add_n', [True, False], ids=['new-sandbox', 'no-new-sandbox'])
def test_adoption_keeps_its_invariants_with_a_crash_at_every_step(add_n):
    # Without a new sandbox, nothing but K's own DEL can remove K's port.
    bounds = model.Bounds(crashes=CRASHES, add_n=add_n)
    result = model.explore(bounds)
    _report(bounds, result)
    assert result.violation is None, (result.violation, result.trace)
    assert result.ends > 0


def test_tagging_before_the_record_leaves_a_tag_no_binding_names():
    result = model.explore(model.Bounds(record_first=False))
    assert result.violation.startswith('a tagged port no binding names'), result.violation
    assert result.trace[-1] == 'kill DEL K before adopt_record', result.trace


def test_an_add_that_does_not_evict_leaves_the_iface_id_on_two_ports():
    result = model.explore(model.Bounds(evict_at_add=False))
    assert result.violation.startswith('ADD N answered'), result.violation


def test_an_adoption_that_does_not_ask_the_fence_binds_one_port_to_two_pods():
    result = model.explore(model.Bounds(fence_at_adoption=False))
    assert result.violation.startswith("two pods hold K's port"), result.violation


def test_a_queued_del_replayed_before_the_pods_are_listed_leaves_the_port():
    result = model.explore(model.Bounds(add_n=False, defer_until_listed=False))
    assert result.violation.startswith("after K's DEL answered and recovery, left: K's port"), \
        result.violation


def test_a_live_del_answered_before_the_pods_are_listed_leaves_the_port():
    # The daemon's socket opens before the watcher's first list: a DEL that answered
    # success then, proving nothing, would leave kuryr-daemon's port for good.
    result = model.explore(model.Bounds(add_n=False, fail_until_listed=False))
    assert result.violation.startswith("after K's DEL answered and recovery, left: K's port"), \
        result.violation
