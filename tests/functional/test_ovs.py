"""The ovs binding driver against a real, private Open vSwitch.

Each test runs its own ``ovsdb-server`` and ``ovs-vswitchd``
(:class:`tools.testbed.ovs.PrivateOVS`: private database, sockets,
pidfiles and run directory; the system service is never involved), the switch
inside the test's node namespace, with the userspace ``netdev`` datapath: the
veth host end is a system port (``type ""``) read through AF_PACKET, and the
bridge's own port is a tap device holding the gateways, so pings really
cross the switch.
"""

import shutil
import socket

import pytest

from kuryr_cni import binding
from kuryr_cni import errors
from kuryr_cni import kernel
from kuryr_cni import vif as vif_model
from kuryr_cni.binding import ovs as ovs_driver
from kuryr_cni.binding import owner_tag
from tools.testbed import ovs as testovs
from tests.functional.conftest import CAN_RUN
from tests.functional.conftest import SKIP_REASON

pytestmark = pytest.mark.skipif(not CAN_RUN, reason=SKIP_REASON)

needs_ping = pytest.mark.skipif(shutil.which('ping') is None,
                                reason='ping (iputils-ping) is not installed')

BRIDGE = 'br-int'
GATEWAY4 = '10.88.0.1'
GATEWAY6 = 'fd88::1'
MTU = 1450


@pytest.fixture
def node(netns_factory):
    reason = testovs.missing()
    if reason:
        pytest.skip(reason)
    ns = netns_factory()
    ns.ip('link', 'set', 'lo', 'up')
    return ns


@pytest.fixture
def switch(node):
    with testovs.PrivateOVS(node.name) as private:
        private.add_bridge(BRIDGE)
        # The bridge's own port (a tap device with the netdev datapath) plays the router.
        node.ip('addr', 'add', GATEWAY4 + '/24', 'dev', BRIDGE)
        node.ip('addr', 'add', GATEWAY6 + '/64', 'dev', BRIDGE, 'nodad')
        node.ip('link', 'set', BRIDGE, 'up')
        yield private


@pytest.fixture
def driver(node, switch):
    return binding.get_driver('ovs', host_netns=node.path,
                              options=binding.Options(ovsdb_connection=switch.connection))


def make_vif(n=5, **changes):
    spec = {'kind': 'ovs', 'port_id': '5d0b-port-%d' % n, 'mac': 'fa:16:3e:00:01:%02x' % n,
            'mtu': MTU, 'bridge': BRIDGE, 'ips': ['10.88.0.%d/24' % n, 'fd88::%x/64' % n],
            'gateway': [GATEWAY4, GATEWAY6],
            'routes': [{'dst': '192.168.0.0/16', 'gw': '10.88.0.254'}], 'active': True}
    spec.update(changes)
    return vif_model.parse_vif(spec)


def external_ids(switch, name):
    row = switch.interface(name)
    return dict(row['external_ids'][1]) if row else None


# -- connect -----------------------------------------------------------------

def test_connect_adds_the_host_end_as_an_owned_ovs_port(node, pod_ns, switch, driver):
    pod = pod_ns()
    plug = pod.plug(container_id='sandbox-a')
    driver.connect(make_vif(), plug)

    name = owner_tag.host_ifname('sandbox-a', 'eth0')
    assert switch.ports(BRIDGE) == {name}
    assert external_ids(switch, name) == {
        'iface-id': '5d0b-port-5', 'attached-mac': 'fa:16:3e:00:01:05',
        'iface-status': 'active', 'container-id': 'sandbox-a',
        'kuryr-cni-owner': 'kuryr-cni:sandbox-a:eth0'}
    row = switch.interface(name)
    assert row['type'] == '' and row['ofport'] > 0 and row['error'] == ['set', []]
    host_end = node.links()[name]
    assert host_end['ifalias'] == 'kuryr-cni:sandbox-a:eth0'
    assert 'master' not in host_end and 'UP' in host_end['flags'] and host_end['mtu'] == MTU
    assert [a for a in node.link(name).get('addr_info', []) if a['family'] == 'inet6'] == []
    eth0 = pod.link('eth0')
    assert eth0['address'] == 'fa:16:3e:00:01:05' and eth0['mtu'] == MTU
    assert pod.addresses('eth0') == {'10.88.0.5/24', 'fd88::5/64'}
    assert {('default', GATEWAY4, 'eth0'), ('default', GATEWAY6, 'eth0'),
            ('192.168.0.0/16', '10.88.0.254', 'eth0')} <= pod.routes()


@needs_ping
def test_traffic_crosses_the_userspace_switch(pod_ns, driver):
    """Right after connect: it waits until ovs-vswitchd has attached the port."""
    a, b = pod_ns(), pod_ns()
    driver.connect(make_vif(5), a.plug('sandbox-a'))
    driver.connect(make_vif(6), b.plug('sandbox-b'))
    assert a.pings(GATEWAY4)
    assert a.pings(GATEWAY6)
    assert b.pings('10.88.0.5')


def test_secondary_interface_and_no_default_route(pod_ns, switch, driver):
    pod = pod_ns()
    driver.connect(make_vif(5), pod.plug(ifname='eth0'))
    driver.connect(make_vif(6, ips=['10.88.0.6/24'], gateway=GATEWAY4, routes=[]),
                   pod.plug(ifname='eth1', default_route=False))
    defaults = {r for r in pod.routes() if r[0] == 'default'}
    assert defaults == {('default', GATEWAY4, 'eth0'), ('default', GATEWAY6, 'eth0')}
    assert len(switch.ports(BRIDGE)) == 2


def test_connect_twice_converges_on_one_port(node, pod_ns, switch, driver):
    pod = pod_ns()
    plug = pod.plug()
    driver.connect(make_vif(), plug)
    driver.connect(make_vif(), plug)
    driver.check(make_vif(), plug)
    assert switch.ports(BRIDGE) == {owner_tag.host_ifname('c0ffee', 'eth0')}


def test_connect_replaces_a_leftover_row_of_its_own(pod_ns, switch, driver):
    """A connect that died after the OVSDB transaction left the row, not the device."""
    pod = pod_ns()
    name = owner_tag.host_ifname('c0ffee', 'eth0')
    switch.vsctl('add-port', BRIDGE, name, '--', 'set', 'Interface', name,
                 'external_ids:kuryr-cni-owner=kuryr-cni:c0ffee:eth0')
    driver.connect(make_vif(), pod.plug())
    assert external_ids(switch, name)['iface-id'] == '5d0b-port-5'


def test_connect_never_takes_over_a_foreign_row(node, pod_ns, switch, driver):
    pod = pod_ns()
    name = owner_tag.host_ifname('c0ffee', 'eth0')
    switch.vsctl('add-port', BRIDGE, name, '--', 'set', 'Interface', name,
                 'external_ids:kuryr-cni-owner=kuryr-cni:someone:eth0')
    with pytest.raises(errors.BindingFailed, match='belongs to another owner'):
        driver.connect(make_vif(), pod.plug())
    assert external_ids(switch, name)['kuryr-cni-owner'] == 'kuryr-cni:someone:eth0'
    assert name not in node.links() and 'eth0' not in pod.links()


def test_failed_connect_leaves_no_device_and_no_row(node, pod_ns, switch, driver):
    """A route to one of the VIF's networks already in the pod makes the last step fail."""
    pod = pod_ns()
    pod.ip('link', 'add', 'other0', 'type', 'veth', 'peer', 'name', 'other1')
    pod.ip('addr', 'add', '10.77.0.2/24', 'dev', 'other0')
    pod.ip('link', 'set', 'other0', 'up')
    pod.ip('route', 'add', '192.168.0.0/16', 'via', '10.77.0.1', 'dev', 'other0', 'onlink')
    with pytest.raises(errors.BindingFailed, match='add route'):
        driver.connect(make_vif(), pod.plug())
    assert switch.ports(BRIDGE) == set()
    assert not [n for n in node.links() if n.startswith(owner_tag.PREFIX)]
    assert 'eth0' not in pod.links()


@needs_ping
def test_jumbo_vifs_plug_into_a_bridge_whose_own_port_is_smaller(node, pod_ns, switch, driver):
    """Before: every ADD of a network with an MTU above br-int's own port's failed, code 7.

    Open vSwitch forwards between ports whatever its local port's MTU, which it
    lowers to its smallest port's; kuryr-daemon (os-vif) never compared the two.
    """
    switch.vsctl('set', 'Interface', BRIDGE, 'mtu_request=1500')
    a, b = pod_ns(), pod_ns()
    driver.connect(make_vif(5, mtu=9000), a.plug('sandbox-a'))
    driver.connect(make_vif(6, mtu=9000), b.plug('sandbox-b'))
    assert a.link('eth0')['mtu'] == 9000 and b.link('eth0')['mtu'] == 9000
    assert switch.ports(BRIDGE) == {owner_tag.host_ifname('sandbox-a', 'eth0'),
                                    owner_tag.host_ifname('sandbox-b', 'eth0')}
    driver.check(make_vif(5, mtu=9000), a.plug('sandbox-a'))
    jumbo = a.run('ping', '-c1', '-W2', '-q', '-M', 'do', '-s', '8000', '10.88.0.6')
    assert jumbo.returncode == 0, jumbo             # pod to pod, one unfragmented frame


def test_network_device_mtu_bounds_the_pod_interface(node, pod_ns, switch):
    """kuryr-kubernetes' [neutron_defaults] network_device_mtu: the smaller of it and the VIF's."""
    host = kernel.Kernel(host_netns=node.path, binding_options=binding.Options(
        ovsdb_connection=switch.connection, network_device_mtu=1400))
    pod = pod_ns()
    plug = pod.plug('sandbox-a')
    host.connect(make_vif(mtu=9000), plug)
    assert pod.link('eth0')['mtu'] == 1400
    assert node.links()[owner_tag.host_ifname('sandbox-a', 'eth0')]['mtu'] == 1400
    host.check(make_vif(mtu=9000), plug)             # what was asked for, as bounded
    smaller = pod_ns()
    host.connect(make_vif(6, mtu=1300), smaller.plug('sandbox-b'))
    assert smaller.link('eth0')['mtu'] == 1300


def test_connect_refuses_a_missing_bridge(pod_ns, driver):
    with pytest.raises(errors.BindingFailed, match='bridge br-ex does not exist'):
        driver.connect(make_vif(bridge='br-ex'), pod_ns().plug())


# -- OVSDB down or silent: bounded, code 11 ----------------------------------------

def test_unreachable_ovsdb_is_try_again_later_and_touches_nothing(node, pod_ns, tmp_path):
    pod = pod_ns()
    driver = binding.get_driver('ovs', host_netns=node.path, options=binding.Options(
        ovsdb_connection='unix:%s' % (tmp_path / 'absent.sock')))
    with pytest.raises(errors.TryAgainLater, match='cannot reach OVSDB') as exc:
        driver.connect(make_vif(), pod.plug())
    assert exc.value.code == 11
    assert sorted(pod.links()) == ['lo']


def test_silent_ovsdb_is_bounded_by_the_timeout(node, pod_ns, tmp_path):
    path = str(tmp_path / 'silent.sock')
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.bind(path)
        silent.listen(8)        # accepts into the backlog, never answers
        driver = ovs_driver.OvsDriver(host_netns=node.path, options=binding.Options(
            ovsdb_connection='unix:' + path, ovsdb_timeout=0.5))
        # The timeout is what ends the call: without it, this test would hang.
        with pytest.raises(errors.TryAgainLater, match='did not answer in time'):
            driver.connect(make_vif(), pod_ns().plug())


def test_stopped_switch_fails_the_add_after_the_timeout(node, pod_ns, switch):
    """ovsdb-server answers but ovs-vswitchd never applies the port."""
    driver = ovs_driver.OvsDriver(host_netns=node.path, options=binding.Options(
        ovsdb_connection=switch.connection, ovsdb_timeout=1.0))
    switch.stop_switch()
    pod = pod_ns()
    with pytest.raises(errors.TryAgainLater, match='ovs-vswitchd did not apply'):
        driver.connect(make_vif(), pod.plug())
    assert switch.ports(BRIDGE) == set()
    assert 'eth0' not in pod.links()


# -- disconnect ----------------------------------------------------------------

def test_disconnect_removes_row_and_device_and_is_idempotent(node, pod_ns, switch, driver):
    pod = pod_ns()
    plug = pod.plug()
    driver.connect(make_vif(), plug)
    driver.disconnect(plug)
    assert switch.ports(BRIDGE) == set()
    assert not [n for n in node.links() if n.startswith(owner_tag.PREFIX)]
    assert sorted(pod.links()) == ['lo']
    driver.disconnect(plug)
    driver.disconnect(binding.Plug(plug.container_id, '', 'eth0', True))


def test_disconnect_of_a_never_removes_b(pod_ns, switch, driver):
    a, b = pod_ns(), pod_ns()
    driver.connect(make_vif(), a.plug('sandbox-a'))
    driver.connect(make_vif(), b.plug('sandbox-b'))     # same port: B replaces A
    driver.disconnect(a.plug('sandbox-a'))
    assert switch.ports(BRIDGE) == {owner_tag.host_ifname('sandbox-b', 'eth0')}
    driver.check(make_vif(), b.plug('sandbox-b'))


def test_disconnect_spares_a_row_owned_by_someone_else(node, pod_ns, switch, driver):
    pod = pod_ns()
    plug = pod.plug()
    driver.connect(make_vif(), plug)
    name = owner_tag.host_ifname('c0ffee', 'eth0')
    switch.vsctl('set', 'Interface', name, 'external_ids:kuryr-cni-owner=kuryr-cni:x:eth0')
    driver.disconnect(plug)
    assert switch.ports(BRIDGE) == {name}


def test_disconnect_with_ovsdb_down_is_try_again_later(node, pod_ns, switch, driver):
    pod = pod_ns()
    plug = pod.plug()
    driver.connect(make_vif(), plug)
    switch.close()
    with pytest.raises(errors.TryAgainLater):
        driver.disconnect(plug)
    assert owner_tag.host_ifname('c0ffee', 'eth0') in node.links()   # kept for the retry


def test_unrecorded_removal_works_without_ovsdb(node, pod_ns, switch, driver):
    """remove_host_side (DEL of an unknown sandbox) on a node whose OVSDB is gone."""
    pod = pod_ns()
    driver.connect(make_vif(), pod.plug())
    switch.close()
    binding.remove_tagged_host_device('c0ffee', 'eth0', node.path, driver.options)
    assert owner_tag.host_ifname('c0ffee', 'eth0') not in node.links()
    assert 'eth0' not in pod.links()


def test_unrecorded_removal_removes_the_row_too(node, pod_ns, switch, driver):
    pod = pod_ns()
    driver.connect(make_vif(), pod.plug())
    binding.remove_tagged_host_device('c0ffee', 'eth0', node.path, driver.options)
    assert switch.ports(BRIDGE) == set()
    assert owner_tag.host_ifname('c0ffee', 'eth0') not in node.links()


# -- check -------------------------------------------------------------------

@pytest.mark.parametrize('change, complaint', [
    (('set', 'Interface', '{name}', 'external_ids:iface-id=other'),
     "external_ids:iface-id='other', not '5d0b-port-5'"),
    (('remove', 'Interface', '{name}', 'external_ids', 'attached-mac'),
     'external_ids:attached-mac=None'),
    (('del-port', BRIDGE, '{name}'), 'OVS port {name} is missing'),
])
def test_check_passes_then_reports_the_difference(pod_ns, switch, driver, change, complaint):
    pod = pod_ns()
    plug = pod.plug()
    driver.connect(make_vif(), plug)
    driver.check(make_vif(), plug)
    name = owner_tag.host_ifname('c0ffee', 'eth0')
    switch.vsctl(*[a.format(name=name) for a in change])
    with pytest.raises(errors.CheckFailed) as exc:
        driver.check(make_vif(), plug)
    assert complaint.format(name=name) in exc.value.details


def test_check_reports_pod_side_differences_too(pod_ns, driver):
    pod = pod_ns()
    plug = pod.plug()
    driver.connect(make_vif(), plug)
    pod.ip('addr', 'del', 'fd88::5/64', 'dev', 'eth0')
    with pytest.raises(errors.CheckFailed, match='differs') as exc:
        driver.check(make_vif(), plug)
    assert 'lacks address fd88::5/64' in exc.value.details
