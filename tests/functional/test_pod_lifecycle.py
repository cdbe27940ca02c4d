"""Pods through the real shim and daemon: ADD, DEL, and many at once."""

import concurrent.futures

import pytest

from kuryr_cni.binding import owner_tag
from tools.testbed import host as testhost

from tests.functional import conftest
from tests.functional import helpers

pytestmark = pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON)


def test_add_then_del_leaves_nothing_behind(daemon, runtime):
    node = daemon
    (sandbox,) = helpers.make_pods(node, [7])
    outcome = runtime.add(sandbox)
    assert outcome.ok, outcome
    assert outcome.output['ips'] == [{'address': '10.10.0.7/24', 'gateway': testhost.GATEWAY,
                                      'interface': 0}]
    assert outcome.output['interfaces'][0]['sandbox'] == sandbox.netns
    assert node.ping(sandbox.netns, testhost.GATEWAY)
    assert helpers.metric(node, 'kuryr_cni_attachments') == 1

    assert runtime.delete(sandbox).ok
    assert helpers.leftovers(node) == helpers.NOTHING
    assert 'eth0' not in node.links(sandbox.netns)
    assert helpers.metric(node, 'kuryr_cni_attachments') == 0
    # The runtime's second DEL, without a netns, and a repeated one: both succeed.
    assert runtime.delete(sandbox, netns='').ok
    assert runtime.execute('DEL', sandbox).ok
    assert helpers.leftovers(node) == helpers.NOTHING
    assert helpers.metric(node, 'kuryr_cni_requests_total', command='DEL', result='noop') == 2


def test_fifty_pods_at_once_get_working_distinct_interfaces(daemon, runtime):
    node = daemon
    sandboxes = helpers.make_pods(node, range(20, 70))
    with concurrent.futures.ThreadPoolExecutor(50) as pool:
        outcomes = list(pool.map(runtime.add, sandboxes))
    assert [o.code for o in outcomes] == [0] * 50, [o.output for o in outcomes if not o.ok]

    host_links = node.links()
    bridge_index = host_links[testhost.BRIDGE]['index']
    macs = set()
    for index, sandbox in zip(range(20, 70), sandboxes):
        assert node.addresses(sandbox.netns, 'eth0') == {'10.10.0.%d/24' % index}
        macs.add(node.links(sandbox.netns)['eth0'].get('address'))
        host_end = host_links[owner_tag.host_ifname(sandbox.container_id, 'eth0')]
        assert host_end.get('master') == bridge_index
    assert len(macs) == 50
    assert all(node.ping(s.netns, testhost.GATEWAY) for s in sandboxes[::7])
    assert node.ping(sandboxes[0].netns, '10.10.0.69')        # pod to pod across the bridge
    assert helpers.metric(node, 'kuryr_cni_attachments') == 50

    with concurrent.futures.ThreadPoolExecutor(50) as pool:
        assert all(o.ok for o in pool.map(runtime.delete, sandboxes))
    assert helpers.leftovers(node) == helpers.NOTHING
