"""kuryr_cni.cni.result: the ADD result in every supported spec version.

0.3.x and 0.4.0 carry ``ips[].version``, 1.x does not; only 1.1.0 interfaces
carry ``mtu``; a prevResult is kept and ours appended; the default route is
added only for the interface that asked for it.
"""

import copy
import json

import pytest

from kuryr_cni import cni
from kuryr_cni import vif as vif_model
from kuryr_cni.cni import result

NETNS = '/var/run/netns/cni-5678'

# (version, ips carry "version", interfaces carry "mtu")
SHAPES = [
    ('0.3.0', True, False),
    ('0.3.1', True, False),
    ('0.4.0', True, False),
    ('1.0.0', False, False),
    ('1.1.0', False, True),
]


def test_shapes_cover_every_supported_version():
    assert tuple(v for v, _, _ in SHAPES) == cni.SUPPORTED_VERSIONS


def make_vif(**changes):
    spec = {'kind': 'bridge', 'port_id': '5d0b1c2d', 'mac': 'fa:16:3e:00:00:05',
            'mtu': 1450, 'bridge': 'kuryr-br0', 'ips': ['10.10.0.5/24'],
            'gateway': '10.10.0.1',
            'routes': [{'dst': '192.168.0.0/16', 'gw': '10.10.0.254'}], 'active': True}
    spec.update(changes)
    return vif_model.parse_vif({k: v for k, v in spec.items() if v is not None})


@pytest.mark.parametrize('version,with_ip_version,with_mtu', SHAPES)
def test_single_interface_exact_shape(version, with_ip_version, with_mtu):
    got = result.build(version, NETNS, [('eth0', make_vif(), True)])
    interface = {'name': 'eth0', 'mac': 'fa:16:3e:00:00:05', 'sandbox': NETNS}
    if with_mtu:
        interface['mtu'] = 1450
    ip = {'address': '10.10.0.5/24', 'interface': 0, 'gateway': '10.10.0.1'}
    if with_ip_version:
        ip['version'] = '4'
    assert got == {
        'cniVersion': version,
        'interfaces': [interface],
        'ips': [ip],
        'routes': [{'dst': '192.168.0.0/16', 'gw': '10.10.0.254'},
                   {'dst': '0.0.0.0/0', 'gw': '10.10.0.1'}],
        'dns': {},
    }
    assert json.loads(json.dumps(got)) == got


def test_0_4_0_result_literally():
    """One version spelled out in full, independent of the table's flags."""
    got = result.build('0.4.0', NETNS, [('eth0', make_vif(routes=[]), True)])
    assert got == {
        'cniVersion': '0.4.0',
        'interfaces': [{'name': 'eth0', 'mac': 'fa:16:3e:00:00:05', 'sandbox': NETNS}],
        'ips': [{'version': '4', 'address': '10.10.0.5/24', 'gateway': '10.10.0.1',
                 'interface': 0}],
        'routes': [{'dst': '0.0.0.0/0', 'gw': '10.10.0.1'}],
        'dns': {},
    }


def test_1_1_0_result_literally():
    got = result.build('1.1.0', NETNS, [('net1', make_vif(routes=[], mtu=9000), False)])
    assert got == {
        'cniVersion': '1.1.0',
        'interfaces': [{'name': 'net1', 'mac': 'fa:16:3e:00:00:05', 'sandbox': NETNS,
                        'mtu': 9000}],
        'ips': [{'address': '10.10.0.5/24', 'gateway': '10.10.0.1', 'interface': 0}],
        'routes': [],
        'dns': {},
    }


@pytest.mark.parametrize('version,with_ip_version,with_mtu', SHAPES)
def test_dual_stack_gateways_match_their_family(version, with_ip_version, with_mtu):
    vif = make_vif(ips=['10.10.0.5/24', 'fd00:10::5/64'],
                   gateway=['fd00:10::1', '10.10.0.1'], routes=[])
    got = result.build(version, NETNS, [('eth0', vif, True)])
    v4 = {'address': '10.10.0.5/24', 'interface': 0, 'gateway': '10.10.0.1'}
    v6 = {'address': 'fd00:10::5/64', 'interface': 0, 'gateway': 'fd00:10::1'}
    if with_ip_version:
        v4['version'], v6['version'] = '4', '6'
    assert got['ips'] == [v4, v6]
    assert got['routes'] == [{'dst': '::/0', 'gw': 'fd00:10::1'},
                             {'dst': '0.0.0.0/0', 'gw': '10.10.0.1'}]


def test_address_without_gateway_of_its_family_has_none():
    vif = make_vif(ips=['10.10.0.5/24', 'fd00:10::5/64'], gateway='10.10.0.1', routes=[])
    got = result.build('1.0.0', NETNS, [('eth0', vif, True)])
    assert got['ips'] == [
        {'address': '10.10.0.5/24', 'interface': 0, 'gateway': '10.10.0.1'},
        {'address': 'fd00:10::5/64', 'interface': 0}]
    assert got['routes'] == [{'dst': '0.0.0.0/0', 'gw': '10.10.0.1'}]


def test_gateway_matches_the_subnet_not_just_the_family():
    vif = make_vif(ips=['10.10.0.5/24', '172.16.0.5/24'], gateway='172.16.0.1', routes=[])
    got = result.build('1.0.0', NETNS, [('eth0', vif, False)])
    assert got['ips'] == [
        {'address': '10.10.0.5/24', 'interface': 0},
        {'address': '172.16.0.5/24', 'interface': 0, 'gateway': '172.16.0.1'}]


@pytest.mark.parametrize('version', cni.SUPPORTED_VERSIONS)
def test_no_default_route_unless_asked(version):
    got = result.build(version, NETNS, [('eth0', make_vif(), False)])
    assert got['routes'] == [{'dst': '192.168.0.0/16', 'gw': '10.10.0.254'}]
    assert got['ips'][0]['gateway'] == '10.10.0.1'     # the gateway is still reported


def test_no_gateway_means_no_default_route_even_when_asked():
    got = result.build('1.0.0', NETNS, [('eth0', make_vif(gateway=None, routes=[]), True)])
    assert got['routes'] == []
    assert got['ips'] == [{'address': '10.10.0.5/24', 'interface': 0}]


def test_route_without_gateway_has_no_gw_key():
    vif = make_vif(routes=[{'dst': '10.20.0.0/16'}, {'dst': 'fd00:20::/48', 'gw': None}],
                   ips=['10.10.0.5/24', 'fd00:10::5/64'])
    got = result.build('1.0.0', NETNS, [('eth0', vif, False)])
    assert got['routes'] == [{'dst': '10.20.0.0/16'}, {'dst': 'fd00:20::/48'}]


@pytest.mark.parametrize('version,with_ip_version,with_mtu', SHAPES)
def test_several_interfaces_index_their_addresses(version, with_ip_version, with_mtu):
    eth0 = make_vif(routes=[])
    net1 = make_vif(mac='fa:16:3e:00:00:06', ips=['10.20.0.7/24'], gateway='10.20.0.1',
                    routes=[{'dst': '10.30.0.0/16', 'gw': '10.20.0.254'}], mtu=1400)
    got = result.build(version, NETNS, [('eth0', eth0, True), ('net1', net1, False)])
    assert [i['name'] for i in got['interfaces']] == ['eth0', 'net1']
    assert [i['mac'] for i in got['interfaces']] == ['fa:16:3e:00:00:05', 'fa:16:3e:00:00:06']
    assert [i.get('mtu') for i in got['interfaces']] == ([1450, 1400] if with_mtu
                                                         else [None, None])
    assert [(ip['address'], ip['interface'], ip['gateway']) for ip in got['ips']] == [
        ('10.10.0.5/24', 0, '10.10.0.1'), ('10.20.0.7/24', 1, '10.20.0.1')]
    assert got['routes'] == [{'dst': '0.0.0.0/0', 'gw': '10.10.0.1'},
                             {'dst': '10.30.0.0/16', 'gw': '10.20.0.254'}]


PREV = {
    'cniVersion': '1.0.0',
    'interfaces': [{'name': 'cni0', 'mac': '00:11:22:33:44:55'},
                   {'name': 'eth0', 'mac': '00:11:22:33:44:66', 'sandbox': NETNS}],
    'ips': [{'address': '192.168.1.5/24', 'interface': 1, 'gateway': '192.168.1.1'}],
    'routes': [{'dst': '172.30.0.0/16'}],
    'dns': {'nameservers': ['10.96.0.10'], 'search': ['svc.cluster.local']},
}


def test_prev_result_is_kept_and_ours_appended_with_offset_index():
    prev = copy.deepcopy(PREV)
    got = result.build('1.0.0', NETNS, [('net1', make_vif(routes=[]), False)], prev)
    assert got == {
        'cniVersion': '1.0.0',
        'interfaces': PREV['interfaces'] + [
            {'name': 'net1', 'mac': 'fa:16:3e:00:00:05', 'sandbox': NETNS}],
        'ips': PREV['ips'] + [
            {'address': '10.10.0.5/24', 'interface': 2, 'gateway': '10.10.0.1'}],
        'routes': PREV['routes'],
        'dns': PREV['dns'],
    }
    assert prev == PREV, 'build() must not modify the prevResult it was given'


def test_prev_result_without_lists_starts_empty():
    got = result.build('1.1.0', NETNS, [('eth0', make_vif(routes=[]), False)],
                       {'cniVersion': '1.1.0'})
    assert got['interfaces'][0]['name'] == 'eth0'
    assert got['ips'][0]['interface'] == 0
    assert got['dns'] == {}


def test_result_version_is_the_requested_one_not_the_prev_results():
    got = result.build('1.1.0', NETNS, [], copy.deepcopy(PREV))
    assert got['cniVersion'] == '1.1.0'
    assert got['interfaces'] == PREV['interfaces']


def test_build_with_nothing_plugged_is_an_empty_result():
    assert result.build('0.3.1', NETNS, []) == {
        'cniVersion': '0.3.1', 'interfaces': [], 'ips': [], 'routes': [], 'dns': {}}
