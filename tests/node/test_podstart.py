"""tools/podstart's node-throughput shape, small: it keeps measuring what it says."""

from tests.node import bench
from tools import podstart


def test_shape_at_a_pace_runs_every_pod_and_gives_its_percentiles(
        cluster, node, controller, pods):
    clock = bench.Clock(cluster, node)
    try:
        figures = podstart.run_shape(pods, clock, 'smoke', 10, 5.0,
                                     podstart.NodeSteps(controller, pods, clock))
    finally:
        clock.close()
    # run_shape waited for every pod to run; each of them was seen running by the watch
    # and has its Ready time in the API.
    for way in ('watched', 'api', 'started'):
        assert figures[way]['pods'] == 10, figures
        assert 0 <= figures[way]['p50'] <= figures[way]['p95'] <= figures[way]['p99'], figures
    # Seen running after its creation request, within the tier's bound on a pod start.
    assert 0 < figures['watched']['p50'] < 60, figures
    # A container starts before its pod is Ready (both to the second).
    assert figures['started']['p50'] <= figures['api']['p50'], figures
    # Every pod's steps, from the stand-in control plane's clock: the daemon answers only
    # once the KuryrPort is active, which needs it written first.
    steps = figures['steps']
    for step in podstart.NodeSteps.STEPS + ('Running', 'KuryrPort active → Running'):
        assert steps[step]['pods'] == 10, steps
    assert 0 < steps['KuryrPort written']['p50'] < steps['KuryrPort active']['p50'] \
        < steps['Running']['p50'], steps
    assert steps['KuryrPort active → Running']['p50'] > 0, steps
