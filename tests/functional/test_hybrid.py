"""Hybrid-plugged ports (ovs-hybrid) against a real, private Open vSwitch.

As in test_ovs.py: the test's own ``ovsdb-server`` and ``ovs-vswitchd``
(userspace ``netdev`` datapath) inside the node namespace. The driver's
tests check every device of a hybrid port as os-vif wires it; the last test
runs a KuryrPort's hybrid VIF through the real shim and daemon behind the
stand-in Neutron (which activates the port only once it sees qvo on the
integration bridge), and the pod pings an internal port of the integration
bridge across qbr, the qvb/qvo pair and the switch.
"""

import shutil
import time

import pytest

from kuryr_cni import binding
from kuryr_cni import errors
from kuryr_cni import vif as vif_model
from kuryr_cni.binding import hybrid
from kuryr_cni.binding import owner_tag
from tools.testbed import host as testhost
from tools.testbed import neutron as testneutron
from tools.testbed import ovs as testovs
from tools.testbed import runtime as testruntime
from tests.functional import conftest
from tests.functional import helpers
from tests.functional.conftest import CAN_RUN
from tests.functional.conftest import SKIP_REASON
from tests.functional.test_ovs import BRIDGE
from tests.functional.test_ovs import GATEWAY4
from tests.functional.test_ovs import GATEWAY6
from tests.functional.test_ovs import MTU
from tests.functional.test_ovs import external_ids
from tests.functional.test_ovs import node  # noqa: F401 (fixture)
from tests.functional.test_ovs import switch  # noqa: F401 (fixture)
from tests.unit import osvif_fixtures as fx

pytestmark = pytest.mark.skipif(not CAN_RUN, reason=SKIP_REASON)

needs_ping = pytest.mark.skipif(shutil.which('ping') is None,
                                reason='ping (iputils-ping) is not installed')


@pytest.fixture
def driver(node, switch):  # noqa: F811
    return binding.get_driver('ovs-hybrid', host_netns=node.path,
                              options=binding.Options(ovsdb_connection=switch.connection))


def make_vif(n=5, **changes):
    port_id = '%02x5f3a10-2f4e-4c3b-9a61-0d6f2b7e4a21' % n
    spec = {'kind': 'ovs-hybrid', 'port_id': port_id, 'mac': 'fa:16:3e:00:02:%02x' % n,
            'mtu': MTU, 'bridge': vif_model.hybrid_device_name('qbr', port_id),
            'integration_bridge': BRIDGE, 'ips': ['10.88.0.%d/24' % n, 'fd88::%x/64' % n],
            'gateway': [GATEWAY4, GATEWAY6], 'active': True}
    spec.update(changes)
    return vif_model.parse_vif(spec)


def hybrid_devices(ns, vif):
    """``{name: link}`` of the port's qbr, qvb and qvo that exist."""
    links = ns.links()
    return {name: links[name] for name in hybrid.device_names(vif.port_id) if name in links}


def test_connect_wires_the_port_as_os_vif_does(node, pod_ns, switch, driver):  # noqa: F811
    pod = pod_ns()
    vif = make_vif()
    driver.connect(vif, pod.plug(container_id='sandbox-a'))

    qbr, qvb, qvo = hybrid.device_names(vif.port_id)
    assert (qbr, qvb, qvo) == ('qbr055f3a10-2f', 'qvb055f3a10-2f', 'qvo055f3a10-2f')
    links = node.links()
    owner = 'kuryr-cni:sandbox-a:eth0'
    pod_end = owner_tag.host_ifname('sandbox-a', 'eth0')
    assert links[qbr]['linkinfo']['info_kind'] == 'bridge' and 'UP' in links[qbr]['flags']
    for name in (qbr, qvb, qvo):        # no address, not even IPv6 link-local
        assert node.link(name).get('addr_info', []) == []
    for name in (qbr, qvb, qvo, pod_end):
        assert links[name]['ifalias'] == owner
    assert links[qvb]['master'] == qbr and links[pod_end]['master'] == qbr
    assert 'master' not in links[qvo] or links[qvo]['master'] != qbr
    assert links[qvb]['mtu'] == links[qvo]['mtu'] == MTU
    assert switch.ports(BRIDGE) == {qvo}
    assert external_ids(switch, qvo) == {
        'iface-id': vif.port_id, 'attached-mac': vif.mac, 'iface-status': 'active',
        'container-id': 'sandbox-a', 'kuryr-cni-owner': owner}
    assert pod.addresses('eth0') == {'10.88.0.5/24', 'fd88::5/64'}
    driver.check(vif, pod.plug(container_id='sandbox-a'))


def test_disconnect_removes_every_device_and_the_row(node, pod_ns, switch, driver):  # noqa
    pod = pod_ns()
    vif = make_vif()
    plug = pod.plug()
    driver.connect(vif, plug)

    driver.disconnect(plug)
    driver.disconnect(plug)

    assert hybrid_devices(node, vif) == {}
    assert switch.ports(BRIDGE) == set()
    assert not [n for n, link in node.links().items() if link.get('ifalias')]
    assert set(pod.links()) == {'lo'}


def test_a_stale_disconnect_leaves_the_new_owners_devices(node, pod_ns, switch, driver):  # noqa
    """Sandbox B of the pod replaced A (A's devices evicted); A's late DEL comes."""
    vif = make_vif()
    old, new = pod_ns(), pod_ns()
    driver.connect(vif, old.plug('sandbox-a'))
    driver.disconnect(old.plug('sandbox-a'))          # the eviction
    driver.connect(vif, new.plug('sandbox-b'))

    driver.disconnect(old.plug('sandbox-a'))          # the late DEL
    driver.remove_host_side('sandbox-a', 'eth0')      # ... without any record

    assert set(hybrid_devices(node, vif)) == set(hybrid.device_names(vif.port_id))
    assert external_ids(switch, hybrid.device_names(vif.port_id)[2])['container-id'] \
        == 'sandbox-b'
    driver.check(vif, new.plug('sandbox-b'))


def test_remove_host_side_without_a_record_removes_it_all(node, pod_ns, switch, driver):  # noqa
    vif = make_vif()
    driver.connect(vif, pod_ns().plug('sandbox-a'))

    binding.remove_tagged_host_device('sandbox-a', 'eth0', node.path,
                                      binding.Options(ovsdb_connection=switch.connection))

    assert hybrid_devices(node, vif) == {}
    assert switch.ports(BRIDGE) == set()


def test_another_owners_devices_of_the_port_are_never_taken_over(node, pod_ns, switch,  # noqa
                                                                 driver):
    vif = make_vif()
    driver.connect(vif, pod_ns().plug('sandbox-a'))
    intruder = pod_ns()

    with pytest.raises(errors.BindingFailed, match='belongs to another owner'):
        driver.connect(vif, intruder.plug('sandbox-x'))

    assert external_ids(switch, hybrid.device_names(vif.port_id)[2])['container-id'] \
        == 'sandbox-a'
    assert set(intruder.links()) == {'lo'}


def untagged_port(node, switch, port_id, mac):  # noqa: F811
    """A hybrid port's devices as os-vif makes them (a Nova instance's, kuryr-daemon's):
    no owner tag, qvo's row naming the port and its MAC; the names of the devices."""
    qbr, qvb, qvo = hybrid.device_names(port_id)
    node.ip('link', 'add', qbr, 'type', 'bridge')
    node.ip('link', 'add', qvb, 'type', 'veth', 'peer', 'name', qvo)
    node.ip('link', 'set', qvb, 'master', qbr)
    switch.vsctl('add-port', BRIDGE, qvo, '--', 'set', 'Interface', qvo,
                 'external_ids:iface-id=%s' % port_id, 'external_ids:attached-mac=%s' % mac,
                 'external_ids:iface-status=active')
    return qbr, qvb, qvo


def test_connect_replaces_untagged_devices_its_vif_proves_its_own(
        node, pod_ns, switch, driver):  # noqa: F811
    """os-vif's devices of this very VIF (the qvo row names its port and MAC) are replaced."""
    vif = make_vif()
    untagged_port(node, switch, vif.port_id, vif.mac)
    pod = pod_ns()

    driver.connect(vif, pod.plug())

    driver.check(vif, pod.plug())
    assert switch.ports(BRIDGE) == {hybrid.device_names(vif.port_id)[2]}


def test_untagged_devices_of_the_port_nothing_proves_ours_are_left_alone(
        node, pod_ns, switch, driver):  # noqa: F811
    """Issue 31 hole 3: a VIF naming a Nova instance's port ID (another MAC) must neither
    delete the instance's qbr/qvb/qvo and row nor take over its iface-id."""
    victim = make_vif()
    names = untagged_port(node, switch, victim.port_id, victim.mac)
    before = {name: node.link(name)['ifindex'] for name in names}
    intruder = pod_ns()

    with pytest.raises(errors.BindingFailed, match='did not tag') as info:
        driver.connect(make_vif(mac='fa:16:3e:00:0e:0e'), intruder.plug('sandbox-x'))

    assert info.value.code == 101
    assert {name: node.link(name)['ifindex'] for name in names} == before
    assert switch.ports(BRIDGE) == {names[2]}
    assert external_ids(switch, names[2]) == {
        'iface-id': victim.port_id, 'attached-mac': victim.mac, 'iface-status': 'active'}
    assert set(intruder.links()) == {'lo'}
    assert not [n for n, link in node.links().items() if link.get('ifalias')]


def test_a_lone_untagged_qbr_of_the_port_is_left_alone(node, pod_ns, switch, driver):  # noqa
    vif = make_vif()
    qbr = hybrid.device_names(vif.port_id)[0]
    node.ip('link', 'add', qbr, 'type', 'bridge')
    index = node.link(qbr)['ifindex']

    with pytest.raises(errors.BindingFailed, match=qbr):
        driver.connect(vif, pod_ns().plug())

    assert node.link(qbr)['ifindex'] == index and switch.ports(BRIDGE) == set()


def test_an_untagged_pair_in_its_own_tagged_qbr_is_replaced(
        node, pod_ns, switch, driver):  # noqa: F811
    """What a plug that stopped between making the qvb/qvo pair and tagging it leaves."""
    vif = make_vif()
    qbr, qvb, qvo = hybrid.device_names(vif.port_id)
    node.ip('link', 'add', qbr, 'type', 'bridge')
    node.ip('link', 'set', qbr, 'alias', 'kuryr-cni:sandbox-a:eth0')
    node.ip('link', 'add', qvb, 'type', 'veth', 'peer', 'name', qvo)
    node.ip('link', 'set', qvb, 'master', qbr)
    pod = pod_ns()

    driver.connect(vif, pod.plug('sandbox-a'))

    driver.check(vif, pod.plug('sandbox-a'))


def test_failed_connect_leaves_nothing(node, pod_ns, switch, driver):  # noqa: F811
    """A route to one of the VIF's networks already in the pod makes the last step fail."""
    pod = pod_ns()
    pod.ip('link', 'add', 'other0', 'type', 'veth', 'peer', 'name', 'other1')
    pod.ip('addr', 'add', '10.77.0.2/24', 'dev', 'other0')
    pod.ip('link', 'set', 'other0', 'up')
    pod.ip('route', 'add', '192.168.0.0/16', 'via', '10.77.0.1', 'dev', 'other0', 'onlink')
    vif = make_vif(routes=[{'dst': '192.168.0.0/16', 'gw': '10.88.0.254'}])

    with pytest.raises(errors.BindingFailed, match='add route'):
        driver.connect(vif, pod.plug())

    assert hybrid_devices(node, vif) == {}
    assert switch.ports(BRIDGE) == set()
    assert not [n for n, link in node.links().items() if link.get('ifalias')]


def test_check_names_a_missing_qvo_row(pod_ns, switch, driver):  # noqa: F811
    vif = make_vif()
    pod = pod_ns()
    driver.connect(vif, pod.plug())
    switch.vsctl('del-port', BRIDGE, hybrid.device_names(vif.port_id)[2])

    with pytest.raises(errors.CheckFailed) as exc:
        driver.check(vif, pod.plug())

    assert 'OVS port qvo055f3a10-2f is missing' in exc.value.details


# -- end to end: a KuryrPort's hybrid VIF, the real shim and daemon ------------------------

@pytest.fixture
def daemon_on_switch(tmp_path):
    """A test host whose daemon (KuryrPort source) plugs into a private OVS with br-int;
    br-int's internal port ``gw-int`` holds 10.20.0.1/24, the router's address."""
    reason = testovs.missing()
    if reason:
        pytest.skip(reason)
    with testhost.Host(prefix=conftest.SESSION_PREFIX) as host, \
            testovs.PrivateOVS(host.ns) as private:
        host.start_api()
        private.add_bridge(BRIDGE)
        private.vsctl('add-port', BRIDGE, 'gw-int', '--', 'set', 'Interface', 'gw-int',
                      'type=internal')
        testhost.ip('-n', host.ns, 'addr', 'add', '10.20.0.1/24', 'dev', 'gw-int')
        testhost.ip('-n', host.ns, 'link', 'set', 'gw-int', 'up')
        host.start_daemon(workers=2, vif_timeout=10, extra=(
            '\n[cni_daemon]\nvif_source = kuryrport\n'
            '[binding]\novsdb_connection = %s\n' % private.connection))
        try:
            yield host, private
        finally:
            host.stop_daemon()


@needs_ping
def test_a_kuryrports_hybrid_vif_turns_active_once_plugged_and_pings_br_int(
        daemon_on_switch, tmp_path):
    """The stand-in Neutron activates the port only once it sees qvo on br-int."""
    host, private = daemon_on_switch
    network = fx.network([fx.subnet('10.20.0.0/24', ['10.20.0.5'], gateway='10.20.0.1')])
    host.api.create_pod('default', 'web-0', testhost.NODE, uid='uid-web-0')
    host.api.create_kuryrport(
        'default', 'web-0', testhost.NODE,
        spec={'podUid': 'uid-web-0', 'podStatic': False, 'podNodeName': testhost.NODE},
        status={'vifs': fx.status_vifs(fx.hybrid_vif(active=False, network=network))})
    runtime = testruntime.Runtime(host.socket, host.state_dir, str(tmp_path / 'cni-cache'),
                                  shim=host.install_shim())
    sandbox = testruntime.Sandbox('sandbox-a', host.pod_netns(), 'web-0', pod_uid='uid-web-0')
    qbr, qvb, qvo = hybrid.device_names(fx.PORT_ID)

    with testneutron.StandInNeutron(host, private) as neutron:
        neutron.serve_kuryrport('default', 'web-0')
        outcome = runtime.add(sandbox)
        answered = time.monotonic()

    assert outcome.ok, outcome
    assert neutron.activations[fx.PORT_ID] <= answered     # activated on qvo, meanwhile
    assert private.ports(BRIDGE) == {'gw-int', qvo}
    assert external_ids(private, qvo) == {
        'iface-id': fx.PORT_ID, 'attached-mac': 'fa:16:3e:98:7b:05', 'iface-status': 'active',
        'container-id': 'sandbox-a', 'kuryr-cni-owner': 'kuryr-cni:sandbox-a:eth0'}
    links = host.links()
    pod_end = links[owner_tag.host_ifname('sandbox-a', 'eth0')]
    assert links[qvb].get('master') == pod_end.get('master') == links[qbr]['index']
    assert host.ping(sandbox.netns, '10.20.0.1')

    assert runtime.delete(sandbox).ok

    assert private.ports(BRIDGE) == {'gw-int'}
    assert not {qbr, qvb, qvo} & set(host.links())
    assert helpers.leftovers(host) == helpers.NOTHING
