"""The strict reader of os-vif primitives (KuryrPort status.vifs) against realistic fixtures."""

import copy
import json

import pytest

from kuryr_cni import errors
from kuryr_cni import osvif
from tests import fixtures
from tests.unit import osvif_fixtures as fx

GATEWAYS = ('10.0.0.1', 'fd00:10::1')
IPS = ('10.0.0.5/26', 'fd00:10::5/64')


def test_open_vswitch_vif_with_port_profile_1_4():
    vifs = osvif.parse_status_vifs(fx.status_vifs(fx.ovs_vif()))
    vif = vifs['eth0']
    assert vif.kind == 'ovs' and vif.bridge == 'br-int'
    assert vif.port_id == fx.PORT_ID               # the profile's interface_id
    assert vif.mac == 'fa:16:3e:98:7b:05' and vif.mtu == 1450
    assert vif.ips == IPS and vif.gateways == GATEWAYS
    assert [(r.dst, r.gw) for r in vif.routes] == [('192.168.0.0/16', '10.0.0.62')]
    assert vif.active and vif.default
    assert vif.network_id == fx.NETWORK_ID         # the address fence is per network


def test_what_kuryr_controller_10_0_0_wrote():
    """A KuryrPort the real controller wrote (recorded by tests/openstack/test_fixtures.py)."""
    with open(fixtures.KURYRPORT_RECORDING) as f:
        kuryrport = json.load(f)
    vif = osvif.parse_status_vifs(kuryrport['status']['vifs'])['eth0']
    data = kuryrport['status']['vifs']['eth0']['vif']['versioned_object.data']
    assert vif.kind == 'ovs' and vif.bridge == 'br-int'
    assert vif.port_id == data['id'] and vif.mac == data['address']
    [subnet] = data['network']['versioned_object.data']['subnets']['versioned_object.data'][
        'objects']
    [ip] = subnet['versioned_object.data']['ips']['versioned_object.data']['objects']
    assert vif.mtu == 1442
    assert vif.ips == (ip['versioned_object.data']['address'] + '/24',)
    assert vif.gateways == ('10.20.0.1',) and vif.routes == ()
    assert vif.active == data['active'] and vif.default
    assert vif.network_id == data['network']['versioned_object.data']['id']


@pytest.mark.parametrize('version', ['1.0', '1.1', '1.2', '1.3', '1.4'])
def test_port_profile_versions_are_accepted(version):
    vif = osvif.parse_vif(fx.ovs_vif(profile_version=version))
    assert vif.port_id == fx.PORT_ID


def test_interface_id_wins_over_the_vif_id_for_ovs():
    primitive = fx.ovs_vif()
    primitive['versioned_object.data']['port_profile']['versioned_object.data'][
        'interface_id'] = '11111111-2222-3333-4444-555555555555'
    assert osvif.parse_vif(primitive).port_id == '11111111-2222-3333-4444-555555555555'


def test_ovs_vif_without_port_profile_uses_its_id():
    primitive = fx.ovs_vif()
    del primitive['versioned_object.data']['port_profile']
    assert osvif.parse_vif(primitive).port_id == fx.PORT_ID


@pytest.mark.parametrize('make, kind, extra', [
    (fx.bridge_vif, 'bridge', {'bridge': 'kuryr-br0'}),
    (fx.vlan_vif, 'vlan', {'vlan_id': 100, 'parent': None}),
    (fx.macvlan_vif, 'macvlan', {'parent': None, 'vlan_id': None}),
])
def test_every_kind_maps_to_its_driver(make, kind, extra):
    vif = osvif.parse_vif(make())
    assert vif.kind == kind and vif.ips == IPS and vif.gateways == GATEWAYS
    for field, value in extra.items():
        assert getattr(vif, field) == value


def test_hybrid_plugged_vif_bridge_is_ovs_hybrid():
    vif = osvif.parse_vif(fx.hybrid_vif())
    assert vif.kind == 'ovs-hybrid' and vif.bridge == 'qbr8c5f3a10-2f'
    assert vif.integration_bridge == 'br-int'           # the network's bridge
    assert vif.port_id == fx.PORT_ID and vif.ips == IPS and vif.gateways == GATEWAYS


def test_a_vif_bridge_without_plugin_is_hybrid_by_its_ovs_port_profile():
    primitive = fx.hybrid_vif()
    del primitive['versioned_object.data']['plugin']
    assert osvif.parse_vif(primitive).kind == 'ovs-hybrid'
    assert osvif.parse_vif(fx.bridge_vif()).kind == 'bridge'    # linux_bridge


def test_a_hybrid_vif_whose_network_names_no_bridge_is_refused():
    primitive = fx.hybrid_vif()
    del primitive['versioned_object.data']['network']['versioned_object.data']['bridge']
    with pytest.raises(errors.InvalidVIF, match='names no bridge'):
        osvif.parse_vif(primitive)


def test_additional_interfaces_and_defaults():
    vifs = osvif.parse_status_vifs(fx.status_vifs(
        fx.vlan_vif(), extra=[fx.vlan_vif(vlan_id=101, n=6)]))
    assert sorted(vifs) == ['eth0', 'eth1']
    assert vifs['eth0'].default and not vifs['eth1'].default
    assert vifs['eth1'].vlan_id == 101 and vifs['eth1'].ips == ('10.0.0.6/26', 'fd00:10::6/64')


def test_inactive_vif_and_missing_active_defaults_to_os_vif_default():
    assert not osvif.parse_vif(fx.macvlan_vif(active=False)).active
    primitive = fx.macvlan_vif()
    del primitive['versioned_object.data']['active']
    assert osvif.parse_vif(primitive).active          # VIFBase.active defaults to True


def test_network_without_mtu_gets_1500():
    primitive = fx.macvlan_vif()
    primitive['versioned_object.data']['network']['versioned_object.data']['mtu'] = None
    assert osvif.parse_vif(primitive).mtu == 1500


def test_ipv4_only_and_ipv6_only_networks():
    v4 = fx.macvlan_vif(network=fx.network([fx.subnet('10.1.0.0/24', ['10.1.0.9'],
                                                      gateway='10.1.0.1')]))
    v6 = fx.macvlan_vif(network=fx.network([fx.subnet('fd01::/64', ['fd01::9'],
                                                      gateway='fd01::1')]))
    assert osvif.parse_vif(v4).ips == ('10.1.0.9/24',)
    assert osvif.parse_vif(v6).gateways == ('fd01::1',)


def test_subnet_without_gateway_and_routes_without_gateway():
    primitive = fx.macvlan_vif(network=fx.network([fx.subnet(
        '10.1.0.0/24', ['10.1.0.9'], routes=[{'cidr': '10.2.0.0/16'}])]))
    vif = osvif.parse_vif(primitive)
    assert vif.gateways == () and [(r.dst, r.gw) for r in vif.routes] == [('10.2.0.0/16', None)]


def test_nova_object_prefix_and_changes_key_are_read():
    text = json.dumps(fx.macvlan_vif()).replace('versioned_object.', 'nova_object.')
    primitive = json.loads(text)
    primitive['nova_object.changes'] = ['active']
    assert osvif.parse_vif(primitive).kind == 'macvlan'


def test_empty_status_is_no_vif_yet():
    assert osvif.parse_status_vifs({}) == {}
    assert osvif.parse_status_vifs(None) == {}


def _broken(change):
    primitive = fx.vlan_vif()
    change(primitive, primitive['versioned_object.data'])
    return primitive


def _subnet_data(primitive):
    net = primitive['versioned_object.data']['network']['versioned_object.data']
    return net['subnets']['versioned_object.data']['objects'][0]['versioned_object.data']


BROKEN = [
    ('unknown VIF class', lambda p, d: p.update({'versioned_object.name': 'VIFVHostUser'}),
     "is a 'VIFVHostUser'"),
    ('another namespace', lambda p, d: p.update({'versioned_object.namespace': 'nova'}),
     "namespace 'nova'"),
    ('major version 2', lambda p, d: p.update({'versioned_object.version': '2.0'}),
     'only 1.x'),
    ('garbage version', lambda p, d: p.update({'versioned_object.version': 'one'}), 'only 1.x'),
    ('extra key', lambda p, d: p.update({'versioned_object.extra': 1}), 'has keys'),
    ('no data', lambda p, d: p.pop('versioned_object.data'), 'has keys'),
    ('data not an object', lambda p, d: p.update({'versioned_object.data': []}), 'no data'),
    ('no address', lambda p, d: d.pop('address'), 'has no address'),
    ('no id', lambda p, d: d.pop('id'), 'has no id'),
    ('no network', lambda p, d: d.pop('network'), 'has no network'),
    ('no vlan_id', lambda p, d: d.pop('vlan_id'), 'has no vlan_id'),
    ('vlan_id a string', lambda p, d: d.update({'vlan_id': '100'}), 'vlan_id must be int'),
    ('vlan_id a bool', lambda p, d: d.update({'vlan_id': True}), 'vlan_id must be int'),
    ('vlan_id out of range', lambda p, d: d.update({'vlan_id': 4095}), 'vlan_id must be'),
    ('active a string', lambda p, d: d.update({'active': 'yes'}), 'active must be bool'),
    ('bad MAC', lambda p, d: d.update({'address': 'fa:16:3e'}), 'invalid mac'),
    ('fixed IP off its subnet',
     lambda p, d: _subnet_data(p)['ips']['versioned_object.data']['objects'][0][
         'versioned_object.data'].update({'address': '10.9.9.9'}), 'is not on'),
    ('subnet cidr with host bits', lambda p, d: _subnet_data(p).update({'cidr': '10.0.0.5/26'}),
     'is not a network'),
    ('gateway off the subnets', lambda p, d: _subnet_data(p).update({'gateway': '10.9.0.1'}),
     'is on none of'),
    ('subnets not a SubnetList',
     lambda p, d: d['network']['versioned_object.data']['subnets'].update(
         {'versioned_object.name': 'FixedIPList'}), "is a 'FixedIPList'"),
    ('network not an object', lambda p, d: d.update({'network': 'net-1'}), 'network must be'),
]


@pytest.mark.parametrize('label, change, complaint', BROKEN, ids=[b[0] for b in BROKEN])
def test_strictness(label, change, complaint):
    with pytest.raises(errors.InvalidVIF) as exc:
        osvif.parse_status_vifs(fx.status_vifs(_broken(change)))
    assert complaint in exc.value.msg + ' ' + exc.value.details
    assert exc.value.msg.startswith('status.vifs.eth0:')


def test_no_fixed_ip_is_refused():
    primitive = fx.macvlan_vif(network=fx.network([fx.subnet('10.1.0.0/24', [])]))
    with pytest.raises(errors.InvalidVIF, match='no fixed IP'):
        osvif.parse_vif(primitive)


@pytest.mark.parametrize('status, complaint', [
    ([], 'must be an object'),
    ({'eth 0': {'default': True, 'vif': fx.vlan_vif()}}, 'invalid interface name'),
    ({'eth0': {'vif': fx.vlan_vif()}}, 'an entry is'),
    ({'eth0': {'default': 'yes', 'vif': fx.vlan_vif()}}, 'default must be'),
    ({'eth0': {'default': True, 'vif': fx.vlan_vif()},
      'eth1': {'default': True, 'vif': fx.vlan_vif(vlan_id=101)}}, 'more than one VIF'),
    ({'eth%d' % i: {'default': False, 'vif': fx.vlan_vif()} for i in range(17)},
     'more than 16'),
])
def test_status_vifs_shape(status, complaint):
    with pytest.raises(errors.InvalidVIF, match=complaint):
        osvif.parse_status_vifs(copy.deepcopy(status))


def test_result_travels_as_plain_dicts():
    vifs = osvif.parse_status_vifs(fx.status_vifs(fx.ovs_vif()))
    plain = vifs['eth0'].to_dict()
    assert json.loads(json.dumps(plain)) == plain
