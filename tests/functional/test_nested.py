"""The macvlan and vlan binding drivers (nested pods) against a real kernel.

A veth pair stands in for the VM's trunk port: ``trunk0`` in the node
namespace is the parent; its peer sits in a "router" namespace holding the
gateways (directly for macvlan, on VLAN 100 of the peer for vlan), so pods
reach them through the parent. Every vlan test first checks that this kernel
can make an 802.1Q link at all, and skips with that reason where it cannot
(the kernel of the development machines has no 8021q module; the driver's
requests are also checked without a kernel in tests/unit/test_nested_requests.py).
"""

import dataclasses
import shutil
import socket
import subprocess
import sys

import pytest

from kuryr_cni import binding
from kuryr_cni import errors
from kuryr_cni import netns
from kuryr_cni import vif as vif_model
from kuryr_cni.binding import default_parent
from kuryr_cni.binding import owner_tag
from tests.functional.conftest import CAN_RUN
from tests.functional.conftest import GATEWAY4
from tests.functional.conftest import GATEWAY6
from tests.functional.conftest import SKIP_REASON
from tests.functional import helpers

pytestmark = pytest.mark.skipif(not CAN_RUN, reason=SKIP_REASON)

needs_ping = pytest.mark.skipif(shutil.which('ping') is None,
                                reason='ping (iputils-ping) is not installed')

PARENT = 'trunk0'
VLAN_ID = 100
MTU = 1450


@pytest.fixture(params=['macvlan', 'vlan'])
def kind(request):
    if not CAN_RUN:
        pytest.skip(SKIP_REASON)
    reason = helpers.kernel_lacks(request.param)
    if reason:
        pytest.skip(reason)
    return request.param


@pytest.fixture
def node(netns_factory, kind):
    """The node namespace with the trunk ``trunk0``; its peer in a router namespace."""
    node = netns_factory()
    router = netns_factory()
    node.ip('link', 'set', 'lo', 'up')
    node.ip('link', 'add', PARENT, 'type', 'veth', 'peer', 'name', 'peer0',
            'netns', router.name)
    node.ip('link', 'set', PARENT, 'up')
    router.ip('link', 'set', 'peer0', 'up')
    gateway_dev = 'peer0'
    if kind == 'vlan':
        gateway_dev = 'peer0.%d' % VLAN_ID
        router.ip('link', 'add', 'link', 'peer0', 'name', gateway_dev, 'type', 'vlan',
                  'id', str(VLAN_ID))
        router.ip('link', 'set', gateway_dev, 'up')
    router.ip('addr', 'add', GATEWAY4 + '/24', 'dev', gateway_dev)
    router.ip('addr', 'add', GATEWAY6 + '/64', 'dev', gateway_dev, 'nodad')
    return node


@pytest.fixture
def driver(node, kind):
    return binding.get_driver(kind, host_netns=node.path)


def make_vif(kind, n=5, **changes):
    spec = {'kind': kind, 'port_id': 'port-%d' % n, 'mac': 'fa:16:3e:00:00:%02x' % n,
            'mtu': MTU, 'parent': PARENT, 'ips': ['10.99.0.%d/24' % n, 'fd99::%x/64' % n],
            'gateway': [GATEWAY4, GATEWAY6],
            'routes': [{'dst': '192.168.0.0/16', 'gw': '10.99.0.254'},
                       {'dst': '172.16.0.0/12'},
                       {'dst': 'fd42::/48', 'gw': 'fd99::fe'}],
            'active': True}
    if kind == 'vlan':
        spec['vlan_id'] = VLAN_ID
    spec.update(changes)
    return vif_model.parse_vif(spec)


# -- connect -----------------------------------------------------------------

def test_connect_makes_the_sub_interface_in_the_pod(node, pod_ns, driver, kind):
    pod = pod_ns()
    before = set(node.links())
    driver.connect(make_vif(kind), pod.plug())

    eth0 = pod.link('eth0')
    assert eth0['linkinfo']['info_kind'] == kind
    if kind == 'vlan':
        assert eth0['linkinfo']['info_data']['id'] == VLAN_ID
    else:
        assert eth0['linkinfo']['info_data']['mode'] == 'bridge'
    assert eth0['link_index'] == node.links()[PARENT]['ifindex']
    assert eth0['ifalias'] == 'kuryr-cni:c0ffee:eth0'
    assert eth0['address'] == 'fa:16:3e:00:00:05' and eth0['mtu'] == MTU
    assert 'UP' in eth0['flags'] and 'UP' in pod.links()['lo']['flags']
    assert pod.addresses('eth0') == {'10.99.0.5/24', 'fd99::5/64'}
    assert {('default', GATEWAY4, 'eth0'), ('default', GATEWAY6, 'eth0'),
            ('192.168.0.0/16', '10.99.0.254', 'eth0'), ('172.16.0.0/12', None, 'eth0'),
            ('fd42::/48', 'fd99::fe', 'eth0')} <= pod.routes()
    assert set(node.links()) == before          # nothing on the host side


@needs_ping
def test_pod_reaches_both_gateways_through_the_parent(pod_ns, driver, kind):
    pod = pod_ns()
    driver.connect(make_vif(kind), pod.plug())
    assert pod.pings(GATEWAY4)
    assert pod.pings(GATEWAY6)


@needs_ping
def test_two_pods_on_one_parent_reach_each_other(pod_ns, driver, kind):
    a, b = pod_ns(), pod_ns()
    driver.connect(make_vif(kind, 5), a.plug('sandbox-a'))
    driver.connect(make_vif(kind, 6, vlan_id=VLAN_ID + 1) if kind == 'vlan'
                   else make_vif(kind, 6), b.plug('sandbox-b'))
    if kind == 'macvlan':        # bridge mode: straight through the parent
        assert a.pings('10.99.0.6')
    assert b.pings(GATEWAY4) is (kind == 'macvlan')   # VLAN 101 has no gateway here


def test_default_route_only_on_the_default_interface(pod_ns, driver, kind):
    pod = pod_ns()
    second = make_vif(kind, 7, ips=['10.98.0.7/24', 'fd98::7/64'],
                      gateway=['10.98.0.1', 'fd98::1'],
                      routes=[{'dst': '10.30.0.0/16', 'gw': '10.98.0.254'}],
                      **({'vlan_id': VLAN_ID + 7} if kind == 'vlan' else {}))
    driver.connect(make_vif(kind), pod.plug(ifname='eth0'))
    driver.connect(second, pod.plug(ifname='eth1', default_route=False))

    routes = pod.routes()
    defaults = {r for r in routes if r[0] == 'default'}
    assert defaults == {('default', GATEWAY4, 'eth0'), ('default', GATEWAY6, 'eth0')}
    assert ('10.30.0.0/16', '10.98.0.254', 'eth1') in routes
    assert pod.addresses('eth1') == {'10.98.0.7/24', 'fd98::7/64'}


def test_connect_twice_converges_on_one_interface(pod_ns, driver, kind):
    pod = pod_ns()
    plug = pod.plug()
    driver.connect(make_vif(kind), plug)
    driver.connect(make_vif(kind), plug)
    driver.check(make_vif(kind), plug)
    assert sorted(pod.links()) == ['eth0', 'lo']


def test_connect_replaces_its_own_half_made_interface(node, pod_ns, driver, kind):
    """A connect that died after creation left eth0, with the VIF's MAC, without alias."""
    pod = pod_ns()
    vif = make_vif(kind)
    extra = ['id', str(VLAN_ID)] if kind == 'vlan' else ['mode', 'bridge']
    node.ip('link', 'add', 'link', PARENT, 'name', 'eth0', 'netns', pod.name, 'address',
            vif.mac, 'type', kind, *extra)
    driver.connect(vif, dataclasses.replace(pod.plug(), mac=vif.mac))
    assert pod.link('eth0')['ifalias'] == 'kuryr-cni:c0ffee:eth0'
    assert pod.addresses('eth0') == {'10.99.0.5/24', 'fd99::5/64'}


def test_connect_never_removes_an_untagged_interface_of_another_mac(node, pod_ns, driver,
                                                                    kind):
    """Issue 13 item 6: untagged, and not the VIF's MAC: someone else's."""
    pod = pod_ns()
    vif = make_vif(kind)
    extra = ['id', str(VLAN_ID)] if kind == 'vlan' else ['mode', 'bridge']
    node.ip('link', 'add', 'link', PARENT, 'name', 'eth0', 'netns', pod.name, 'address',
            'fa:16:3e:99:99:99', 'type', kind, *extra)
    with pytest.raises(errors.BindingFailed, match='belongs to another owner'):
        driver.connect(vif, dataclasses.replace(pod.plug(), mac=vif.mac))
    assert pod.link('eth0')['address'] == 'fa:16:3e:99:99:99'


def test_connect_never_takes_over_a_foreign_interface(node, pod_ns, driver, kind):
    pod = pod_ns()
    extra = ['id', str(VLAN_ID)] if kind == 'vlan' else ['mode', 'bridge']
    node.ip('link', 'add', 'link', PARENT, 'name', 'eth0', 'netns', pod.name, 'type', kind,
            *extra)
    pod.ip('link', 'set', 'eth0', 'alias', 'kuryr-cni:someone-else:eth0')

    with pytest.raises(errors.BindingFailed, match='belongs to another owner'):
        driver.connect(make_vif(kind), pod.plug())
    assert pod.link('eth0')['ifalias'] == 'kuryr-cni:someone-else:eth0'


def test_connect_refuses_an_mtu_larger_than_the_parents(node, pod_ns, driver, kind):
    pod = pod_ns()
    node.ip('link', 'set', PARENT, 'mtu', '1400')
    with pytest.raises(errors.InvalidVIF, match='MTU 1450 is larger than the MTU 1400 of '
                                                'parent trunk0') as exc:
        driver.connect(make_vif(kind), pod.plug())
    assert exc.value.code == 7
    assert sorted(pod.links()) == ['lo']


def test_parent_defaults_to_link_iface(node, pod_ns, kind):
    pod = pod_ns()
    driver = binding.get_driver(kind, host_netns=node.path,
                                options=binding.Options(link_iface=PARENT))
    driver.connect(make_vif(kind, parent=None), pod.plug())
    assert pod.link('eth0')['link_index'] == node.links()[PARENT]['ifindex']


def test_a_missing_parent_is_refused(pod_ns, driver, kind):
    pod = pod_ns()
    with pytest.raises(errors.BindingFailed, match='parent interface nope0 does not exist'):
        driver.connect(make_vif(kind, parent='nope0'), pod.plug())
    assert sorted(pod.links()) == ['lo']


def _kubelet_listening(node, address):
    """A socket of the node namespace listening on kubelet's port, as kubelet's would."""
    family = socket.AF_INET6 if ':' in address else socket.AF_INET
    sock = netns.socket_in(node.path, family, socket.SOCK_STREAM)
    sock.bind((address, default_parent.KUBELET_PORT))
    sock.listen(1)
    return sock


@pytest.mark.parametrize('kubelet', [None, '::', '0.0.0.0', '10.55.0.2'])
def test_without_link_iface_the_parent_is_found_as_upstream_finds_it(node, pod_ns, kind,
                                                                     kubelet):
    """kubelet's address when it listens on one (mgmt0's), else the first non-loopback."""
    node.ip('link', 'add', 'mgmt0', 'type', 'veth', 'peer', 'name', 'mgmt1')
    node.ip('addr', 'add', '10.55.0.2/24', 'dev', 'mgmt0')
    node.ip('link', 'set', 'mgmt0', 'up')
    sock = _kubelet_listening(node, kubelet) if kubelet else None
    try:
        pod = pod_ns()
        driver = binding.get_driver(kind, host_netns=node.path)

        driver.connect(make_vif(kind, parent=None), pod.plug())

        expected = 'mgmt0' if kubelet == '10.55.0.2' else PARENT     # trunk0: index before mgmt0
        assert pod.link('eth0')['link_index'] == node.links()[expected]['ifindex']
        driver.check(make_vif(kind, parent=None), pod.plug())
    finally:
        if sock is not None:
            sock.close()


# A process of user nobody listening in the node namespace; prints "ready" once it listens.
_LISTEN_AS_NOBODY = '''
import os, socket, sys
os.setgroups([]); os.setgid(65534); os.setuid(65534)
family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
sock = socket.socket(family, socket.SOCK_STREAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind((sys.argv[1], int(sys.argv[2])))
sock.listen(1)
print("ready", flush=True)
sys.stdin.read()
'''


def _listening_as_nobody(node, address):
    proc = subprocess.Popen(['ip', 'netns', 'exec', node.name, sys.executable, '-c',
                             _LISTEN_AS_NOBODY, address, str(default_parent.KUBELET_PORT)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == 'ready\n'
    return proc


def _stop(proc):
    proc.stdin.close()
    proc.wait(timeout=10)


def _with_mgmt0(node):
    node.ip('link', 'add', 'mgmt0', 'type', 'veth', 'peer', 'name', 'mgmt1')
    node.ip('addr', 'add', '10.55.0.2/24', 'dev', 'mgmt0')
    node.ip('link', 'set', 'mgmt0', 'up')


def _second_vif(kind):
    other_vlan = {'vlan_id': VLAN_ID + 1} if kind == 'vlan' else {}
    return make_vif(kind, parent=None, n=6, **other_vlan)


@pytest.mark.parametrize('kubelet, intruder, expected', [
    (None, '10.55.0.2', PARENT),    # kubelet restarting: the user's alone would steer
    ('10.55.0.2', '127.0.0.1', 'mgmt0'),    # a second listener would push it off kubelet's
], ids=['steer-to-theirs', 'push-off-kubelets'])
def test_a_local_users_listener_on_kubelets_port_does_not_steer_the_parent(
        node, pod_ns, kind, kubelet, intruder, expected):
    """Issue 31 hole 6: any user may listen on 10250, at the address of the interface
    they choose; only root's sockets count."""
    _with_mgmt0(node)
    sock = _kubelet_listening(node, kubelet) if kubelet else None
    other = _listening_as_nobody(node, intruder)
    try:
        pod = pod_ns()
        driver = binding.get_driver(kind, host_netns=node.path)

        driver.connect(make_vif(kind, parent=None), pod.plug())

        assert pod.link('eth0')['link_index'] == node.links()[expected]['ifindex']
    finally:
        _stop(other)
        if sock is not None:
            sock.close()


def test_the_default_parent_is_decided_once_and_logged(node, pod_ns, kind, caplog):
    """A parent that moved as kubelet (re)started would split the node's pods."""
    _with_mgmt0(node)
    caplog.set_level('INFO', logger='kuryr_cni.binding.default_parent')
    driver = binding.get_driver(kind, host_netns=node.path)
    first, second = pod_ns(), pod_ns()
    driver.connect(make_vif(kind, parent=None), first.plug())
    sock = _kubelet_listening(node, '10.55.0.2')    # kubelet now listens on mgmt0's
    try:
        driver.connect(_second_vif(kind), second.plug('sandbox-2'))
    finally:
        sock.close()

    for pod in (first, second):
        assert pod.link('eth0')['link_index'] == node.links()[PARENT]['ifindex']
    assert [r.getMessage() for r in caplog.records
            if r.name == 'kuryr_cni.binding.default_parent'] == [
        'Nested VIFs that name no parent use %s (the first interface that is not a '
        'loopback: root\'s 0 sockets on port 10250 name no one interface); set [binding] '
        'link_iface to choose' % PARENT]


def test_a_node_with_only_loopback_has_no_default_parent(netns_factory, pod_ns, kind):
    node = netns_factory()
    pod = pod_ns()
    driver = binding.get_driver(kind, host_netns=node.path)
    with pytest.raises(errors.BindingFailed, match='no parent interface'):
        driver.connect(make_vif(kind, parent=None), pod.plug())
    assert sorted(pod.links()) == ['lo']


def test_failed_connect_leaves_nothing_behind(pod_ns, driver, kind):
    """A route to one of the VIF's networks already in the pod makes the last step fail."""
    pod = pod_ns()
    pod.ip('link', 'add', 'other0', 'type', 'veth', 'peer', 'name', 'other1')
    pod.ip('addr', 'add', '10.77.0.2/24', 'dev', 'other0')
    pod.ip('link', 'set', 'other0', 'up')
    pod.ip('route', 'add', '192.168.0.0/16', 'via', '10.77.0.1', 'dev', 'other0', 'onlink')

    with pytest.raises(errors.BindingFailed) as exc:
        driver.connect(make_vif(kind), pod.plug())
    assert exc.value.code == 101 and 'File exists' in exc.value.details
    assert 'eth0' not in pod.links()


# -- an older sandbox of the same pod ----------------------------------------

def test_older_sandbox_blocks_until_its_owner_tagged_interface_is_removed(
        pod_ns, driver, kind):
    """The kernel refuses a second VLAN ID / an address already up on the parent.

    Removing the old sandbox's interface is disconnect of *its* plug (its
    namespace comes from the pod binding), which deletes it only because its
    alias names that sandbox; the new sandbox then plugs.
    """
    old_ns, new_ns = pod_ns(), pod_ns()
    old, new = old_ns.plug('sandbox-a'), new_ns.plug('sandbox-b')
    driver.connect(make_vif(kind), old)

    with pytest.raises(errors.BindingFailed) as exc:
        driver.connect(make_vif(kind), new)
    expected = 'VLAN 100 on trunk0 is held' if kind == 'vlan' else 'Address already in use'
    assert expected in exc.value.msg + exc.value.details
    assert 'eth0' not in new_ns.links()
    assert old_ns.link('eth0')['ifalias'] == 'kuryr-cni:sandbox-a:eth0'

    driver.disconnect(new)                      # the new one's DEL: not its interface
    assert 'eth0' in old_ns.links()
    driver.disconnect(old)                      # eviction by the old one's record
    assert 'eth0' not in old_ns.links()
    driver.connect(make_vif(kind), new)
    driver.check(make_vif(kind), new)


# -- disconnect ----------------------------------------------------------------

def test_disconnect_removes_the_interface_and_is_idempotent(pod_ns, driver, kind):
    pod = pod_ns()
    plug = pod.plug()
    driver.connect(make_vif(kind), plug)
    driver.disconnect(plug)
    assert sorted(pod.links()) == ['lo']
    driver.disconnect(plug)
    driver.disconnect(binding.Plug(plug.container_id, '', 'eth0', True))   # second DEL


def test_disconnect_after_the_namespace_is_gone(netns_factory, driver, kind):
    pod = netns_factory()
    plug = pod.plug()
    driver.connect(make_vif(kind), plug)
    pod.delete()
    driver.disconnect(plug)


def test_disconnect_leaves_a_foreign_interface(pod_ns, driver, kind):
    pod = pod_ns()
    plug = pod.plug()
    driver.connect(make_vif(kind), plug)
    pod.ip('link', 'set', 'eth0', 'alias', 'kuryr-cni:sandbox-z:eth0')
    driver.disconnect(plug)
    assert 'eth0' in pod.links()


# -- check -------------------------------------------------------------------

@pytest.mark.parametrize('change, complaint', [
    (('link', 'set', 'eth0', 'address', 'fa:16:3e:00:00:99'), 'has MAC'),
    (('addr', 'del', 'fd99::5/64', 'dev', 'eth0'), 'lacks address fd99::5/64'),
    (('route', 'del', '172.16.0.0/12'), 'lacks route 172.16.0.0/12'),
    (('link', 'set', 'eth0', 'alias', 'x'), 'has alias'),
    (('link', 'set', 'eth0', 'down'), 'is down'),
    (('link', 'del', 'eth0'), 'eth0 is missing'),
])
def test_check_passes_then_reports_the_difference(pod_ns, driver, kind, change, complaint):
    pod = pod_ns()
    plug = pod.plug()
    driver.connect(make_vif(kind), plug)
    driver.check(make_vif(kind), plug)
    pod.ip(*change)
    with pytest.raises(errors.CheckFailed) as exc:
        driver.check(make_vif(kind), plug)
    assert exc.value.code == 100 and complaint in exc.value.details


def test_check_notices_another_vlan_or_mode(pod_ns, driver, kind):
    pod = pod_ns()
    plug = pod.plug()
    driver.connect(make_vif(kind), plug)
    if kind == 'vlan':
        other, complaint = make_vif(kind, vlan_id=VLAN_ID + 1), 'has VLAN ID 100, not 101'
    else:
        other, complaint = make_vif('vlan', vlan_id=3), 'is a macvlan interface, not vlan'
        driver = binding.get_driver('vlan', host_netns=driver.host_netns)
    with pytest.raises(errors.CheckFailed) as exc:
        driver.check(other, plug)
    assert complaint in exc.value.details


def test_owner_tag_is_on_the_pod_side(pod_ns, driver, kind):
    pod = pod_ns()
    driver.connect(make_vif(kind), pod.plug('sandbox-q', 'net1', False))
    assert owner_tag.parse_alias(pod.link('net1')['ifalias']) == ('sandbox-q', 'net1')
