"""The bridge binding driver and the namespace helpers, against a real kernel.

Every test builds a node (``host_ns``: bridge kc-br0 holding the gateways)
and pods in throwaway namespaces, and asserts what ``ip`` shows there.
"""

import concurrent.futures
import dataclasses
import logging
import os
import shutil
import socket
import threading

import pytest

from kuryr_cni import binding
from kuryr_cni import errors
from kuryr_cni import netns
from kuryr_cni import vif as vif_model
from kuryr_cni.binding import base
from kuryr_cni.binding import bridge
from kuryr_cni.binding import noop
from kuryr_cni.binding import owner_tag
from tests.functional.conftest import BRIDGE
from tests.functional.conftest import CAN_RUN
from tests.functional.conftest import GATEWAY4
from tests.functional.conftest import GATEWAY6
from tests.functional.conftest import SKIP_REASON

pytestmark = pytest.mark.skipif(not CAN_RUN, reason=SKIP_REASON)

needs_ping = pytest.mark.skipif(shutil.which('ping') is None,
                                reason='ping (iputils-ping) is not installed')

MAC = 'fa:16:3e:00:00:05'
MTU = 1450


def make_vif(n=5, **changes):
    spec = {'kind': 'bridge', 'port_id': 'port-%d' % n, 'mac': 'fa:16:3e:00:00:%02x' % n,
            'mtu': MTU, 'bridge': BRIDGE, 'ips': ['10.99.0.%d/24' % n, 'fd99::%x/64' % n],
            'gateway': [GATEWAY4, GATEWAY6],
            'routes': [{'dst': '192.168.0.0/16', 'gw': '10.99.0.254'},
                       {'dst': '172.16.0.0/12'}],
            'active': True}
    spec.update(changes)
    return vif_model.parse_vif(spec)


@pytest.fixture
def driver(host_ns):
    return bridge.BridgeDriver(host_netns=host_ns.path)


def host_device(host_ns, plug):
    return host_ns.links().get(owner_tag.host_ifname(plug.container_id, plug.ifname))


# -- connect -----------------------------------------------------------------

def test_connect_configures_pod_interface(host_ns, pod_ns, driver):
    pod = pod_ns()
    plug = pod.plug()
    driver.connect(make_vif(), plug)

    eth0 = pod.link('eth0')
    assert eth0['address'] == MAC
    assert eth0['mtu'] == MTU
    assert 'UP' in eth0['flags'] and eth0['linkinfo']['info_kind'] == 'veth'
    assert pod.addresses('eth0') == {'10.99.0.5/24', 'fd99::5/64'}
    v6 = [a for a in eth0['addr_info'] if a['local'] == 'fd99::5'][0]
    assert v6.get('nodad') and not v6.get('tentative')
    routes = pod.routes()
    assert {('default', GATEWAY4, 'eth0'), ('default', GATEWAY6, 'eth0'),
            ('192.168.0.0/16', '10.99.0.254', 'eth0'),
            ('172.16.0.0/12', None, 'eth0')} <= routes
    assert 'UP' in pod.links()['lo']['flags']


def _ipv6_addresses(pod, ifname):
    return [a for a in pod.link(ifname).get('addr_info', []) if a['family'] == 'inet6']


def test_ipv4_only_vif_gets_no_ipv6_link_local(host_ns, pod_ns, driver):
    """No fe80 address: no DAD, MLD or router solicitations for the bridge to flood."""
    pod = pod_ns()
    driver.connect(make_vif(ips=['10.99.0.5/24'], gateway=[GATEWAY4]), pod.plug())
    assert pod.addresses('eth0') == {'10.99.0.5/24'}
    assert _ipv6_addresses(pod, 'eth0') == []
    assert pod.pings(GATEWAY4)


def test_dual_stack_vif_keeps_the_kernels_link_local(host_ns, pod_ns, driver):
    pod = pod_ns()
    driver.connect(make_vif(), pod.plug())
    assert [a['local'][:5] for a in _ipv6_addresses(pod, 'eth0') if a['scope'] == 'link'] \
        == ['fe80:']


def test_ipv6_link_local_always_gives_ipv4_only_vifs_one(host_ns, pod_ns):
    always = bridge.BridgeDriver(host_netns=host_ns.path,
                                 options=base.Options(ipv6_link_local='always'))
    pod = pod_ns()
    always.connect(make_vif(ips=['10.99.0.5/24'], gateway=[GATEWAY4]), pod.plug())
    assert [a['local'][:5] for a in _ipv6_addresses(pod, 'eth0')] == ['fe80:']


def test_ipv4_only_vif_in_a_pod_with_ipv6_disabled(host_ns, pod_ns, driver):
    pod = pod_ns()
    disabled = pod.run('sysctl', '-qw', 'net.ipv6.conf.all.disable_ipv6=1',
                       'net.ipv6.conf.default.disable_ipv6=1')
    assert disabled.returncode == 0, disabled.stderr
    driver.connect(make_vif(ips=['10.99.0.5/24'], gateway=[GATEWAY4]), pod.plug())
    assert pod.addresses('eth0') == {'10.99.0.5/24'}
    assert pod.pings(GATEWAY4)


def test_connect_puts_owned_host_end_into_bridge(host_ns, pod_ns, driver):
    plug = pod_ns().plug(container_id='sandbox-a')
    driver.connect(make_vif(), plug)

    name = owner_tag.host_ifname('sandbox-a', 'eth0')
    dev = host_ns.links()[name]
    assert dev['ifalias'] == 'kuryr-cni:sandbox-a:eth0'
    assert dev['master'] == BRIDGE
    assert dev['mtu'] == MTU
    assert 'UP' in dev['flags'] and dev['linkinfo']['info_kind'] == 'veth'
    with netns.iproute(host_ns.path) as ipr:
        found = owner_tag.find_host_devices(ipr)
    assert [(d.ifname, d.container_id, d.pod_ifname) for d in found] == \
        [(name, 'sandbox-a', 'eth0')]


@needs_ping
def test_host_end_is_up_without_ipv6_address(host_ns, pod_ns, driver):
    """A bridge port needs no address: a link-local one floods DAD, MLD and RS to every port."""
    pod = pod_ns()
    plug = pod.plug()
    driver.connect(make_vif(), plug)     # dual-stack: the pod end keeps its link-local address
    host_end = host_ns.link(owner_tag.host_ifname(plug.container_id, plug.ifname))
    assert 'UP' in host_end['flags']
    assert _ipv6_addresses(host_ns, host_end['ifname']) == []
    assert [a['local'][:5] for a in _ipv6_addresses(pod, 'eth0') if a['scope'] == 'link'] \
        == ['fe80:']
    assert pod.pings(GATEWAY4) and pod.pings(GATEWAY6)


def test_connect_without_default_route(host_ns, pod_ns, driver):
    pod = pod_ns()
    driver.connect(make_vif(), pod.plug(ifname='net1', default_route=False))

    routes = pod.routes()
    assert not [r for r in routes if r[0] == 'default']
    assert ('192.168.0.0/16', '10.99.0.254', 'net1') in routes


@needs_ping
def test_pod_pings_gateway(host_ns, pod_ns, driver):
    pod = pod_ns()
    driver.connect(make_vif(), pod.plug())

    assert pod.pings(GATEWAY4)
    assert pod.pings(GATEWAY6)


@needs_ping
def test_two_pods_ping_each_other(host_ns, pod_ns, driver):
    a, b = pod_ns(), pod_ns()
    driver.connect(make_vif(5), a.plug(container_id='a'))
    driver.connect(make_vif(6), b.plug(container_id='b'))

    assert a.pings('10.99.0.6')
    assert b.pings('10.99.0.5')
    assert a.pings('fd99::6')


@needs_ping
def test_connect_twice_converges_on_one_interface(host_ns, pod_ns, driver):
    pod = pod_ns()
    plug = pod.plug()
    driver.connect(make_vif(), plug)
    driver.connect(make_vif(), plug)

    with netns.iproute(host_ns.path) as ipr:
        assert len(owner_tag.find_host_devices(ipr, 'c0ffee')) == 1
    assert sorted(pod.links()) == ['eth0', 'lo']
    assert pod.addresses('eth0') == {'10.99.0.5/24', 'fd99::5/64'}
    driver.check(make_vif(), plug)
    assert pod.pings(GATEWAY4)


def test_connect_replaces_half_made_leftovers(host_ns, pod_ns, driver):
    """A connect that died before setting the alias left an untagged pair."""
    pod = pod_ns()
    plug = pod.plug()
    name = owner_tag.host_ifname(plug.container_id, plug.ifname)
    host_ns.ip('link', 'add', name, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', pod.name)

    driver.connect(make_vif(), plug)

    assert host_device(host_ns, plug)['ifalias'] == owner_tag.alias('c0ffee', 'eth0')
    assert pod.link('eth0')['address'] == MAC
    driver.check(make_vif(), plug)


@pytest.mark.parametrize('leftover', ['tagged', 'untagged-with-its-mac'])
def test_connect_replaces_what_the_same_plug_left_in_the_pod(host_ns, pod_ns, driver, leftover):
    """The runtime retried after a failure left eth0 (alone) in the pod."""
    pod = pod_ns()
    plug = pod.plug()
    pod.ip('link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'stale0')
    if leftover == 'tagged':
        pod.ip('link', 'set', 'eth0', 'alias', owner_tag.alias(plug.container_id, 'eth0'))
    else:       # made, but killed before it was tagged: only its MAC says it is ours
        pod.ip('link', 'set', 'eth0', 'address', MAC)
        plug = dataclasses.replace(plug, mac=MAC)

    driver.connect(make_vif(), plug)

    assert sorted(pod.links()) == ['eth0', 'lo']
    assert pod.link('eth0')['address'] == MAC
    assert pod.links()['eth0']['ifalias'] == owner_tag.alias(plug.container_id, 'eth0')


def test_connect_never_removes_a_pod_interface_it_cannot_prove_its_own(host_ns, pod_ns,
                                                                       driver):
    """Issue 13 item 6: an eth0 untagged and with another MAC is someone else's."""
    pod = pod_ns()
    pod.ip('link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'stale0')
    foreign = pod.link('eth0')['address']

    with pytest.raises(errors.BindingFailed) as exc:
        driver.connect(make_vif(), dataclasses.replace(pod.plug(), mac=MAC))

    assert 'another owner' in exc.value.msg
    assert pod.link('eth0')['address'] == foreign
    assert owner_tag.host_ifname('c0ffee', 'eth0') not in host_ns.links()


def test_connect_never_takes_over_a_foreign_device(host_ns, pod_ns, driver):
    plug = pod_ns().plug()
    name = owner_tag.host_ifname(plug.container_id, plug.ifname)
    host_ns.ip('link', 'add', name, 'type', 'veth', 'peer', 'name', 'other0')
    host_ns.ip('link', 'set', name, 'alias', owner_tag.alias('someone-else', 'eth0'))

    with pytest.raises(errors.BindingFailed) as exc:
        driver.connect(make_vif(), plug)

    assert 'another owner' in exc.value.msg
    assert host_ns.links()[name]['ifalias'] == owner_tag.alias('someone-else', 'eth0')


def test_a_default_route_already_in_the_pod_is_kept(host_ns, pod_ns, driver, caplog):
    """Multus runs the cluster network's delegate first, and it owns the default route.

    Before: code 101 (EEXIST), so kuryr-cni as a secondary network failed every
    ADD; kuryr-daemon kept the existing route (Launchpad bug 1852382), as does
    this daemon now. The family without one still gets the VIF's.
    """
    pod = pod_ns()
    pod.ip('link', 'add', 'other0', 'type', 'veth', 'peer', 'name', 'other1')
    pod.ip('addr', 'add', '10.77.0.2/24', 'dev', 'other0')
    pod.ip('link', 'set', 'other0', 'up')
    pod.ip('route', 'add', 'default', 'via', '10.77.0.1', 'dev', 'other0', 'onlink')
    plug = pod.plug()
    with caplog.at_level(logging.INFO, logger='kuryr_cni.binding.podside'):
        driver.connect(make_vif(), plug)
    routes = pod.routes()
    assert ('default', '10.77.0.1', 'other0') in routes
    assert ('default', GATEWAY4, 'eth0') not in routes
    assert ('default', GATEWAY6, 'eth0') in routes
    assert ('192.168.0.0/16', '10.99.0.254', 'eth0') in routes
    driver.check(make_vif(), plug)              # what CHECK expects of a kept route
    assert [r.getMessage() for r in caplog.records if 'default route' in r.getMessage()] == [
        'eth0 in %s: the pod has a default route already: kept, the one via %s not added'
        % (plug.netns, GATEWAY4)]


def test_failed_connect_leaves_nothing_behind(host_ns, pod_ns, driver):
    """A route to one of the VIF's networks already in the pod makes the last step fail."""
    pod = pod_ns()
    pod.ip('link', 'add', 'other0', 'type', 'veth', 'peer', 'name', 'other1')
    pod.ip('addr', 'add', '10.77.0.2/24', 'dev', 'other0')
    pod.ip('link', 'set', 'other0', 'up')
    pod.ip('route', 'add', '192.168.0.0/16', 'via', '10.77.0.1', 'dev', 'other0', 'onlink')
    plug = pod.plug()

    with pytest.raises(errors.BindingFailed) as exc:
        driver.connect(make_vif(), plug)

    assert exc.value.code == 101 and 'File exists' in exc.value.details
    assert host_device(host_ns, plug) is None
    assert 'eth0' not in pod.links()
    assert ('192.168.0.0/16', '10.77.0.1', 'other0') in pod.routes()


def test_connect_refuses_a_missing_bridge_and_creates_nothing(netns_factory, pod_ns):
    node = netns_factory()
    driver = bridge.BridgeDriver(host_netns=node.path)
    pod = pod_ns()

    with pytest.raises(errors.BindingFailed, match='bridge %s does not exist' % BRIDGE):
        driver.connect(make_vif(), pod.plug())

    assert set(node.links()) == {'lo'}
    assert set(pod.links()) == {'lo'}


@pytest.mark.parametrize('tagged', [True, False], ids=['ours', 'untagged'])
def test_connect_refuses_the_private_bridge_of_a_hybrid_port(host_ns, pod_ns, tagged):
    """Untagged too: kuryr-daemon's or a Nova instance's qbr (issue 31 hole 3)."""
    host_ns.ip('link', 'add', 'qbr5d0b-port-5', 'type', 'bridge')
    if tagged:
        host_ns.ip('link', 'set', 'qbr5d0b-port-5', 'alias', owner_tag.alias('other', 'eth0'))
    driver = bridge.BridgeDriver(host_netns=host_ns.path)
    pod = pod_ns()

    with pytest.raises(errors.VIFNotAllowed, match='private bridge'):
        driver.connect(make_vif(bridge='qbr5d0b-port-5'), pod.plug())

    assert set(pod.links()) == {'lo'}
    assert [n for n, link in host_ns.links().items()
            if link.get('master') == 'qbr5d0b-port-5'] == []


def test_concurrent_connects_share_one_bridge_not_looked_up_yet(netns_factory, pod_ns):
    node = netns_factory()
    node.ip('link', 'add', BRIDGE, 'type', 'bridge')
    node.ip('link', 'set', BRIDGE, 'up')
    driver = bridge.BridgeDriver(host_netns=node.path)
    plugs = [pod_ns().plug(container_id='racer-%d' % n) for n in range(8)]
    start = threading.Barrier(len(plugs))

    def connect(n):
        start.wait()
        driver.connect(make_vif(10 + n), plugs[n])

    with concurrent.futures.ThreadPoolExecutor(len(plugs)) as pool:
        list(pool.map(connect, range(len(plugs))))

    bridges = [link for link in node.links().values()
               if link.get('linkinfo', {}).get('info_kind') == 'bridge']
    assert [b['ifname'] for b in bridges] == [BRIDGE]
    for n, plug in enumerate(plugs):
        assert host_device(node, plug)['master'] == BRIDGE
        driver.check(make_vif(10 + n), plug)


def test_connect_uses_existing_bridge_as_it_is(host_ns, pod_ns, driver):
    before = host_ns.link(BRIDGE)

    driver.connect(make_vif(), pod_ns().plug())

    after = host_ns.link(BRIDGE)
    assert after['ifindex'] == before['ifindex']
    assert host_ns.addresses(BRIDGE) == {GATEWAY4 + '/24', GATEWAY6 + '/64'}


def test_a_bridge_made_anew_within_the_trusted_second_is_found(netns_factory, pod_ns):
    node = netns_factory()
    node.ip('link', 'add', BRIDGE, 'type', 'bridge')
    node.ip('link', 'set', BRIDGE, 'up')
    driver = bridge.BridgeDriver(host_netns=node.path)
    first, second = pod_ns().plug(container_id='first'), pod_ns().plug(container_id='second')
    driver.connect(make_vif(), first)                      # looks the bridge up, remembers it
    old_index = node.link(BRIDGE)['ifindex']
    node.ip('link', 'del', BRIDGE)
    node.ip('link', 'add', BRIDGE, 'type', 'bridge')

    driver.connect(make_vif(6), second)                     # the remembered index names nothing

    assert node.link(BRIDGE)['ifindex'] != old_index
    assert host_device(node, second)['master'] == BRIDGE
    driver.check(make_vif(6), second)


def test_a_bridge_mtu_raised_within_the_trusted_second_is_seen(host_ns, pod_ns, driver):
    host_ns.ip('link', 'set', BRIDGE, 'mtu', str(MTU - 50))
    with pytest.raises(errors.InvalidVIF, match='MTU'):
        driver.connect(make_vif(), pod_ns().plug(container_id='too-big'))
    host_ns.ip('link', 'set', BRIDGE, 'mtu', str(MTU))
    plug = pod_ns().plug()

    driver.connect(make_vif(), plug)

    driver.check(make_vif(), plug)


def test_connect_refuses_a_device_that_is_no_bridge(host_ns, pod_ns):
    host_ns.ip('link', 'add', 'notabr', 'type', 'veth', 'peer', 'name', 'notabr1')
    driver = bridge.BridgeDriver(host_netns=host_ns.path)

    with pytest.raises(errors.BindingFailed, match='not a bridge'):
        driver.connect(make_vif(bridge='notabr'), pod_ns().plug())


@pytest.mark.parametrize('target', ['host', 'own'])
def test_connect_refuses_host_namespace(host_ns, driver, target):
    path = host_ns.path if target == 'host' else '/proc/self/ns/net'
    before = host_ns.links()

    with pytest.raises(errors.InvalidEnvironment, match='host network namespace'):
        driver.connect(make_vif(), binding.Plug('c', path, 'eth0', True))

    assert host_ns.links().keys() == before.keys()


# -- disconnect --------------------------------------------------------------

def test_disconnect_removes_both_ends_and_is_idempotent(host_ns, pod_ns, driver):
    pod = pod_ns()
    plug = pod.plug()
    driver.connect(make_vif(), plug)

    driver.disconnect(plug)
    driver.disconnect(plug)

    assert host_device(host_ns, plug) is None
    assert sorted(pod.links()) == ['lo']
    assert BRIDGE in host_ns.links()


def test_disconnect_after_netns_deleted(host_ns, netns_factory, driver):
    pod = netns_factory()
    plug = pod.plug()
    driver.connect(make_vif(), plug)
    pod.delete()

    driver.disconnect(plug)
    driver.disconnect(plug)

    assert host_device(host_ns, plug) is None


def test_disconnect_with_empty_netns_removes_host_end(host_ns, pod_ns, driver):
    plug = pod_ns().plug()
    driver.connect(make_vif(), plug)

    driver.disconnect(binding.Plug(plug.container_id, '', plug.ifname, True))

    assert host_device(host_ns, plug) is None


@needs_ping
def test_disconnect_of_a_never_removes_b(host_ns, pod_ns, driver):
    """Two sandboxes of one pod, same pod ifname: DEL(A) leaves B working."""
    a, b = pod_ns(), pod_ns()
    plug_a, plug_b = a.plug(container_id='sandbox-a'), b.plug(container_id='sandbox-b')
    driver.connect(make_vif(), plug_a)
    driver.disconnect(plug_a)                  # A is gone before B arrives...
    driver.connect(make_vif(), plug_b)
    driver.connect(make_vif(), plug_a)         # ...or both live at once
    driver.disconnect(plug_a)
    driver.disconnect(plug_a)

    assert host_device(host_ns, plug_a) is None
    assert host_device(host_ns, plug_b)['ifalias'] == 'kuryr-cni:sandbox-b:eth0'
    assert b.link('eth0')['address'] == MAC
    driver.check(make_vif(), plug_b)
    assert b.pings(GATEWAY4)


def test_disconnect_leaves_a_foreign_device_with_our_name(host_ns, pod_ns, driver):
    pod = pod_ns()
    plug = pod.plug()
    name = owner_tag.host_ifname(plug.container_id, plug.ifname)
    host_ns.ip('link', 'add', name, 'type', 'veth', 'peer', 'name', 'other0')
    host_ns.ip('link', 'set', name, 'alias', owner_tag.alias('someone-else', 'eth0'))

    driver.disconnect(plug)

    assert name in host_ns.links() and 'other0' in host_ns.links()


def test_disconnect_refuses_host_namespace(host_ns, driver):
    host_ns.ip('link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'eth1')

    with pytest.raises(errors.InvalidEnvironment):
        driver.disconnect(binding.Plug('c', host_ns.path, 'eth0', True))

    assert 'eth0' in host_ns.links()


# -- check -------------------------------------------------------------------

@pytest.mark.parametrize('change, complaint', [
    (('pod', 'link', 'set', 'eth0', 'address', 'fa:16:3e:00:00:99'), 'has MAC'),
    (('pod', 'link', 'set', 'eth0', 'mtu', '1400'), 'has MTU'),
    (('pod', 'addr', 'del', '10.99.0.5/24', 'dev', 'eth0'), 'lacks address 10.99.0.5/24'),
    (('pod', 'route', 'del', '192.168.0.0/16'), 'lacks route 192.168.0.0/16'),
    (('pod', '-6', 'route', 'del', 'default'), 'lacks route ::/0'),
    (('pod', 'link', 'set', 'eth0', 'down'), 'is down'),
    (('host', 'link', 'set', '{host}', 'nomaster'), 'not enslaved'),
    (('host', 'link', 'set', '{host}', 'alias', 'x'), 'has alias'),
    (('host', 'link', 'del', '{host}'), 'is missing'),
])
def test_check_passes_then_reports_the_difference(host_ns, pod_ns, driver, change, complaint):
    pod = pod_ns()
    plug = pod.plug()
    driver.connect(make_vif(), plug)
    driver.check(make_vif(), plug)

    where, *args = change
    name = owner_tag.host_ifname(plug.container_id, plug.ifname)
    (pod if where == 'pod' else host_ns).ip(*[a.format(host=name) for a in args])

    with pytest.raises(errors.CheckFailed) as exc:
        driver.check(make_vif(), plug)
    assert exc.value.code == 100
    assert complaint in exc.value.details


# -- namespace helpers against real namespaces -------------------------------

def test_check_netns_accepts_a_real_netns(pod_ns):
    pod = pod_ns()
    netns.check_netns(pod.path)
    assert netns.exists(pod.path)


def test_check_netns_refuses_the_given_host_namespace(host_ns):
    with pytest.raises(errors.InvalidEnvironment, match='host network namespace'):
        netns.check_netns(host_ns.path, host=host_ns.path)


def test_iproute_is_bound_to_the_namespace(host_ns):
    with netns.iproute(host_ns.path) as ipr:
        names = {link.get('ifname') for link in ipr.link('dump')}
    assert names == set(host_ns.links()) == {'lo', BRIDGE}


def test_the_namespace_runner_comes_home_and_stays_the_only_one(host_ns, pod_ns):
    """Every thread of the process, the runner included, is back in its own
    namespace after each call, and one runner thread serves them all."""
    pods = [pod_ns() for _ in range(3)]
    for pod in pods * 2:
        assert netns.link_names(pod.path) == {'lo'}
        with netns.iproute(pod.path) as ipr:
            assert [link.get('ifname') for link in ipr.link('dump')] == ['lo']
    own = os.stat('/proc/self/ns/net').st_ino
    tasks = os.listdir('/proc/self/task')
    assert {os.stat('/proc/self/task/%s/ns/net' % tid).st_ino for tid in tasks} == {own}
    runners = [t for t in threading.enumerate() if t.name == 'kuryr-cni-netns']
    assert len(runners) == 1


def test_iproute_never_creates_a_namespace(netns_factory):
    gone = netns_factory()
    gone.delete()

    with pytest.raises(netns.NamespaceNotFound):
        with netns.iproute(gone.path):
            pass
    assert not netns.exists(gone.path)


def test_socket_in_reaches_a_server_inside_the_namespace(pod_ns):
    pod = pod_ns()
    pod.ip('link', 'set', 'lo', 'up')
    with netns.socket_in(pod.path, socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(('127.0.0.1', 0))
        server.listen(1)
        port = server.getsockname()[1]
        listening = pod.run('cat', '/proc/net/tcp').stdout
        assert ':%04X' % port in listening
        with netns.socket_in(pod.path, socket.AF_INET, socket.SOCK_STREAM) as client:
            client.settimeout(5)
            client.connect(('127.0.0.1', port))
            conn, _ = server.accept()
            with conn:
                client.sendall(b'ping')
                assert conn.recv(4) == b'ping'


# -- registry ----------------------------------------------------------------

def test_get_driver_returns_one_instance_per_kind_and_namespace(host_ns):
    first = binding.get_driver('bridge', host_netns=host_ns.path)
    assert isinstance(first, bridge.BridgeDriver) and first.host_netns == host_ns.path
    assert binding.get_driver('bridge', host_netns=host_ns.path) is first
    assert binding.get_driver('bridge') is not first
    assert isinstance(binding.get_driver('noop'), noop.NoopDriver)
    with pytest.raises(errors.InvalidVIF, match='no binding driver'):
        binding.get_driver('carrier-pigeon')


def test_noop_driver_touches_nothing(host_ns, pod_ns):
    pod = pod_ns()
    before = (host_ns.links().keys(), pod.links().keys())
    driver = binding.get_driver('noop', host_netns=host_ns.path)
    plug = pod.plug()
    driver.connect(make_vif(), plug)
    driver.check(make_vif(), plug)
    driver.disconnect(plug)
    assert (host_ns.links().keys(), pod.links().keys()) == before
