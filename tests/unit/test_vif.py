"""kuryr_cni.vif: the strict reader of the ``kuryr.openstack.org/vifs`` annotation.

Everything a binding driver hands to the kernel comes through here, so each
invalid annotation below must be refused with InvalidVIF (CNI code 7), and
each valid one must survive the trip between processes (to_dict/from_dict).
"""

import copy
import json

import pytest

from kuryr_cni import errors
from kuryr_cni import vif as vif_model

# The annotation of DESIGN §4.3, verbatim.
DESIGN_EXAMPLE = '''
{"eth0": {"kind": "bridge", "port_id": "5d0b...", "mac": "fa:16:3e:00:00:05", "mtu": 1450,
          "bridge": "kuryr-br0", "ips": ["10.10.0.5/24"], "gateway": "10.10.0.1",
          "routes": [{"dst": "192.168.0.0/16", "gw": "10.10.0.254"}], "active": true}}
'''


def spec(**changes):
    """A valid bridge VIF object; a change to None drops the key."""
    s = {'kind': 'bridge', 'port_id': '5d0b1c2d-aaaa', 'mac': 'fa:16:3e:00:00:05',
         'mtu': 1450, 'bridge': 'kuryr-br0', 'ips': ['10.10.0.5/24'],
         'gateway': '10.10.0.1',
         'routes': [{'dst': '192.168.0.0/16', 'gw': '10.10.0.254'}], 'active': True}
    s.update(changes)
    return {k: v for k, v in s.items() if v is not None}


def annotation(**vifs):
    return json.dumps(vifs or {'eth0': spec()})


def test_design_example_parses_to_exact_vif():
    vifs = vif_model.parse_annotation(DESIGN_EXAMPLE)
    assert vifs == {'eth0': vif_model.VIF(
        kind='bridge', port_id='5d0b...', mac='fa:16:3e:00:00:05', mtu=1450,
        ips=('10.10.0.5/24',), gateways=('10.10.0.1',),
        routes=(vif_model.Route('192.168.0.0/16', '10.10.0.254'),),
        active=True, default=False, bridge='kuryr-br0', parent=None, vlan_id=None)}


def test_defaults_for_optional_fields():
    vif = vif_model.parse_vif({'kind': 'macvlan', 'port_id': 'p1',
                               'mac': 'fa:16:3e:00:00:07', 'ips': ['10.0.0.7/24']})
    assert (vif.mtu, vif.gateways, vif.routes, vif.active, vif.default) == \
        (1500, (), (), False, False)
    assert (vif.bridge, vif.parent, vif.vlan_id) == (None, None, None)


# -- valid annotations, with what they normalise to --------------------------

VALID = [
    ('bridge', {'eth0': spec()}, {}),
    ('ovs', {'eth0': spec(kind='ovs', bridge='br-int')}, {'kind': 'ovs', 'bridge': 'br-int'}),
    ('vlan', {'eth0': spec(kind='vlan', bridge=None, parent='eth1', vlan_id=100)},
     {'kind': 'vlan', 'bridge': None, 'parent': 'eth1', 'vlan_id': 100}),
    ('vlan ids at the bounds', {'eth0': spec(kind='vlan', bridge=None, vlan_id=1),
                                'net1': spec(kind='vlan', bridge=None, vlan_id=4094)}, None),
    ('macvlan without parent', {'eth0': spec(kind='macvlan', bridge=None)},
     {'kind': 'macvlan', 'bridge': None}),
    ('ovs-hybrid', {'eth0': spec(kind='ovs-hybrid', bridge='qbr5d0b1c2d-aa',
                                 integration_bridge='br-int')},
     {'kind': 'ovs-hybrid', 'bridge': 'qbr5d0b1c2d-aa', 'integration_bridge': 'br-int'}),
    ('upper-case MAC', {'eth0': spec(mac='FA:16:3E:0A:0B:0C')}, {'mac': 'fa:16:3e:0a:0b:0c'}),
    ('mtu minimum', {'eth0': spec(mtu=68)}, {'mtu': 68}),
    ('mtu maximum', {'eth0': spec(mtu=65535)}, {'mtu': 65535}),
    ('mtu default', {'eth0': spec(mtu=None)}, {'mtu': 1500}),
    ('no gateway', {'eth0': spec(gateway=None, routes=[])}, {'gateways': (), 'routes': ()}),
    ('gateway null', {'eth0': spec(gateway=None, routes=[]) | {'gateway': None}},
     {'gateways': (), 'routes': ()}),
    ('gateway empty list', {'eth0': spec(gateway=[], routes=[])},
     {'gateways': (), 'routes': ()}),
    ('dual stack', {'eth0': spec(ips=['10.10.0.5/24', 'fd00:10::5/64'],
                                 gateway=['10.10.0.1', 'fd00:10::1'])},
     {'ips': ('10.10.0.5/24', 'fd00:10::5/64'), 'gateways': ('10.10.0.1', 'fd00:10::1')}),
    ('IPv6 normalised', {'eth0': spec(ips=['FD00:10:0:0::5/64'], gateway='FD00:10::1',
                                      routes=[{'dst': 'FD00:20:0::/48'}])},
     {'ips': ('fd00:10::5/64',), 'gateways': ('fd00:10::1',),
      'routes': (vif_model.Route('fd00:20::/48'),)}),
    ('netmask notation', {'eth0': spec(ips=['10.10.0.5/255.255.255.0'])},
     {'ips': ('10.10.0.5/24',)}),
    ('/31 point to point', {'eth0': spec(ips=['10.10.0.0/31'], gateway='10.10.0.1',
                                         routes=[])},
     {'ips': ('10.10.0.0/31',), 'gateways': ('10.10.0.1',), 'routes': ()}),
    ('/32 host address', {'eth0': spec(ips=['10.10.0.5/32'], gateway=None, routes=[])},
     {'ips': ('10.10.0.5/32',), 'gateways': (), 'routes': ()}),
    ('route without gw', {'eth0': spec(routes=[{'dst': '10.20.0.0/16'}])},
     {'routes': (vif_model.Route('10.20.0.0/16'),)}),
    ('route gw null', {'eth0': spec(routes=[{'dst': '10.20.0.0/16', 'gw': None}])},
     {'routes': (vif_model.Route('10.20.0.0/16'),)}),
    ('64 routes', {'eth0': spec(routes=[{'dst': '10.%d.0.0/16' % i} for i in range(64)])},
     None),
    ('16 addresses', {'eth0': spec(ips=['10.10.0.%d/24' % i for i in range(5, 21)])}, None),
    ('two interfaces one default', {'eth0': spec(), 'net1': spec(default=True)}, None),
    ('16 interfaces', {'net%d' % i: spec() for i in range(16)}, None),
    ('15-char interface name', {'e' * 15: spec(bridge='b' * 15)}, {'bridge': 'b' * 15}),
    ('inactive', {'eth0': spec(active=False)}, {'active': False}),
    ('port id with colon', {'eth0': spec(port_id='ns:port-1')}, {'port_id': 'ns:port-1'}),
]


@pytest.mark.parametrize('raw,normalised', [c[1:] for c in VALID], ids=[c[0] for c in VALID])
def test_valid_annotation(raw, normalised):
    vifs = vif_model.parse_annotation(json.dumps(raw))
    assert sorted(vifs) == sorted(raw)
    for ifname, vif in vifs.items():
        assert vif.kind == raw[ifname]['kind']
        assert vif.port_id == raw[ifname]['port_id']
    if normalised is not None:
        got = vifs['eth0'] if 'eth0' in vifs else next(iter(vifs.values()))
        for field, value in normalised.items():
            assert getattr(got, field) == value, field


@pytest.mark.parametrize('raw', [c[1] for c in VALID], ids=[c[0] for c in VALID])
def test_to_dict_from_dict_round_trip(raw):
    for vif in vif_model.parse_vifs(copy.deepcopy(raw)).values():
        d = vif.to_dict()
        assert vif_model.VIF.from_dict(d) == vif
        # ... also through JSON, as VIFs cross processes and files
        assert vif_model.VIF.from_dict(json.loads(json.dumps(d))) == vif


def test_to_dict_is_plain_data():
    vif = vif_model.parse_vif(spec(ips=['10.10.0.5/24', 'fd00::5/64'],
                                   gateway=['10.10.0.1', 'fd00::1']))
    assert vif.to_dict() == {
        'kind': 'bridge', 'port_id': '5d0b1c2d-aaaa', 'mac': 'fa:16:3e:00:00:05',
        'mtu': 1450, 'ips': ['10.10.0.5/24', 'fd00::5/64'],
        'gateways': ['10.10.0.1', 'fd00::1'],
        'routes': [{'dst': '192.168.0.0/16', 'gw': '10.10.0.254'}],
        'active': True, 'default': False, 'bridge': 'kuryr-br0', 'parent': None,
        'vlan_id': None}


def test_parse_vifs_does_not_modify_its_input():
    raw = {'eth0': spec(mac='FA:16:3E:00:00:05')}
    before = copy.deepcopy(raw)
    vif_model.parse_vifs(raw)
    assert raw == before


# -- invalid annotations ----------------------------------------------------

def one(**changes):
    return json.dumps({'eth0': spec(**changes)})


INVALID = [
    # the document
    ('not JSON', 'eth0: bridge'),
    ('empty text', ''),
    ('JSON list', json.dumps([spec()])),
    ('JSON string', '"eth0"'),
    ('empty object', '{}'),
    ('null', 'null'),
    ('17 interfaces', json.dumps({'net%d' % i: spec() for i in range(17)})),
    ('VIF not an object', json.dumps({'eth0': [spec()]})),
    ('VIF null', json.dumps({'eth0': None})),
    ('deeply nested', '[' * 20000),
    ('lone surrogate', '{"eth0\ud800": {}}'),
    ('oversized', json.dumps({'eth0': spec()}) + ' ' * vif_model.MAX_ANNOTATION_BYTES),
    # kind
    ('kind unknown', one(kind='tap')),
    ('kind missing', one(kind=None)),
    ('kind upper case', one(kind='Bridge')),
    ('kind a list', one(kind=['bridge'])),
    ('bridge kind without bridge', one(bridge=None)),
    ('ovs kind without bridge', one(kind='ovs', bridge=None)),
    ('vlan without vlan_id', one(kind='vlan', bridge=None, parent='eth1')),
    # port_id
    ('port_id missing', one(port_id=None)),
    ('port_id empty', one(port_id='')),
    ('port_id with slash', one(port_id='a/b')),
    ('port_id with space', one(port_id='a b')),
    ('port_id leading dash', one(port_id='-a')),
    ('port_id a number', one(port_id=5)),
    ('port_id with newline', one(port_id='5d0b\n')),
    # mac
    ('mac multicast', one(mac='01:00:5e:00:00:01')),
    ('mac odd first octet', one(mac='fb:16:3e:00:00:05')),
    ('mac broadcast', one(mac='ff:ff:ff:ff:ff:ff')),
    ('mac zero', one(mac='00:00:00:00:00:00')),
    ('mac with dashes', one(mac='fa-16-3e-00-00-05')),
    ('mac short', one(mac='fa:16:3e:00:05')),
    ('mac without colons', one(mac='fa163e000005')),
    ('mac missing', one(mac=None)),
    ('mac a number', one(mac=5)),
    ('mac with newline', one(mac='fa:16:3e:00:00:05\n')),
    # mtu
    ('mtu true', one(mtu=True)),
    ('mtu false', one(mtu=False)),
    ('mtu 67', one(mtu=67)),
    ('mtu 65536', one(mtu=65536)),
    ('mtu negative', one(mtu=-1)),
    ('mtu a string', one(mtu='1500')),
    ('mtu a float', one(mtu=1500.0)),
    ('mtu null', one() .replace('"mtu": 1450', '"mtu": null')),
    # ips
    ('ips empty', one(ips=[])),
    ('ips missing', one(ips=None)),
    ('ips a string', one(ips='10.10.0.5/24')),
    ('17 ips', one(ips=['10.10.0.%d/24' % i for i in range(5, 22)])),
    ('ip without prefix', one(ips=['10.10.0.5'], gateway=None, routes=[])),
    ('IPv6 without prefix', one(ips=['fd00::5'], gateway=None, routes=[])),
    ('ip network address', one(ips=['10.10.0.0/24'])),
    ('ip broadcast address', one(ips=['10.10.0.255/24'])),
    ('IPv6 network address', one(ips=['fd00:10::/64'], gateway=None, routes=[])),
    ('ip multicast', one(ips=['224.0.0.5/24'], gateway=None, routes=[])),
    ('ip unspecified', one(ips=['0.0.0.0/32'], gateway=None, routes=[])),
    ('ip loopback', one(ips=['127.0.0.5/8'], gateway=None, routes=[])),
    ('IPv6 loopback', one(ips=['::1/128'], gateway=None, routes=[])),
    ('ip garbage', one(ips=['10.10.0.500/24'])),
    ('ip prefix too long', one(ips=['10.10.0.5/33'])),
    ('ip a number', one(ips=[167772165])),
    ('ip with newline', one(ips=['10.10.0.5/24\n'])),
    ('ip over 64 chars', one(ips=['10.10.0.5/' + '0' * 60 + '24'])),
    # gateway
    ('gateway off subnet', one(gateway='10.20.0.1')),
    ('gateway equal to own ip', one(gateway='10.10.0.5')),
    ('two IPv4 gateways', one(ips=['10.10.0.5/24', '10.20.0.5/24'],
                              gateway=['10.10.0.1', '10.20.0.1'])),
    ('two IPv6 gateways', one(ips=['fd00:10::5/64'], gateway=['fd00:10::1', 'fd00:10::2'],
                              routes=[])),
    ('gateway with prefix', one(gateway='10.10.0.1/24')),
    ('gateway garbage', one(gateway='gateway')),
    ('gateway a number', one(gateway=1)),
    ('gateway an object', one(gateway={'ip': '10.10.0.1'})),
    ('IPv6 gateway for IPv4 VIF', one(gateway='fd00::1')),
    # routes
    ('routes not a list', one(routes={'dst': '10.20.0.0/16'})),
    ('routes null', one().replace('"routes": [', '"routes": null, "x": [')),
    ('route not an object', one(routes=['10.20.0.0/16'])),
    ('route without dst', one(routes=[{'gw': '10.10.0.254'}])),
    ('route with extra key', one(routes=[{'dst': '10.20.0.0/16', 'metric': 100}])),
    ('route dst with host bits', one(routes=[{'dst': '10.20.0.1/16'}])),
    ('route dst garbage', one(routes=[{'dst': 'default'}])),
    ('route dst a number', one(routes=[{'dst': 0}])),
    ('route gw off subnet', one(routes=[{'dst': '10.20.0.0/16', 'gw': '10.30.0.1'}])),
    ('route gw of another family', one(ips=['10.10.0.5/24', 'fd00::5/64'],
                                       routes=[{'dst': '10.20.0.0/16', 'gw': 'fd00::1'}])),
    ('route gw garbage', one(routes=[{'dst': '10.20.0.0/16', 'gw': 'router'}])),
    ('65 routes', one(routes=[{'dst': '10.%d.0.0/16' % i} for i in range(65)])),
    # flags
    ('two defaults', json.dumps({'eth0': spec(default=True), 'net1': spec(default=True)})),
    ('default a string', one(default='true')),
    ('default a number', one(default=1)),
    ('active a string', one(active='yes')),
    ('active null', one().replace('"active": true', '"active": null')),
    # interface names
    ('ifname with slash', json.dumps({'eth/0': spec()})),
    ('ifname ..', json.dumps({'..': spec()})),
    ('ifname .', json.dumps({'.': spec()})),
    ('ifname 16 chars', json.dumps({'e' * 16: spec()})),
    ('ifname empty', json.dumps({'': spec()})),
    ('ifname with space', json.dumps({'eth 0': spec()})),
    ('ifname with colon', json.dumps({'eth0:1': spec()})),
    ('ifname with newline', json.dumps({'eth0\n': spec()})),
    ('bridge name 16 chars', one(bridge='b' * 16)),
    ('bridge name with slash', one(bridge='br/0')),
    ('bridge name with newline', one(bridge='br0\n')),
    ('bridge name empty', one(bridge='')),
    ('bridge name a number', one(bridge=0)),
    ('parent name invalid', one(kind='macvlan', bridge=None, parent='eth 1')),
    # vlan_id
    ('vlan_id 0', one(kind='vlan', bridge=None, vlan_id=0)),
    ('vlan_id 4095', one(kind='vlan', bridge=None, vlan_id=4095)),
    ('vlan_id true', one(kind='vlan', bridge=None, vlan_id=True)),
    ('vlan_id a string', one(kind='vlan', bridge=None, vlan_id='100')),
    # the kernel would refuse these later, after devices were made
    ('scoped IPv6 address', one(ips=['fd00::5%eth0/64'], gateway=None, routes=[])),
    ('scoped IPv6 gateway', one(ips=['fd00::5/64'], gateway='fd00::1%eth0', routes=[])),
    ('route given twice', one(routes=[{'dst': '192.168.0.0/16'}, {'dst': '192.168.0.0/16'}])),
    # ovs-hybrid: the port's own qbr, and an integration bridge
    ('ovs-hybrid without integration bridge', one(kind='ovs-hybrid', bridge='qbr5d0b1c2d-aa')),
    ('ovs-hybrid naming another port\'s qbr', one(kind='ovs-hybrid', bridge='qbr11111111-22',
                                                  integration_bridge='br-int')),
    ('ovs-hybrid naming a shared bridge', one(kind='ovs-hybrid', bridge='kuryr-br0',
                                              integration_bridge='br-int')),
    ('ovs-hybrid port making no device name', one(kind='ovs-hybrid', port_id='a:b',
                                                  bridge='qbrab', integration_bridge='br-int')),
    ('integration bridge on another kind', one(integration_bridge='br-int')),
    ('default route and gateway', one(routes=[{'dst': '0.0.0.0/0', 'gw': '10.10.0.254'}])),
]


@pytest.mark.parametrize('text', [c[1] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_annotation_is_refused(text):
    with pytest.raises(errors.InvalidVIF) as info:
        vif_model.parse_annotation(text)
    assert info.value.code == 7
    assert info.value.http_status == 400


def test_invalid_table_cases_are_valid_but_for_their_flaw():
    """Guard against a table entry failing for a reason other than the one named."""
    assert vif_model.parse_annotation(one())
    assert vif_model.parse_annotation(json.dumps({'eth0': spec(), 'net1': spec()}))
    assert vif_model.parse_annotation(one(kind='vlan', bridge=None, vlan_id=100))
    assert vif_model.parse_annotation(one(kind='macvlan', bridge=None, parent='eth1'))
    assert vif_model.parse_annotation(one(ips=['10.10.0.5/24', 'fd00::5/64']))
    assert vif_model.parse_annotation(one(kind='ovs-hybrid', bridge='qbr5d0b1c2d-aa',
                                          integration_bridge='br-int'))


def test_a_record_written_before_integration_bridge_existed_is_read():
    vif = vif_model.parse_vif(spec())
    record = vif.to_dict()
    assert 'integration_bridge' not in record        # as before: older releases read it
    assert vif_model.from_record(record) == vif
    hybrid = vif_model.parse_vif(spec(kind='ovs-hybrid', bridge='qbr5d0b1c2d-aa',
                                      integration_bridge='br-int'))
    assert vif_model.from_record(hybrid.to_dict()) == hybrid


@pytest.mark.parametrize('text', [None, b'{}', 42, {'eth0': {}}])
def test_annotation_must_be_text(text):
    with pytest.raises(errors.InvalidVIF):
        vif_model.parse_annotation(text)


def test_annotation_of_exactly_the_limit_is_accepted():
    text = annotation()
    text += ' ' * (vif_model.MAX_ANNOTATION_BYTES - len(text.encode()))
    assert len(text.encode()) == vif_model.MAX_ANNOTATION_BYTES
    assert list(vif_model.parse_annotation(text)) == ['eth0']


def test_size_limit_counts_bytes_not_characters():
    text = json.dumps({'eth0': spec()}, ensure_ascii=False)[:-1] + ', "x": "%s"}' % (
        '\u00e9' * (vif_model.MAX_ANNOTATION_BYTES // 2))
    assert len(text) <= vif_model.MAX_ANNOTATION_BYTES < len(text.encode())
    with pytest.raises(errors.InvalidVIF) as info:
        vif_model.parse_annotation(text)
    assert 'larger than' in info.value.msg


def test_error_names_the_interface():
    with pytest.raises(errors.InvalidVIF) as info:
        vif_model.parse_annotation(json.dumps({'eth0': spec(), 'net1': spec(mtu=1)}))
    assert info.value.msg.startswith('VIF net1: ')


def test_a_vif_may_name_its_network_and_a_record_without_one_stays_as_it_was():
    spec = {'kind': 'bridge', 'port_id': 'p', 'mac': 'fa:16:3e:00:00:01', 'bridge': 'br0',
            'ips': ['10.0.0.1/24']}
    assert 'network_id' not in vif_model.parse_vif(spec).to_dict()
    named = vif_model.parse_vif(dict(spec, network_id='net-1'))
    assert named.network_id == 'net-1'
    assert vif_model.from_record(named.to_dict()) == named
    with pytest.raises(errors.InvalidVIF, match='network_id'):
        vif_model.parse_vif(dict(spec, network_id='../x'))
