"""The race this project exists for (DESIGN §1), through the real shim and daemon.

ADD A fails, DEL A, ADD B succeeds, and DEL A arrives again before, during
(while ADD B waits for its VIF) or after ADD B. Pod B must keep its interface,
addresses and bridge port and keep pinging its gateway; the stale-DEL metric
counts exactly the DELs that were rejected.
"""

import concurrent.futures
import json

import pytest

from kuryr_cni.binding import owner_tag
from tools.testbed import host as testhost
from tools.testbed import runtime as testruntime

from tests.functional import conftest
from tests.functional import helpers

pytestmark = pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON)

POD = 'web-0'
INDEX = 5
ADDRESS = '10.10.0.5/24'


@pytest.fixture
def pod(node):
    return node.api.create_pod('default', POD, testhost.NODE, uid='uid-web-0',
                               annotations={'kuryr.openstack.org/vifs':
                                            json.dumps(node.vifs(INDEX, active=False))})


def _sandboxes(node):
    return [testruntime.Sandbox('sandbox-%s' % letter, node.pod_netns(), POD, pod_uid='uid-web-0')
            for letter in 'AB']


def _activate(node):
    node.api.set_vifs('default', POD, node.vifs(INDEX, active=True))


def assert_connected(node, sandbox):
    links = node.links(sandbox.netns)
    assert 'eth0' in links
    assert links['eth0'].get('address') == 'fa:16:3e:00:00:05'
    assert node.addresses(sandbox.netns, 'eth0') == {ADDRESS}
    host_end = node.links()[owner_tag.host_ifname(sandbox.container_id, 'eth0')]
    assert host_end.get('ifalias') == owner_tag.alias(sandbox.container_id, 'eth0')
    bridge_index = node.links()[testhost.BRIDGE]['index']
    assert host_end.get('master') == bridge_index
    assert node.ping(sandbox.netns, testhost.GATEWAY)


def _fail_add_a(node, runtime, a):
    outcome = runtime.add(a)
    assert outcome.code != 0 and outcome.error_code == 11, outcome
    assert runtime.delete(a).ok


@pytest.mark.parametrize('vif_timeout', [2])
def test_late_del_before_add_b(daemon, runtime, pod):
    node = daemon
    a, b = _sandboxes(node)
    _fail_add_a(node, runtime, a)
    assert runtime.execute('DEL', a).ok         # the retry, still before B: nothing to do
    _activate(node)
    assert runtime.add(b).ok
    assert_connected(node, b)
    assert helpers.stale_dels(node) == {'container_id_mismatch': 0, 'pod_uid_mismatch': 0}


@pytest.mark.parametrize('vif_timeout', [2])
def test_late_del_while_add_b_waits_for_its_vif(daemon, runtime, pod):
    node = daemon
    a, b = _sandboxes(node)
    _fail_add_a(node, runtime, a)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        add_b = helpers.add_in_background(pool, node, runtime, b)
        assert runtime.execute('DEL', a).ok     # B owns the pod and waits for its VIF
        assert not add_b.done()
        _activate(node)
        assert add_b.result(timeout=30).ok
    assert_connected(node, b)
    assert helpers.stale_dels(node)['container_id_mismatch'] == 1


@pytest.mark.parametrize('vif_timeout', [2])
def test_late_del_after_add_b(daemon, runtime, pod):
    node = daemon
    a, b = _sandboxes(node)
    _fail_add_a(node, runtime, a)
    _activate(node)
    assert runtime.add(b).ok
    for _ in range(3):                          # retried, and retried again
        assert runtime.execute('DEL', a).ok
        assert_connected(node, b)
    assert helpers.stale_dels(node)['container_id_mismatch'] == 3


def test_replaced_sandbox_is_evicted_and_its_late_del_rejected(daemon, runtime, pod):
    node = daemon
    _activate(node)
    a, b = _sandboxes(node)
    assert runtime.add(a).ok
    assert_connected(node, a)
    assert runtime.add(b).ok                    # A never got its DEL: B evicts A's devices
    assert owner_tag.host_ifname(a.container_id, 'eth0') not in node.links()
    assert 'eth0' not in node.links(a.netns)
    assert runtime.execute('DEL', a).ok
    assert_connected(node, b)
    assert helpers.stale_dels(node)['container_id_mismatch'] == 1
    assert helpers.metric(node, 'kuryr_cni_sandbox_evictions_total') == 1


def test_del_of_another_incarnation_is_fenced_by_uid(daemon, runtime, pod):
    node = daemon
    _activate(node)
    old = testruntime.Sandbox('sandbox-old', node.pod_netns(), POD, pod_uid='uid-web-0-old')
    new = testruntime.Sandbox('sandbox-new', node.pod_netns(), POD, pod_uid='uid-web-0')
    assert runtime.add(new).ok
    assert runtime.execute('DEL', old).ok
    assert_connected(node, new)
    assert helpers.stale_dels(node) == {'container_id_mismatch': 0, 'pod_uid_mismatch': 1}
