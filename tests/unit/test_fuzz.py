"""Property tests of the two parsers of untrusted input.

Request bodies come from anything that can reach the socket; annotations from
anything that can edit a pod. Whatever they hold, the parsers may only answer
with a value or with a CNI error: any other exception would be a 500 and a
crashed worker's stack trace instead of a CNI error code.
"""

import copy
import json

from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from kuryr_cni import cni
from kuryr_cni import errors
from kuryr_cni import vif as vif_model
from kuryr_cni.cni import request
from kuryr_cni.cni import result

FUZZ = settings(max_examples=200, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])

# -- generic JSON -------------------------------------------------------------

# Every code point, lone surrogates included (a JSON string may escape them), and
# characters that end names or paths early made frequent.
# (st.text() would drop the surrogates, hence lists of characters joined.)
any_text = st.lists(st.characters(exclude_categories=())
                    | st.sampled_from(['\ud800', '\udfff', '\n', '\0', '/', '=', ';']),
                    max_size=40).map(''.join)
scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
           | any_text)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=12)

# -- near-valid request bodies ------------------------------------------------

DELETE = object()


def mutated(bases, mutations, max_mutations=3):
    """Valid objects from ``bases`` with up to a few (path, value) changes applied."""
    @st.composite
    def build(draw):
        obj = copy.deepcopy(draw(bases))
        for path, value in draw(st.lists(mutations, max_size=max_mutations)):
            target = obj
            for key in path[:-1]:
                target = target.get(key) if isinstance(target, dict) else None
            if not isinstance(target, dict):
                continue
            if value is DELETE:
                target.pop(path[-1], None)
            else:
                target[path[-1]] = value
        return obj
    return build()


def changes(path, *values):
    """A change of ``path`` to one of ``values``, to noise, or its removal."""
    return st.tuples(st.just(path),
                     st.sampled_from(values or [DELETE]) | json_values | st.just(DELETE))


MIN_VERSION = {'CHECK': '0.4.0', 'GC': '1.1.0', 'STATUS': '1.1.0'}


def valid_body(command, version):
    return {'CNI_COMMAND': command, 'CNI_CONTAINERID': '3f2a9c1e5b7d',
            'CNI_NETNS': '/var/run/netns/x', 'CNI_IFNAME': 'eth0',
            'CNI_ARGS': 'K8S_POD_NAMESPACE=demo;K8S_POD_NAME=web-0;K8S_POD_UID=1b2c',
            'CNI_PATH': '/opt/cni/bin',
            'config': {'cniVersion': version, 'name': 'kuryr', 'type': 'kuryr-cni'}}


valid_bodies = st.sampled_from([
    valid_body(command, version)
    for command in cni.COMMANDS for version in cni.SUPPORTED_VERSIONS
    if cni.version_tuple(version) >= cni.version_tuple(MIN_VERSION.get(command, '0.0.0'))])

cni_args = st.lists(
    st.sampled_from(['K8S_POD_NAME=web-0', 'K8S_POD_NAMESPACE=demo', 'K8S_POD_UID=1b2c',
                     'IgnoreUnknown=1', 'K8S_POD_NAME=', 'K8S_POD_NAMESPACE=Bad', '=x', 'a',
                     'K8S_POD_NAME=a=b', 'K8S_POD_UID=a/b']) | any_text,
    min_size=1, max_size=4).map(';'.join)

body_changes = st.one_of(
    changes(('CNI_COMMAND',), *cni.COMMANDS, 'VERSION', 'add'),
    changes(('CNI_CONTAINERID',), 'a' * 128, 'a' * 129, 'a/b', 'x\n', ''),
    changes(('CNI_NETNS',), '', 'relative', '/x\0y'),
    changes(('CNI_IFNAME',), 'net1', '', 'e' * 16, '..', 'a/b'),
    st.tuples(st.just(('CNI_ARGS',)), cni_args),
    changes(('config',), []),
    changes(('config', 'cniVersion'), *cni.SUPPORTED_VERSIONS, '0.2.0', '1.0', '2.0.0'),
    changes(('config', 'name'), 'k8s-pod-network', 'a/b', '', 'x' * 200),
    changes(('config', 'prevResult'), {}, {'interfaces': [], 'ips': []}, None),
    st.tuples(st.just(('config', 'prevResult')),
              st.fixed_dictionaries({}, optional={
                  k: json_values for k in ('cniVersion', 'interfaces', 'ips', 'routes', 'dns')})),
    changes(('extra',)),
)

bodies = mutated(valid_bodies, body_changes)


def check_parse(body, expected):
    try:
        req = request.parse(request.decode(body), expected)
    except errors.CNIError as exc:
        assert isinstance(exc.code, int) and isinstance(exc.msg, str)
        json.dumps(exc.to_dict(request.error_version(body)))
        return None
    # Accepted: the invariants every handler relies on.
    assert req.command in cni.COMMANDS
    assert expected in (None, req.command)
    assert req.cni_version in cni.SUPPORTED_VERSIONS
    if req.command in ('ADD', 'DEL', 'CHECK'):
        assert req.container_id and req.ifname and vif_model.valid_ifname(req.ifname)
        assert '/' not in req.container_id and '\n' not in req.container_id
    if req.command in ('ADD', 'CHECK'):
        assert req.netns.startswith('/')
    if req.command == 'ADD':
        assert req.pod is not None and req.pod.name
        # The result is built on the prevResult after plugging: it must not fail then.
        result.build(req.cni_version, '/var/run/netns/x', [], req.prev_result)
    return req


@FUZZ
@given(body=bodies, expected=st.sampled_from([None, *cni.COMMANDS]))
def test_near_valid_bodies_only_raise_cni_errors(body, expected):
    check_parse(json.dumps(body).encode(), expected)


prev_results = st.fixed_dictionaries({}, optional={
    key: json_values | st.lists(json_values, max_size=3)
    for key in ('cniVersion', 'interfaces', 'ips', 'routes', 'dns')})


@FUZZ
@given(prev=prev_results, version=st.sampled_from(cni.SUPPORTED_VERSIONS))
def test_any_accepted_prev_result_can_carry_the_add_result(prev, version):
    body = valid_body('ADD', version)
    body['config']['prevResult'] = prev
    req = check_parse(json.dumps(body).encode(), 'ADD')
    if req is None:
        return
    # (compared as JSON: NaN != NaN, and JSON joins escaped surrogate pairs)
    assert json.dumps(req.prev_result) == json.dumps(json.loads(json.dumps(prev)))
    vif = vif_model.parse_vif({'kind': 'macvlan', 'port_id': 'p1', 'mac': 'fa:16:3e:00:00:01',
                               'ips': ['10.0.0.5/24'], 'gateway': '10.0.0.1'})
    built = result.build(version, '/var/run/netns/x', [('eth0', vif, True)], req.prev_result)
    assert built['interfaces'][-1]['name'] == 'eth0'
    assert built['ips'][-1]['interface'] == len(built['interfaces']) - 1
    json.dumps(built)


@FUZZ
@given(body=json_values)
def test_arbitrary_json_only_raises_cni_errors(body):
    check_parse(json.dumps(body).encode(), None)


@FUZZ
@given(raw=st.binary(max_size=300))
def test_arbitrary_bytes_only_raise_cni_errors(raw):
    check_parse(raw, None)


def test_the_body_strategy_reaches_valid_requests():
    """The near-valid strategy must sometimes produce accepted requests, or it fuzzes little."""
    accepted = set()

    @settings(max_examples=300, deadline=None, database=None)
    @given(body=bodies)
    def collect(body):
        req = check_parse(json.dumps(body).encode(), None)
        if req is not None:
            accepted.add(req.command)

    collect()
    assert accepted, 'no generated body was ever valid'


# -- annotations --------------------------------------------------------------

ips4 = ['10.10.0.5/24', '10.10.0.0/24', '10.10.0.255/24', '10.10.0.5', '10.10.0.0/31',
        '224.0.0.5/24', '127.0.0.5/8', '10.10.0.5/33', '10.10.0.5/255.255.255.0']
ips6 = ['fd00:10::5/64', 'fd00:10::/64', 'fd00:10::5', '::1/128', 'fe80::5/64']
addresses = st.sampled_from(ips4 + ips6) | any_text
gateways = st.sampled_from(['10.10.0.1', 'fd00:10::1', '10.20.0.1', '10.10.0.5',
                            '10.10.0.1/24', 'x'])
routes = mutated(
    st.sampled_from([{'dst': '192.168.0.0/16', 'gw': '10.10.0.254'}, {'dst': '0.0.0.0/0'},
                     {'dst': 'fd00:20::/48', 'gw': 'fd00:10::fe'}]),
    st.one_of(changes(('dst',), '10.20.0.1/16', 'default', '::/0'),
              changes(('gw',), None, '10.30.0.1', 'fd00:10::fe', 'gw'),
              changes(('metric',), 1)),
    max_mutations=1)

BRIDGE = {'kind': 'bridge', 'port_id': '5d0b1c2d', 'mac': 'fa:16:3e:00:00:05', 'mtu': 1450,
          'bridge': 'kuryr-br0', 'ips': ['10.10.0.5/24'], 'gateway': '10.10.0.1',
          'routes': [{'dst': '192.168.0.0/16', 'gw': '10.10.0.254'}], 'active': True}
valid_vifs = st.sampled_from([
    BRIDGE,
    dict(BRIDGE, kind='ovs', bridge='br-int', ips=['10.10.0.5/24', 'fd00:10::5/64'],
         gateway=['10.10.0.1', 'fd00:10::1'], default=True),
    dict(BRIDGE, kind='vlan', bridge=None, parent='eth1', vlan_id=100, mac='FA:16:3E:0A:0B:0C'),
    {'kind': 'macvlan', 'port_id': 'ns:port-1', 'mac': 'fa:16:3e:00:00:07',
     'ips': ['10.10.0.0/31']},
])

vif_changes = st.one_of(
    changes(('kind',), *vif_model.KINDS, 'tap', 'Bridge'),
    changes(('port_id',), 'p-2', '', 'a/b', '-a'),
    changes(('mac',), 'fa:16:3e:00:00:09', '01:00:5e:00:00:01', '00:00:00:00:00:00',
            'fa-16-3e-00-00-05'),
    changes(('mtu',), 1500, 68, 65535, 67, 65536, True, '1500'),
    st.tuples(st.just(('ips',)), st.lists(addresses, max_size=3)),
    st.tuples(st.just(('gateway',)), gateways | st.lists(gateways, max_size=3)),
    st.tuples(st.just(('routes',)), st.lists(routes, max_size=3)),
    changes(('active',), True, False, 'yes', 1),
    changes(('default',), True, False, 'true', 0),
    changes(('bridge',), 'kuryr-br0', None, 'b' * 16, 'br/0'),
    changes(('parent',), 'eth1', None, 'eth 1'),
    changes(('vlan_id',), 100, 1, 4094, None, 0, 4095, True),
    changes(('x-unknown',), 1),
)
vif_specs = mutated(valid_vifs, vif_changes)

ifnames = st.sampled_from(['eth0', 'net1', 'e' * 15, 'e' * 16, '..', 'a/b', '']) | any_text
annotations = st.one_of(
    st.dictionaries(st.sampled_from(['eth0', 'net1', 'net2']), vif_specs,
                    min_size=1, max_size=3),
    st.dictionaries(ifnames, vif_specs | json_values, max_size=3))


def check_annotation(text):
    try:
        vifs = vif_model.parse_annotation(text)
    except errors.InvalidVIF as exc:
        assert exc.code == 7
        return None
    check_accepted(vifs)
    return vifs


def render(vif):
    """A VIF back to annotation form."""
    spec = {'kind': vif.kind, 'port_id': vif.port_id, 'mac': vif.mac, 'mtu': vif.mtu,
            'ips': list(vif.ips), 'gateway': list(vif.gateways),
            'routes': [{'dst': r.dst, **({'gw': r.gw} if r.gw else {})} for r in vif.routes],
            'active': vif.active, 'default': vif.default}
    for field in ('bridge', 'parent', 'vlan_id'):
        if getattr(vif, field) is not None:
            spec[field] = getattr(vif, field)
    return spec


def check_accepted(vifs):
    assert vifs and all(vif_model.valid_ifname(name) for name in vifs)
    for vif in vifs.values():
        d = vif.to_dict()
        assert vif_model.VIF.from_dict(d) == vif
        assert vif_model.VIF.from_dict(json.loads(json.dumps(d))) == vif
        assert vif.kind in vif_model.KINDS and 68 <= vif.mtu <= 65535
        assert vif.mac == vif.mac.lower() and not int(vif.mac[:2], 16) & 1
    # What the parser accepted is already normal: parsing it again changes nothing.
    assert vif_model.parse_vifs({n: render(v) for n, v in vifs.items()}) == vifs


@FUZZ
@given(text=any_text | st.text(max_size=200))
def test_arbitrary_text_annotation_only_raises_invalid_vif(text):
    check_annotation(text)


@FUZZ
@given(raw=json_values)
def test_arbitrary_json_annotation_only_raises_invalid_vif(raw):
    check_annotation(json.dumps(raw))


@FUZZ
@given(raw=annotations)
def test_near_valid_annotations_only_raise_invalid_vif_and_round_trip(raw):
    check_annotation(json.dumps(raw))
    try:
        vifs = vif_model.parse_vifs(raw)
    except errors.InvalidVIF:
        return
    check_accepted(vifs)


def test_the_annotation_strategy_reaches_valid_vifs():
    accepted = []

    @settings(max_examples=300, deadline=None, database=None)
    @given(raw=annotations)
    def collect(raw):
        if check_annotation(json.dumps(raw)):
            accepted.append(raw)

    collect()
    assert accepted, 'no generated annotation was ever valid'
