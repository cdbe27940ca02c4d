"""The netlink requests of the vlan (and macvlan) drivers, without a kernel.

The development and CI kernels have no 802.1Q support, so the vlan driver's
functional tests skip there; these run everywhere. They drive the real
driver against :mod:`tests.unit.fake_kernel` (why a stand-in: see there),
check the exact requests it sends (the creation request encoded by pyroute2
itself) and how it treats a VLAN ID another sandbox still holds: removed
only through that sandbox's own plug and owner tag, never found by scanning.
"""

import errno
import socket

import pytest
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.ifaddrmsg import IFA_F_NODAD

from kuryr_cni import errors
from kuryr_cni import vif as vif_model
from kuryr_cni.binding import base
from kuryr_cni.binding import macvlan
from kuryr_cni.binding import nested
from kuryr_cni.binding import vlan
from tests.unit import fake_kernel

HOST = 'host'
POD_A = '/run/netns/pod-a'
POD_B = '/run/netns/pod-b'


@pytest.fixture
def kernel(monkeypatch):
    kernel = fake_kernel.FakeKernel()
    kernel.add_namespace(HOST)
    kernel.add_link(HOST, 'trunk0', {'mtu': 1500})
    kernel.add_namespace(POD_A)
    kernel.add_namespace(POD_B)
    monkeypatch.setattr(nested, 'netns', kernel.netns_module())
    return kernel


@pytest.fixture
def driver(kernel):
    return vlan.VlanDriver(host_netns=HOST)


def make_vif(kind='vlan', **changes):
    spec = {'kind': kind, 'port_id': 'port-5', 'mac': 'fa:16:3e:00:00:05', 'mtu': 1450,
            'parent': 'trunk0', 'ips': ['10.99.0.5/24', 'fd99::5/64'],
            'gateway': ['10.99.0.1', 'fd99::1'],
            'routes': [{'dst': '192.168.0.0/16', 'gw': '10.99.0.254'}, {'dst': '172.16.0.0/12'}],
            'active': True}
    if kind == 'vlan':
        spec['vlan_id'] = 100
    spec.update(changes)
    return vif_model.parse_vif(spec)


def plug(netns=POD_A, container_id='sandbox-a', ifname='eth0', default_route=True):
    return base.Plug(container_id, netns, ifname, default_route)


def test_connect_sends_exactly_these_requests(kernel, driver):
    driver.connect(make_vif(), plug())

    trunk = kernel.links(HOST)['trunk0']['index']
    host = kernel.requests_in(HOST)
    assert [(m, c) for m, c, _ in host] == [('link', 'get'), ('link', 'add')]
    assert host[0][2] == {'ifname': 'trunk0'}
    create = host[1][2]
    pod_fd = create['net_ns_fd']
    assert create == {'ifname': 'eth0', 'kind': 'vlan', 'link': trunk, 'net_ns_fd': pod_fd,
                      'address': 'fa:16:3e:00:00:05', 'mtu': 1450, 'vlan_id': 100}

    wire = fake_kernel.encode_link_request('add', create)
    assert wire.get_attr('IFLA_IFNAME') == 'eth0'
    assert wire.get_attr('IFLA_LINK') == trunk
    assert wire.get_attr('IFLA_NET_NS_FD') == pod_fd
    assert wire.get_attr('IFLA_ADDRESS') == 'fa:16:3e:00:00:05'
    assert wire.get_attr('IFLA_MTU') == 1450
    linkinfo = wire.get_attr('IFLA_LINKINFO')
    assert linkinfo.get_attr('IFLA_INFO_KIND') == 'vlan'
    assert linkinfo.get_attr('IFLA_INFO_DATA').get_attr('IFLA_VLAN_ID') == 100

    eth0 = kernel.links(POD_A)['eth0']['index']
    pod = kernel.requests_in(POD_A)
    assert pod == [
        ('link', 'get', {'ifname': 'eth0'}),
        ('link', 'set', {'index': eth0, 'state': 'up', 'ifalias': 'kuryr-cni:sandbox-a:eth0'}),
        ('link', 'set', {'index': 1, 'state': 'up'}),
        ('addr', 'add', {'index': eth0, 'address': '10.99.0.5', 'prefixlen': 24}),
        ('addr', 'add', {'index': eth0, 'address': 'fd99::5', 'prefixlen': 64,
                         'flags': IFA_F_NODAD}),
        ('route', 'add', {'dst': '192.168.0.0/16', 'oif': eth0, 'family': socket.AF_INET,
                          'gateway': '10.99.0.254'}),
        ('route', 'add', {'dst': '172.16.0.0/12', 'oif': eth0, 'family': socket.AF_INET,
                          'scope': 253}),
        ('route', 'add', {'dst': '0.0.0.0/0', 'oif': eth0, 'family': socket.AF_INET,
                          'gateway': '10.99.0.1'}),
        ('route', 'add', {'dst': '::/0', 'oif': eth0, 'family': socket.AF_INET6,
                          'gateway': 'fd99::1'}),
    ]


def test_macvlan_creation_request_asks_for_bridge_mode(kernel):
    macvlan.MacvlanDriver(host_netns=HOST).connect(make_vif('macvlan'), plug())
    create = kernel.requests_in(HOST, 'link')[1][2]
    assert create['kind'] == 'macvlan' and create['macvlan_mode'] == 'bridge'
    linkinfo = fake_kernel.encode_link_request('add', create).get_attr('IFLA_LINKINFO')
    assert linkinfo.get_attr('IFLA_INFO_KIND') == 'macvlan'
    # decoded from the wire value (MACVLAN_MODE_BRIDGE, 4) by pyroute2's own table
    assert linkinfo.get_attr('IFLA_INFO_DATA').get_attr('IFLA_MACVLAN_MODE') == 'bridge'


def test_secondary_interface_gets_no_default_route(kernel, driver):
    driver.connect(make_vif(), plug(ifname='net1', default_route=False))
    routes = [kw['dst'] for m, c, kw in kernel.requests_in(POD_A, 'route')]
    assert routes == ['192.168.0.0/16', '172.16.0.0/12']


def test_retried_add_replaces_its_own_leftover(kernel, driver):
    driver.connect(make_vif(), plug())
    first = kernel.links(POD_A)['eth0']['index']
    kernel.requests.clear()

    driver.connect(make_vif(), plug())

    host = [(m, c) for m, c, _ in kernel.requests_in(HOST)]
    assert host == [('link', 'get'), ('link', 'add'), ('link', 'add')]   # EEXIST, then again
    pod = kernel.requests_in(POD_A)
    assert pod[:2] == [('link', 'get', {'ifname': 'eth0'}), ('link', 'del', {'index': first})]
    assert kernel.links(POD_A)['eth0']['ifalias'] == 'kuryr-cni:sandbox-a:eth0'


def test_vlan_held_by_an_unrecorded_device_is_left_alone(kernel, driver):
    """No record names the holder: fail with the VLAN named, delete nothing."""
    other = kernel.add_namespace('/run/netns/someone-else')
    trunk = kernel.links(HOST)['trunk0']['index']
    kernel.add_link(other, 'eth0', {'link': trunk, 'ifalias': 'kuryr-cni:sandbox-z:eth0',
                                    ('linkinfo', 'kind'): 'vlan',
                                    ('linkinfo', 'data', 'vlan_id'): 100})

    with pytest.raises(errors.BindingFailed, match='VLAN 100 on trunk0 is held by an '
                                                   'interface that is not this sandbox'):
        driver.connect(make_vif(), plug())

    assert not [(ns, c) for ns, m, c, kw in kernel.requests
                if c in ('del', 'dump') and ns != POD_A]
    assert 'eth0' in kernel.links(other)
    assert 'eth0' not in kernel.links(POD_A)


def test_older_sandbox_is_evicted_through_its_own_plug_and_tag(kernel, driver):
    old, new = plug(POD_A, 'sandbox-a'), plug(POD_B, 'sandbox-b')
    driver.connect(make_vif(), old)
    with pytest.raises(errors.BindingFailed, match='VLAN 100 on trunk0 is held'):
        driver.connect(make_vif(), new)
    kernel.requests.clear()

    driver.disconnect(old)           # what eviction does with the old sandbox's record

    old_eth0 = [kw for m, c, kw in kernel.requests_in(POD_A) if c == 'get']
    assert old_eth0 == [{'ifname': 'eth0'}]
    assert [c for m, c, kw in kernel.requests_in(POD_A)] == ['get', 'del']
    assert kernel.requests_in(HOST) == []          # nothing scanned on the host
    driver.connect(make_vif(), new)
    assert kernel.links(POD_B)['eth0']['ifalias'] == 'kuryr-cni:sandbox-b:eth0'


def test_disconnect_spares_an_interface_tagged_for_someone_else(kernel, driver):
    driver.connect(make_vif(), plug())
    kernel.links(POD_A)['eth0']['ifalias'] = 'kuryr-cni:sandbox-q:eth0'
    kernel.requests.clear()
    driver.disconnect(plug())
    assert [c for ns, m, c, kw in kernel.requests] == ['get']
    assert 'eth0' in kernel.links(POD_A)


def test_disconnect_of_a_vanished_namespace_or_none(kernel, driver):
    driver.disconnect(plug(netns='/run/netns/gone'))
    driver.disconnect(plug(netns=''))
    assert kernel.requests == []


def test_mtu_above_the_parents_is_refused_before_any_change(kernel, driver):
    kernel.links(HOST)['trunk0']['mtu'] = 1400
    with pytest.raises(errors.InvalidVIF, match='larger than the MTU 1400 of parent trunk0'):
        driver.connect(make_vif(), plug())
    assert [c for ns, m, c, kw in kernel.requests] == ['get']


def test_failure_after_creation_removes_the_interface(kernel, driver):
    kernel.failures[('addr', 'add')] = NetlinkError(errno.EPERM, 'Operation not permitted')
    with pytest.raises(errors.BindingFailed) as exc:
        driver.connect(make_vif(), plug())
    assert 'add address 10.99.0.5/24' in exc.value.msg
    assert 'netlink error %d' % errno.EPERM in exc.value.details
    assert 'eth0' not in kernel.links(POD_A)
    # Removed only once its tag (or, untagged, its MAC) showed it to be this plug's.
    assert kernel.requests_in(POD_A)[-2:] == [('link', 'get', {'ifname': 'eth0'}),
                                              ('link', 'del', {'index': 3})]


def test_kernel_without_8021q_is_a_binding_failure(kernel, driver):
    kernel.kinds.discard('vlan')
    with pytest.raises(errors.BindingFailed) as exc:
        driver.connect(make_vif(), plug())
    assert 'create vlan eth0 on trunk0' in exc.value.msg
    assert 'Unknown device type' in exc.value.details


def test_check_compares_vlan_id_parent_and_owner(kernel, driver):
    driver.connect(make_vif(), plug())
    driver.check(make_vif(), plug())
    with pytest.raises(errors.CheckFailed) as exc:
        driver.check(make_vif(vlan_id=101), plug(container_id='sandbox-b'))
    assert 'has VLAN ID 100, not 101' in exc.value.details
    assert "has alias 'kuryr-cni:sandbox-a:eth0'" in exc.value.details
