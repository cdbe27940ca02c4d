"""The KuryrPort VIF source end to end: API stand-in, real daemon, real shim, real kernel.

The daemon runs with ``[cni_daemon] vif_source = kuryrport``; the test plays
kuryr-controller by creating and updating KuryrPort objects (os-vif
primitives from tests/unit/osvif_fixtures.py) in the wire-level API
stand-in, and plays the runtime with the real shim. The node's bridge holds
both gateways, so the dual-stack pod pings them.
"""

import concurrent.futures

import pytest

from kuryr_cni import osvif
from tools.testbed import host as testhost
from tools.testbed import runtime as testruntime
from tests import wait
from tests.functional import conftest
from tests.functional import helpers
from tests.unit import osvif_fixtures as fx

pytestmark = pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON)

POD = 'web-0'
UID = 'uid-web-0'
MAC = 'fa:16:3e:98:7b:05'
GATEWAY6 = 'fd10::1'
KURYRPORT_SOURCE = '\n[cni_daemon]\nvif_source = kuryrport\n'


def network(subnet4='10.10.0', subnet6='fd10::'):
    return fx.network([
        fx.subnet(subnet4 + '.0/24', [subnet4 + '.5'], gateway=subnet4 + '.1',
                  routes=[{'cidr': '192.168.0.0/16', 'gateway': subnet4 + '.254'}]),
        fx.subnet(subnet6 + '/64', [subnet6 + '5'], gateway=subnet6 + '1'),
    ])


def bridge_status(active):
    return {'vifs': fx.status_vifs(fx.bridge_vif(
        active=active, bridge_name=testhost.BRIDGE, network=network()))}


@pytest.fixture
def source(node, vif_timeout):
    testhost.ip('-n', node.ns, 'addr', 'add', GATEWAY6 + '/64', 'dev', testhost.BRIDGE, 'nodad')
    node.start_daemon(workers=2, vif_timeout=vif_timeout, extra=KURYRPORT_SOURCE)
    return node


def _sandbox(node, letter='A', pod_uid=UID):
    return testruntime.Sandbox('sandbox-%s' % letter, node.pod_netns(), POD, pod_uid=pod_uid)


def _kuryrport(node, status=None, pod_uid=UID, static=False):
    return node.api.create_kuryrport('default', POD, testhost.NODE,
                                     spec={'podUid': pod_uid, 'podStatic': static,
                                           'podNodeName': testhost.NODE},
                                     status=status or {'vifs': {}})


def _wait_for_event(node, reason, timeout=10):
    """Events are posted from a background thread: look in the stand-in's store, bounded."""
    return wait.until(lambda: [e for e in node.api.events() if e['reason'] == reason],
                      timeout, 'a %s Event' % reason)


def assert_connected(node, sandbox):
    eth0 = node.links(sandbox.netns)['eth0']
    assert eth0.get('address') == MAC and eth0.get('mtu') == 1450
    assert node.addresses(sandbox.netns, 'eth0') == {'10.10.0.5/24', 'fd10::5/64'}
    assert node.ping(sandbox.netns, testhost.GATEWAY)
    assert node.ping(sandbox.netns, GATEWAY6)


@pytest.mark.parametrize('vif_timeout', [20])
def test_add_waits_for_the_kuryrport_and_its_activation(source, runtime):
    node = source
    node.api.create_pod('default', POD, testhost.NODE, uid=UID)
    sandbox = _sandbox(node)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        add = helpers.add_in_background(pool, node, runtime, sandbox, published=False)
        _kuryrport(node)                                  # created, no VIFs yet
        node.api.update_kuryrport('default', POD, status=bridge_status(active=False))
        assert not add.done()
        node.api.update_kuryrport('default', POD, status=bridge_status(active=True))
        outcome = add.result(timeout=30)
    assert outcome.ok, outcome
    assert {ip['address'] for ip in outcome.output['ips']} == {'10.10.0.5/24', 'fd10::5/64'}
    assert_connected(node, sandbox)
    assert runtime.delete(sandbox).ok
    assert helpers.leftovers(node) == helpers.NOTHING


@pytest.mark.parametrize('vif_timeout', [5])
def test_static_pod_skips_the_uid_fence(source, runtime):
    node = source
    _kuryrport(node, bridge_status(active=True), pod_uid='mirror-pod-uid', static=True)
    sandbox = _sandbox(node, pod_uid='static-config-hash')     # what kubelet passes
    outcome = runtime.add(sandbox)
    assert outcome.ok, outcome
    assert_connected(node, sandbox)


@pytest.mark.parametrize('vif_timeout', [1])
def test_another_incarnations_kuryrport_is_not_used(source, runtime):
    node = source
    _kuryrport(node, bridge_status(active=True), pod_uid='uid-of-an-older-web-0')
    outcome = runtime.add(_sandbox(node))
    assert outcome.error_code == 11 and 'timed out' in outcome.output['msg'], outcome
    [event] = _wait_for_event(node, 'CNITimeoutKuryrPortRegistry')
    assert event['involvedObject']['uid'] == UID


@pytest.mark.parametrize('vif_timeout', [20])
def test_pod_deleted_before_its_kuryrport_fails_fast(source, runtime):
    node = source
    node.api.create_pod('default', POD, testhost.NODE, uid=UID)
    sandbox = _sandbox(node)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        add = helpers.add_in_background(pool, node, runtime, sandbox, published=False)
        node.api.delete_pod('default', POD)
        outcome = add.result(timeout=30)
    # Not the VIF timeout's "timed out waiting": the deletion itself ended the wait.
    assert outcome.error_code == 11
    assert 'was deleted before its VIFs were published' in outcome.output['msg']
    assert runtime.delete(sandbox).ok
    assert helpers.leftovers(node) == helpers.NOTHING


@pytest.mark.parametrize('vif_timeout', [1])
def test_timeouts_become_events_on_the_pod(source, runtime):
    node = source
    node.api.create_pod('default', POD, testhost.NODE, uid=UID)
    outcome = runtime.add(_sandbox(node, 'A'))
    assert outcome.error_code == 11
    [event] = _wait_for_event(node, 'CNITimeoutKuryrPortRegistry')
    assert event['type'] == 'Warning' and event['metadata']['namespace'] == 'default'
    assert event['involvedObject'] == {'apiVersion': 'v1', 'kind': 'Pod', 'namespace': 'default',
                                       'name': POD, 'uid': UID}
    assert event['source'] == {'component': 'kuryr-daemon', 'host': testhost.NODE}

    _kuryrport(node, bridge_status(active=False))
    outcome = runtime.add(_sandbox(node, 'B'))
    assert outcome.error_code == 11
    [event] = _wait_for_event(node, 'CNITimedOutWaitingForActiveVIFs')
    assert 'to become ACTIVE after binding (inactive: eth0 port %s)' % fx.PORT_ID \
        in event['message']


@pytest.mark.parametrize('vif_timeout', [10])
def test_open_vswitch_vif_from_a_kuryrport(node, vif_timeout, br_int, runtime):
    switch = br_int
    node.start_daemon(workers=2, vif_timeout=vif_timeout, extra=KURYRPORT_SOURCE + (
        '\n[binding]\novsdb_connection = %s\n' % switch.connection))
    try:
        status = {'vifs': fx.status_vifs(fx.ovs_vif(network=network('10.20.0', 'fd20::')))}
        _kuryrport(node, status)
        sandbox = _sandbox(node)
        outcome = runtime.add(sandbox)
        assert outcome.ok, outcome
        [port] = switch.ports('br-int')
        ids = dict(switch.interface(port)['external_ids'][1])
        assert ids['iface-id'] == fx.PORT_ID and ids['attached-mac'] == MAC
        assert ids['container-id'] == sandbox.container_id
        assert node.ping(sandbox.netns, '10.20.0.1')
        assert runtime.delete(sandbox).ok
        assert switch.ports('br-int') == set()
    finally:
        node.stop_daemon()


@pytest.mark.parametrize('kind', sorted(osvif.KURYR_DAEMON_ONLY))
@pytest.mark.parametrize('vif_timeout', [5])
def test_kinds_only_kuryr_daemon_plugs_are_refused_naming_them(source, runtime, kind):
    """vhost-user and DPDK-nested ports, which kuryr-daemon 10.0.0 plugged: code 7, nothing made."""
    node = source
    node.api.create_pod('default', POD, testhost.NODE, uid=UID)
    vif = fx.ovs_vif()
    vif['versioned_object.name'] = kind
    _kuryrport(node, {'vifs': fx.status_vifs(vif)})
    sandbox = _sandbox(node)
    before = node.links(sandbox.netns)
    outcome = runtime.add(sandbox)
    assert outcome.error_code == 7, outcome
    assert ("is a '%s'; supported: VIFBridge, VIFOpenVSwitch, VIFVlanNested, VIFMacvlanNested; "
            '%s (%s) is plugged by kuryr-daemon only: its pods must stay on kuryr-daemon'
            % (kind, kind, osvif.KURYR_DAEMON_ONLY[kind])) in outcome.output['msg'], outcome
    assert node.links(sandbox.netns) == before
    assert runtime.delete(sandbox).ok
    assert helpers.leftovers(node) == helpers.NOTHING
