"""Every VIF kind through the real shim and daemon: the DESIGN §1 race, eviction, dual stack.

For ``macvlan`` and ``vlan`` the node namespace gets a veth pair standing in
for the VM's trunk port: ``trunk0`` is the parent (named by the daemon's
``[binding] link_iface``, the VIFs name none); its peer lives in a "router"
namespace holding the dual-stack gateways (on VLAN 100 of the peer for
``vlan``). For ``ovs`` a private ``ovsdb-server`` and ``ovs-vswitchd``
(userspace datapath) run for the test, the daemon reaches them through
``[binding] ovsdb_connection``, and the bridge's own port holds the
gateways. ``vlan`` skips where the kernel has no 802.1Q support.
"""

import concurrent.futures
import json

import pytest

from kuryr_cni.binding import owner_tag
from tools.testbed import host as testhost
from tools.testbed import ovs as testovs
from tools.testbed import runtime as testruntime

from tests.functional import conftest
from tests.functional import helpers

pytestmark = pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON)

POD = 'web-0'
UID = 'uid-web-0'
MAC = 'fa:16:3e:00:00:05'
VLAN_ID = 100
OVS_BRIDGE = 'br-int'
SUBNET = {'macvlan': ('10.30.0', 'fd30::'), 'vlan': ('10.30.0', 'fd30::'),
          'ovs': ('10.40.0', 'fd40::')}


class World:
    """The node's data path for one kind, and how to look at a sandbox in it."""

    def __init__(self, node, kind):
        self.node = node
        self.kind = kind
        self.ovs = None
        v4, v6 = SUBNET[kind]
        self.gateways = (v4 + '.1', v6 + '1')
        if kind == 'ovs':
            self.ovs = testovs.PrivateOVS(node.ns)
            self.ovs.add_bridge(OVS_BRIDGE)
            self._gateways_on(node.ns, OVS_BRIDGE)
            self.config = '\n[binding]\novsdb_connection = %s\n' % self.ovs.connection
        else:
            router = node.pod_netns()          # removed with the node
            testhost.ip('-n', node.ns, 'link', 'add', 'trunk0', 'type', 'veth', 'peer',
                        'name', 'peer0', 'netns', router.rsplit('/', 1)[1])
            testhost.ip('-n', node.ns, 'link', 'set', 'trunk0', 'up')
            name = router.rsplit('/', 1)[1]
            testhost.ip('-n', name, 'link', 'set', 'peer0', 'up')
            device = 'peer0'
            if kind == 'vlan':
                device = 'peer0.%d' % VLAN_ID
                testhost.ip('-n', name, 'link', 'add', 'link', 'peer0', 'name', device,
                            'type', 'vlan', 'id', str(VLAN_ID))
            self._gateways_on(name, device)
            self.config = '\n[binding]\nlink_iface = trunk0\n'

    def _gateways_on(self, ns, device):
        testhost.ip('-n', ns, 'addr', 'add', self.gateways[0] + '/24', 'dev', device)
        testhost.ip('-n', ns, 'addr', 'add', self.gateways[1] + '/64', 'dev', device, 'nodad')
        testhost.ip('-n', ns, 'link', 'set', device, 'up')

    def vifs(self, active):
        v4, v6 = SUBNET[self.kind]
        vif = {'kind': self.kind, 'port_id': 'port-5', 'mac': MAC, 'mtu': 1450,
               'ips': [v4 + '.5/24', v6 + '5/64'], 'gateway': list(self.gateways),
               'active': active}
        if self.kind == 'ovs':
            vif['bridge'] = OVS_BRIDGE
        if self.kind == 'vlan':
            vif['vlan_id'] = VLAN_ID
        return {'eth0': vif}

    def assert_connected(self, sandbox):
        node = self.node
        eth0 = node.links(sandbox.netns).get('eth0')
        assert eth0 is not None and eth0.get('address') == MAC
        v4, v6 = SUBNET[self.kind]
        assert node.addresses(sandbox.netns, 'eth0') == {v4 + '.5/24', v6 + '5/64'}
        owner = owner_tag.alias(sandbox.container_id, 'eth0')
        if self.kind == 'ovs':
            host_name = owner_tag.host_ifname(sandbox.container_id, 'eth0')
            assert node.links()[host_name].get('ifalias') == owner
            assert self.ovs.ports(OVS_BRIDGE) == {host_name}
            ids = dict(self.ovs.interface(host_name)['external_ids'][1])
            assert ids['container-id'] == sandbox.container_id and ids['iface-id'] == 'port-5'
        else:
            assert eth0.get('ifalias') == owner
            assert eth0.get(('linkinfo', 'kind')) == self.kind
        assert node.ping(sandbox.netns, self.gateways[0])
        assert node.ping(sandbox.netns, self.gateways[1])

    def assert_gone(self, sandbox):
        assert 'eth0' not in self.node.links(sandbox.netns)
        host_name = owner_tag.host_ifname(sandbox.container_id, 'eth0')
        assert host_name not in self.node.links()
        if self.ovs is not None:
            assert host_name not in self.ovs.ports(OVS_BRIDGE)

    def close(self):
        if self.ovs is not None:
            self.ovs.close()


@pytest.fixture(params=['macvlan', 'vlan', 'ovs'])
def world(request, node):
    kind = request.param
    reason = testovs.missing() if kind == 'ovs' else helpers.kernel_lacks(kind)
    if reason:
        pytest.skip(reason)
    world = World(node, kind)
    try:
        node.start_daemon(workers=2, vif_timeout=2, extra=world.config)
        yield world
    finally:
        node.stop_daemon()
        world.close()


def _pod(world, active):
    return world.node.api.create_pod('default', POD, testhost.NODE, uid=UID, annotations={
        'kuryr.openstack.org/vifs': json.dumps(world.vifs(active))})


def _activate(world):
    world.node.api.set_vifs('default', POD, world.vifs(True))


def _sandboxes(node):
    return [testruntime.Sandbox('sandbox-%s' % letter, node.pod_netns(), POD, pod_uid=UID)
            for letter in 'AB']


def test_the_race_of_design_1(world, runtime):
    """ADD A fails, DEL A, ADD B waits for its VIF, DEL A again during and after ADD B."""
    node = world.node
    _pod(world, active=False)
    a, b = _sandboxes(node)
    outcome = runtime.add(a)
    assert outcome.error_code == 11, outcome
    assert runtime.delete(a).ok
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        add_b = helpers.add_in_background(pool, node, runtime, b)
        assert runtime.execute('DEL', a).ok      # late DEL while B waits
        assert not add_b.done()
        _activate(world)
        assert add_b.result(timeout=30).ok
    assert runtime.execute('DEL', a).ok          # late DEL after B
    world.assert_connected(b)
    assert helpers.stale_dels(node)['container_id_mismatch'] == 2

    assert runtime.delete(b).ok
    world.assert_gone(b)
    assert helpers.leftovers(node) == helpers.NOTHING


def test_new_sandbox_evicts_the_old_ones_devices(world, runtime):
    node = world.node
    _pod(world, active=True)
    a, b = _sandboxes(node)
    assert runtime.add(a).ok
    world.assert_connected(a)
    assert runtime.add(b).ok        # A never got its DEL: its devices go first
    world.assert_gone(a)
    world.assert_connected(b)
    assert helpers.metric(node, 'kuryr_cni_sandbox_evictions_total') == 1
    assert runtime.execute('DEL', a).ok
    world.assert_connected(b)
    assert helpers.stale_dels(node)['container_id_mismatch'] == 1
