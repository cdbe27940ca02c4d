"""The operator's binding policy through the real shim and daemon (issue 20, DESIGN §4.3).

Under the annotation source whoever can edit a pod writes its VIFs. The
daemon here runs with its default ``[binding] bridges`` (``kuryr-br0``,
``br-int``, ``qbr*``) plus ``evbr*``, and ``[binding] parents`` empty. Each
refused ADD must exit with one CNI error (code 7) and leave the daemon's
state and every device exactly as they were; the node also holds a
management bridge with an address of its own, which no pod may join.
"""

import json

import pytest

from tools.testbed import host as testhost
from tools.testbed import runtime as testruntime

from tests.functional import cni_world
from tests.functional import conftest

pytestmark = pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON)

MGMT_BRIDGE = 'br-mgmt'
MGMT_ADDRESS = '192.168.77.1'
POLICY = '\n[binding]\nbridges = kuryr-br0, br-int, qbr*, evbr*\n'


@pytest.fixture(scope='module')
def world(tmp_path_factory):
    with testhost.Host(prefix=conftest.SESSION_PREFIX) as host:
        host.start_api()
        host.start_daemon(workers=2, vif_timeout=10, extra=POLICY)
        yield cni_world.World(host, str(tmp_path_factory.mktemp('policy-world')))


@pytest.fixture
def mgmt(world):
    """A second host bridge holding the node's management address (not on the list)."""
    ns = world.host.ns
    testhost.ip('-n', ns, 'link', 'add', MGMT_BRIDGE, 'type', 'bridge')
    testhost.ip('-n', ns, 'addr', 'add', MGMT_ADDRESS + '/24', 'dev', MGMT_BRIDGE)
    testhost.ip('-n', ns, 'link', 'set', MGMT_BRIDGE, 'up')
    yield MGMT_BRIDGE
    testhost.ip('-n', ns, 'link', 'del', MGMT_BRIDGE)


@pytest.fixture
def clean(world):
    yield world
    world.clean()


def annotated(world, runtime, name, vif):
    """A pod whose annotation holds ``vif`` as eth0, and its sandbox (DELed by clean)."""
    world.host.api.create_pod('default', name, testhost.NODE, uid='uid-' + name,
                              annotations={'kuryr.openstack.org/vifs':
                                           json.dumps({'eth0': vif})})
    world.pods.append(('default', name))
    sandbox = testruntime.Sandbox('cid-' + name, world.host.pod_netns(), name,
                                  pod_uid='uid-' + name)
    world.made.append((runtime, sandbox))
    return sandbox


def vif_of(index, **changes):
    """The test host's bridge VIF of pod ``index`` with ``changes``."""
    return dict(testhost.Host.vifs(index)['eth0'], **changes)


def assert_refused(outcome, code, *words):
    assert not outcome.ok
    assert outcome.error_code == code, outcome.output
    for word in words:
        assert word in outcome.output['msg'], outcome.output


UNLISTED = [
    pytest.param({'bridge': MGMT_BRIDGE, 'ips': ['192.168.77.5/24'],
                  'gateway': MGMT_ADDRESS}, 'bridge br-mgmt', id='bridge br-mgmt'),
    pytest.param({'kind': 'ovs', 'bridge': MGMT_BRIDGE}, 'bridge br-mgmt', id='ovs br-mgmt'),
    pytest.param({'kind': 'ovs', 'bridge': 'br-ex'}, 'bridge br-ex', id='ovs br-ex'),
    pytest.param({'kind': 'macvlan', 'bridge': None, 'parent': 'lo'}, 'parent lo',
                 id='macvlan on lo'),
    pytest.param({'kind': 'vlan', 'bridge': None, 'parent': MGMT_BRIDGE, 'vlan_id': 7},
                 'parent br-mgmt', id='vlan on br-mgmt'),
]


@pytest.mark.parametrize('changes, named', UNLISTED)
def test_a_vif_naming_what_is_not_on_the_lists_is_refused_and_changes_nothing(
        world, clean, mgmt, changes, named):
    runtime = world.runtime()
    index = world._next_index()
    sandbox = annotated(world, runtime, 'intruder-%d' % index, vif_of(index, **changes))
    before = world.snapshot()

    outcome = runtime.add(sandbox)

    assert_refused(outcome, 7, named, '[binding]')
    assert world.snapshot() == before
    mgmt_ports = [n for n, link in world.host.links().items() if link.get('master') == mgmt]
    assert mgmt_ports == []
    assert set(world.host.links(sandbox.netns)) == {'lo'}


def test_a_pod_copying_a_live_pods_ip_and_mac_is_refused_and_changes_nothing(world, clean):
    runtime = world.runtime()
    victim, index = world.pod(runtime)
    assert runtime.add(victim).ok
    copycat = annotated(world, runtime, 'copycat', vif_of(index, port_id='port-copycat'))
    before = world.snapshot()

    outcome = runtime.add(copycat)

    assert_refused(outcome, 7, cni_world.address(index).split('/')[0],
                   cni_world.mac(index), 'bound to another pod')
    assert 'default/pod-' not in outcome.output['msg']     # other pods are not named
    assert world.snapshot() == before
    assert world.host.ping(victim.netns, testhost.GATEWAY)


@pytest.mark.parametrize('copied', ['ip', 'mac'])
def test_a_pod_copying_one_address_is_refused_until_its_holder_is_gone(world, clean, copied):
    runtime = world.runtime()
    holder, index = world.pod(runtime)
    assert runtime.add(holder).ok
    mine = world._next_index()
    vif = vif_of(mine, port_id='port-late')
    if copied == 'ip':
        vif['ips'] = [cni_world.address(index)]
    else:
        vif['mac'] = cni_world.mac(index)
    late = annotated(world, runtime, 'late-%s' % copied, vif)

    assert_refused(runtime.add(late), 7, 'bound to another pod')
    assert runtime.delete(holder).ok

    outcome = runtime.add(late)

    assert outcome.ok, outcome.output


def test_pods_naming_new_bridges_leave_no_bridge_behind(world, clean):
    runtime = world.runtime()
    before = set(world.host.links())
    outcomes = {}
    for n in range(5):
        index = world._next_index()
        # evbr0..4 are on the list (evbr*) yet missing; xvbr0..4 are not on it.
        for name in ('evbr%d' % n, 'xvbr%d' % n):
            sandbox = annotated(world, runtime, 'pod-%s' % name,
                                vif_of(index, bridge=name, port_id='port-' + name))
            outcomes[name] = runtime.add(sandbox)
            assert runtime.delete(sandbox).ok

    for name, outcome in sorted(outcomes.items()):
        if name.startswith('evbr'):
            assert_refused(outcome, 101, 'bridge %s does not exist' % name)
        else:
            assert_refused(outcome, 7, 'bridge %s' % name, 'not in [binding] bridges')
    assert set(world.host.links()) == before


def test_a_bridge_vif_naming_another_ports_qbr_is_refused_and_changes_nothing(world, clean):
    """Issue 31 hole 3: an untagged qbr (a Nova iptables_hybrid instance's, or left by
    kuryr-daemon) matches the default ``qbr*`` yet is that port's private firewall bridge."""
    qbr = 'qbr5d0b1c2a-3f'
    testhost.ip('-n', world.host.ns, 'link', 'add', qbr, 'type', 'bridge')
    try:
        runtime = world.runtime()
        index = world._next_index()
        sandbox = annotated(world, runtime, 'qbr-joiner', vif_of(index, bridge=qbr))
        before = world.snapshot()

        outcome = runtime.add(sandbox)

        assert_refused(outcome, 7, 'bridge %s' % qbr, 'private bridge')
        assert world.snapshot() == before
        assert [n for n, link in world.host.links().items()
                if link.get('master') == world.host.links()[qbr]['index']] == []
        assert set(world.host.links(sandbox.netns)) == {'lo'}
    finally:
        testhost.ip('-n', world.host.ns, 'link', 'del', qbr)
