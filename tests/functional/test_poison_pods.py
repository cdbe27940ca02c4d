"""One tenant's pod cannot take the node's CNI down (issue 31, hole 1).

The real daemon watches the API stand-in while the node holds what used to
wedge its watch: a pod with a 1.4 MiB env value of commas (once counted as
1.4 million JSON values), a pod whose metadata holds more JSON values than
one object may (read for its identity alone), and 10,000 Failed pods that
kept their node (once past the object cap). Each test prints the watcher's
peak resident size and the feed's lag (``pytest -s``); the figures are
quoted in doc/source/scale.rst.
"""

import json
import time

import pytest

from kuryr_cni import listwatch
from tools.testbed import host as testhost
from tools.testbed import runtime as testruntime

from tests import wait
from tests.functional import conftest
from tests.functional import crash
from tests.functional import helpers
from tests.functional import hostile_api

pytestmark = pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON)

FAILED_PODS = 10000
POISON_BYTES = 1400 * 1024
# The watcher's peak resident size, whatever the node holds (measured ~60 MiB).
PEAK_RSS_MIB = 160


def pod(name, phase='Running', env_value='', annotations=None):
    return {'metadata': {'name': name, 'namespace': 'default', 'uid': 'uid-' + name,
                         'annotations': annotations or {}},
            'spec': {'nodeName': testhost.NODE, 'containers': [
                {'name': 'main', 'image': 'pause', 'env': [{'name': 'X', 'value': env_value}]}]},
            'status': {'phase': phase}}


def served_pod(node, index):
    """A pod with its VIFs, and its sandbox."""
    name = 'pod-%d' % index
    node.api.create('pods', pod(name, annotations={
        'kuryr.openstack.org/vifs': json.dumps(node.vifs(index))}))
    return testruntime.Sandbox('cid-%d' % index, node.pod_netns(), name, pod_uid='uid-' + name)


def commas(name):
    return pod(name, env_value=',' * POISON_BYTES)


def oversize(name):
    return pod(name, annotations={'k%d' % i: '' for i in range(listwatch.MAX_OBJECT_VALUES + 1000)})


def terminated(index):
    return pod('done-%d' % index, phase=('Failed', 'Succeeded')[index % 2])


# What the node holds before the daemon starts, and what comes through the watch.
SCENARIOS = {
    'nothing else': ((), ()),
    '10000 terminated pods': ([terminated(i) for i in range(FAILED_PODS)], ()),
    'a 1.4 MiB pod of commas': ([commas('poison-0')], [commas('poison-1')]),
    'a pod of 263k annotations': ([oversize('poison-0')], [oversize('poison-1')]),
}


@pytest.mark.parametrize('scenario', sorted(SCENARIOS))
def test_what_used_to_wedge_the_watch_leaves_the_feed_working(node, runtime, scenario):
    listed, watched = SCENARIOS[scenario]
    for obj in listed:
        node.api.create('pods', obj)
    first = served_pod(node, 5)
    started = time.monotonic()
    node.start_daemon(workers=2, vif_timeout=20)           # ready: listed and synced
    synced_after = time.monotonic() - started
    [watcher] = crash.titled(node, crash.WATCHER_TITLE)
    assert runtime.add(first).ok

    for obj in watched:                 # through the watch: the poison, then a pod served
        node.api.create('pods', obj)
    created = time.monotonic()
    outcome = runtime.add(served_pod(node, 6))
    lag = time.monotonic() - created
    assert outcome.ok, outcome

    peak, now = hostile_api.peak_rss_mib(watcher)
    print('\nwatcher, %s: synced %.2f s after start; a pod created after the watched '
          'poison served in %.2f s; peak RSS %.1f MiB (%.1f now)'
          % (scenario, synced_after, lag, peak, now))
    assert peak < PEAK_RSS_MIB
    assert crash.health(node, 'ready')[0] == 200
    assert crash.titled(node, crash.WATCHER_TITLE) == [watcher]     # never restarted
    assert helpers.metric(node, 'kuryr_cni_watch_limit_exceeded_total',
                          limit='object_size') == 0
    too_large = helpers.metric(node, 'kuryr_cni_watch_objects_skipped_total',
                               reason='too_large')
    if 'annotations' in scenario:
        assert too_large == 2
        # The oversize pod's ADD fails at once, saying why; it is logged.
        refused = runtime.add(testruntime.Sandbox('cid-o', node.pod_netns(), 'poison-1',
                                                  pod_uid='uid-poison-1'))
        assert not refused.ok and 'too large to read' in json.dumps(refused.output), refused
        wait.until(lambda: 'Skipping default/poison-1' in node.log_tail(400), 10, 'the log')
    else:
        assert too_large == 0
