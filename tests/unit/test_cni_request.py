"""kuryr_cni.cni.request: every bad input gets the CNI error code the spec gives it.

The tables below are the contract of DESIGN §4.1: 1 for an unknown or
incompatible cniVersion, 4 for a missing or invalid CNI_* value, 6 for a body
that is not a JSON object, 7 for an invalid network configuration.
"""

import copy
import json

import pytest

from kuryr_cni import cni
from kuryr_cni import errors
from kuryr_cni.cni import request

CID = '3f2a9c1e5b7d'
NETNS = '/var/run/netns/cni-1234'
ARGS = 'IgnoreUnknown=1;K8S_POD_NAMESPACE=demo;K8S_POD_NAME=web-0;K8S_POD_UID=1b2c-3d4e'


def body(command='ADD', version='1.0.0', **changes):
    """A valid request body for ``command``; ``changes`` override or (None) drop keys.

    ``config`` in ``changes`` replaces the whole config; ``config_<key>``
    overrides (or with None drops) one key of it.
    """
    b = {
        'CNI_COMMAND': command,
        'CNI_CONTAINERID': CID,
        'CNI_NETNS': NETNS,
        'CNI_IFNAME': 'eth0',
        'CNI_ARGS': ARGS,
        'CNI_PATH': '/opt/cni/bin',
        'config': {'cniVersion': version, 'name': 'kuryr', 'type': 'kuryr-cni'},
    }
    for key, value in changes.items():
        if key.startswith('config_'):
            target, key = b['config'], key[len('config_'):]
        else:
            target = b
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value
    return b


def parse_raw(b, expected_command=None):
    """The path a request takes in the daemon: bytes, decode, parse."""
    return request.parse(request.decode(json.dumps(b).encode()), expected_command)


# -- bad inputs, each with its exact code -----------------------------------

BAD = [
    # 1: unknown or incompatible cniVersion
    ('version unknown', body(config_cniVersion='0.2.0'), 1),
    ('version future', body(config_cniVersion='2.0.0'), 1),
    ('version missing', body(config_cniVersion=None), 1),
    ('version a number', body(config_cniVersion=1.0), 1),
    ('version a list', body(config_cniVersion=['1.0.0']), 1),
    ('version with suffix', body(config_cniVersion='1.0.0-rc1'), 1),
    ('CHECK on 0.3.1', body('CHECK', '0.3.1'), 1),
    ('CHECK on 0.3.0', body('CHECK', '0.3.0'), 1),
    ('GC on 1.0.0', body('GC', '1.0.0'), 1),
    ('GC on 0.4.0', body('GC', '0.4.0'), 1),
    ('STATUS on 1.0.0', body('STATUS', '1.0.0'), 1),
    # 4: CNI_COMMAND
    ('command missing', body(CNI_COMMAND=None), 4),
    ('command lower case', body(CNI_COMMAND='add'), 4),
    ('command VERSION (answered by the shim)', body(CNI_COMMAND='VERSION'), 4),
    ('command unknown', body(CNI_COMMAND='UPDATE'), 4),
    ('command not a string', body(CNI_COMMAND=1), 4),
    # 4: CNI_CONTAINERID
    ('container id empty', body(CNI_CONTAINERID=''), 4),
    ('container id missing', body(CNI_CONTAINERID=None), 4),
    ('container id empty for DEL', body('DEL', CNI_CONTAINERID=''), 4),
    ('container id empty for CHECK', body('CHECK', CNI_CONTAINERID=''), 4),
    ('container id with slash', body(CNI_CONTAINERID='abc/def'), 4),
    ('container id of dots', body(CNI_CONTAINERID='../etc'), 4),
    ('container id 200 chars', body(CNI_CONTAINERID='a' * 200), 4),
    ('container id 129 chars', body(CNI_CONTAINERID='a' * 129), 4),
    ('container id with newline', body(CNI_CONTAINERID=CID + '\n'), 4),
    ('container id with NUL', body(CNI_CONTAINERID=CID + '\0'), 4),
    ('container id with space', body(CNI_CONTAINERID='abc def'), 4),
    ('container id a number', body(CNI_CONTAINERID=1234), 4),
    # 4: CNI_IFNAME
    ('ifname 16 chars', body(CNI_IFNAME='e' * 16), 4),
    ('ifname with slash', body(CNI_IFNAME='eth/0'), 4),
    ('ifname ..', body(CNI_IFNAME='..'), 4),
    ('ifname .', body(CNI_IFNAME='.'), 4),
    ('ifname empty for ADD', body(CNI_IFNAME=''), 4),
    ('ifname empty for DEL', body('DEL', CNI_IFNAME=''), 4),
    ('ifname with space', body(CNI_IFNAME='eth 0'), 4),
    ('ifname with colon', body(CNI_IFNAME='eth0:1'), 4),
    ('ifname with newline', body(CNI_IFNAME='eth0\n'), 4),
    ('ifname a list', body(CNI_IFNAME=['eth0']), 4),
    # 4: CNI_NETNS
    ('netns relative', body(CNI_NETNS='var/run/netns/x'), 4),
    ('netns relative for DEL', body('DEL', CNI_NETNS='netns/x'), 4),
    ('netns empty for ADD', body(CNI_NETNS=''), 4),
    ('netns missing for ADD', body(CNI_NETNS=None), 4),
    ('netns empty for CHECK', body('CHECK', CNI_NETNS=''), 4),
    ('netns with NUL', body(CNI_NETNS='/proc/1/ns/net\0x'), 4),
    ('netns too long', body(CNI_NETNS='/' + 'n' * 4096), 4),
    # 4: CNI_ARGS
    ('args without =', body(CNI_ARGS='a;b'), 4),
    ('args empty key', body(CNI_ARGS='=x'), 4),
    ('args two =', body(CNI_ARGS='K8S_POD_NAME=a=b'), 4),
    ('args trailing ;', body(CNI_ARGS='K8S_POD_NAME=web-0;'), 4),
    ('args too long', body(CNI_ARGS='K8S_POD_NAME=web-0;X=' + 'x' * 4100), 4),
    ('args not a string', body(CNI_ARGS={'K8S_POD_NAME': 'web-0'}), 4),
    ('ADD without K8S_POD_NAME', body(CNI_ARGS='K8S_POD_NAMESPACE=demo'), 4),
    ('ADD with empty K8S_POD_NAME', body(CNI_ARGS='K8S_POD_NAME='), 4),
    ('ADD without CNI_ARGS', body(CNI_ARGS=None), 4),
    ('namespace upper case', body(CNI_ARGS='K8S_POD_NAMESPACE=Demo;K8S_POD_NAME=web-0'), 4),
    ('namespace underscore', body(CNI_ARGS='K8S_POD_NAMESPACE=my_ns;K8S_POD_NAME=web-0'), 4),
    ('namespace 64 chars', body(CNI_ARGS='K8S_POD_NAMESPACE=%s;K8S_POD_NAME=w' % ('n' * 64)), 4),
    ('namespace with dot', body(CNI_ARGS='K8S_POD_NAMESPACE=a.b;K8S_POD_NAME=web-0'), 4),
    ('namespace with newline', body(CNI_ARGS='K8S_POD_NAMESPACE=demo\n;K8S_POD_NAME=w'), 4),
    ('name upper case', body(CNI_ARGS='K8S_POD_NAME=Web'), 4),
    ('name leading dash', body(CNI_ARGS='K8S_POD_NAME=-web'), 4),
    ('name with slash', body(CNI_ARGS='K8S_POD_NAME=a/b'), 4),
    ('name 254 chars', body(CNI_ARGS='K8S_POD_NAME=' + 'w' * 254), 4),
    ('name with newline', body(CNI_ARGS='K8S_POD_NAME=web\n'), 4),
    ('uid with slash', body(CNI_ARGS='K8S_POD_NAME=web;K8S_POD_UID=a/b'), 4),
    ('uid with space', body(CNI_ARGS='K8S_POD_NAME=web;K8S_POD_UID=a b'), 4),
    ('uid 129 chars', body(CNI_ARGS='K8S_POD_NAME=web;K8S_POD_UID=' + 'u' * 129), 4),
    ('DEL with invalid pod name', body('DEL', CNI_ARGS='K8S_POD_NAME=Web'), 4),
    # 7: network configuration
    ('config missing', body(config=None), 7),
    ('config a list', body(config=[{'cniVersion': '1.0.0', 'name': 'kuryr'}]), 7),
    ('config a string', body(config='{"cniVersion": "1.0.0"}'), 7),
    ('name missing', body(config_name=None), 7),
    ('name empty', body(config_name=''), 7),
    ('name with slash', body(config_name='a/b'), 7),
    ('name with space', body(config_name='my net'), 7),
    ('name 200 chars', body(config_name='n' * 200), 7),
    ('name a number', body(config_name=7), 7),
    ('name with newline', body(config_name='kuryr\n'), 7),
    ('prevResult a list', body(config_prevResult=[]), 7),
    ('prevResult a string', body(config_prevResult='{}'), 7),
    ('prevResult a number', body(config_prevResult=0), 7),
    ('prevResult interfaces a number', body(config_prevResult={'interfaces': 5}), 7),
    ('prevResult ips a string', body(config_prevResult={'ips': '10.0.0.5/24'}), 7),
    ('prevResult routes an object', body(config_prevResult={'routes': {'dst': '::/0'}}), 7),
    ('prevResult dns a list', body(config_prevResult={'dns': [['nameservers', []]]}), 7),
]


@pytest.mark.parametrize('b,code', [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_request_raises_its_code(b, code):
    with pytest.raises(errors.CNIError) as info:
        parse_raw(b)
    assert info.value.code == code, info.value.msg
    assert info.value.http_status == 400


def test_command_sent_to_the_wrong_endpoint_is_code_4():
    with pytest.raises(errors.InvalidEnvironment) as info:
        parse_raw(body('DEL'), 'ADD')
    assert info.value.code == 4
    assert 'DEL' in info.value.msg and 'ADD' in info.value.msg


BAD_BYTES = [
    ('not JSON', b'CNI_COMMAND=ADD'),
    ('empty', b''),
    ('truncated', b'{"CNI_COMMAND": "ADD"'),
    ('a list', b'[{"CNI_COMMAND": "ADD"}]'),
    ('a string', b'"ADD"'),
    ('a number', b'42'),
    ('null', b'null'),
    ('invalid UTF-8', b'{"CNI_COMMAND": "\xff\xfe"}'),
    ('deeply nested', b'[' * 100000),
    ('deeply nested object', b'{"config":' * 20000 + b'{}' + b'}' * 20000),
]


@pytest.mark.parametrize('raw', [c[1] for c in BAD_BYTES], ids=[c[0] for c in BAD_BYTES])
def test_undecodable_body_is_code_6(raw):
    with pytest.raises(errors.DecodeFailure) as info:
        request.decode(raw)
    assert info.value.code == 6


def test_body_over_one_mebibyte_is_too_large():
    raw = json.dumps(body()).encode()
    raw = raw + b' ' * (request.MAX_BODY_BYTES + 1 - len(raw))
    assert len(raw) == 1024 * 1024 + 1
    with pytest.raises(errors.BodyTooLarge) as info:
        request.decode(raw)
    assert info.value.code == 4
    assert info.value.http_status == 413


def test_body_of_exactly_one_mebibyte_is_accepted():
    raw = json.dumps(body()).encode()
    raw = raw + b' ' * (request.MAX_BODY_BYTES - len(raw))
    assert len(raw) == 1024 * 1024
    assert request.parse(request.decode(raw)).container_id == CID


# -- good inputs ------------------------------------------------------------

def test_add_parses_every_field():
    req = parse_raw(body(), 'ADD')
    assert req == request.Request(
        command='ADD', cni_version='1.0.0', network='kuryr', container_id=CID,
        netns=NETNS, ifname='eth0',
        pod=request.PodRef('demo', 'web-0', '1b2c-3d4e'),
        config={'cniVersion': '1.0.0', 'name': 'kuryr', 'type': 'kuryr-cni'})
    assert req.pod.key == 'demo/web-0'
    assert req.prev_result is None


@pytest.mark.parametrize('args', [
    'K8S_POD_NAME=web-0',                          # podman: the name only
    'K8S_POD_NAMESPACE=;K8S_POD_NAME=web-0',       # present but empty
])
def test_pod_namespace_defaults_to_default(args):
    req = parse_raw(body(CNI_ARGS=args))
    assert req.pod == request.PodRef('default', 'web-0', None)
    assert req.pod.key == 'default/web-0'


def test_unknown_cni_args_keys_are_ignored():
    args = ('IgnoreUnknown=1;K8S_POD_INFRA_CONTAINER_ID=%s;K8S_POD_NAME=web-0;'
            'SOMETHING_ELSE=Upper_Case/and spaces;K8S_POD_NAMESPACE=demo' % CID)
    req = parse_raw(body(CNI_ARGS=args))
    assert req.pod == request.PodRef('demo', 'web-0', None)


def test_dotted_pod_name_and_maximal_namespace_are_valid():
    namespace = 'n' * 63
    name = '.'.join(['a' * 63] * 3) + '.' + 'b' * 61     # 253 characters
    assert len(name) == 253
    req = parse_raw(body(CNI_ARGS='K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s' % (namespace, name)))
    assert req.pod.key == '%s/%s' % (namespace, name)


@pytest.mark.parametrize('args', ['', 'IgnoreUnknown=1', 'K8S_POD_NAMESPACE=demo'])
def test_del_without_pod_identity_gives_no_pod(args):
    req = parse_raw(body('DEL', CNI_ARGS=args), 'DEL')
    assert req.pod is None
    assert req.container_id == CID


@pytest.mark.parametrize('netns', ['', None])
def test_del_with_empty_netns_is_allowed(netns):
    req = parse_raw(body('DEL', CNI_NETNS=netns), 'DEL')
    assert req.netns is None
    assert req.command == 'DEL'


def test_del_without_prev_result_is_allowed():
    req = parse_raw(body('DEL', config_prevResult=None))
    assert req.prev_result is None


def test_prev_result_is_kept():
    prev = {'cniVersion': '1.0.0', 'interfaces': [{'name': 'eth0'}], 'ips': [], 'routes': None,
            'dns': {'nameservers': ['10.96.0.10']}}
    req = parse_raw(body('CHECK', config_prevResult=prev))
    assert req.prev_result == prev


@pytest.mark.parametrize('version', cni.SUPPORTED_VERSIONS)
@pytest.mark.parametrize('command', ['ADD', 'DEL'])
def test_every_supported_version_is_accepted_for_add_and_del(command, version):
    req = parse_raw(body(command, version), command)
    assert (req.command, req.cni_version) == (command, version)


@pytest.mark.parametrize('version', ['0.4.0', '1.0.0', '1.1.0'])
def test_check_is_accepted_from_0_4_0(version):
    assert parse_raw(body('CHECK', version), 'CHECK').cni_version == version


@pytest.mark.parametrize('command', ['GC', 'STATUS'])
def test_gc_and_status_on_1_1_0_need_no_sandbox(command):
    b = body(command, '1.1.0', CNI_CONTAINERID=None, CNI_NETNS=None, CNI_IFNAME=None,
             CNI_ARGS=None)
    req = parse_raw(b, command)
    assert (req.container_id, req.netns, req.ifname, req.pod) == (None, None, None, None)
    assert req.network == 'kuryr'


def test_null_environment_values_read_as_empty():
    req = parse_raw(body('DEL', CNI_NETNS=None, CNI_PATH=None) | {'CNI_ARGS': None})
    assert (req.netns, req.pod) == (None, None)


def test_parse_does_not_modify_the_body():
    b = body(config_prevResult={'interfaces': []})
    before = copy.deepcopy(b)
    parse_raw(b)
    assert b == before


# -- parse_args and error_version -------------------------------------------

@pytest.mark.parametrize('text,expected', [
    ('', {}),
    ('A=1', {'A': '1'}),
    ('A=1;B=', {'A': '1', 'B': ''}),
    ('A=1;A=2', {'A': '2'}),
])
def test_parse_args(text, expected):
    assert request.parse_args(text) == expected


@pytest.mark.parametrize('b,expected', [
    (body(version='0.3.1'), '0.3.1'),
    (body(version='0.4.0'), '0.4.0'),
    (body(config_cniVersion='9.9.9'), '1.1.0'),
    (body(config=None), '1.1.0'),
    (body(config='x'), '1.1.0'),
    ([], '1.1.0'),
    (None, '1.1.0'),
])
def test_error_version(b, expected):
    assert request.error_version(b) == expected


def test_error_serialises_to_cni_error_json():
    with pytest.raises(errors.CNIError) as info:
        parse_raw(body(CNI_IFNAME='..'))
    assert info.value.to_dict('0.4.0') == {
        'cniVersion': '0.4.0', 'code': 4, 'msg': info.value.msg, 'details': ''}
    json.dumps(info.value.to_dict('0.4.0'))
