"""kuryr_cni.cni.prevresult: CHECK's judgement of prevResult against a namespace's view."""

import ipaddress

import pytest

from kuryr_cni.cni import prevresult

NETNS = '/run/netns/pod'
MAC = 'fa:16:3e:00:00:05'


def view(mac=MAC, addresses=('10.10.0.5/24',), routes=(('0.0.0.0/0', '10.10.0.1'),
                                                       ('10.10.0.0/24', None))):
    return {'links': {'lo': {'mac': '00:00:00:00:00:00', 'addresses': set()},
                      'eth0': {'mac': mac, 'addresses': {ipaddress.ip_interface(a)
                                                         for a in addresses}}},
            'routes': {(ipaddress.ip_network(d), None if g is None else ipaddress.ip_address(g))
                       for d, g in routes}}


def prev(**changes):
    result = {'cniVersion': '1.0.0',
              'interfaces': [{'name': 'eth0', 'mac': MAC, 'sandbox': NETNS}],
              'ips': [{'address': '10.10.0.5/24', 'gateway': '10.10.0.1', 'interface': 0}],
              'routes': [{'dst': '0.0.0.0/0', 'gw': '10.10.0.1'}], 'dns': {}}
    result.update(changes)
    return result


def differences(result, seen=None, ifnames=('eth0',)):
    return prevresult.differences(result, NETNS, list(ifnames), seen or view())


def test_matching_prev_result_has_no_differences():
    assert differences(prev()) == []


def test_mac_is_compared_case_blind():
    assert differences(prev(interfaces=[{'name': 'eth0', 'mac': MAC.upper(),
                                         'sandbox': NETNS}])) == []


@pytest.mark.parametrize('result, seen, words', [
    (prev(), view(mac='fa:16:3e:99:99:99'), 'eth0 has MAC fa:16:3e:99:99:99, prevResult says'),
    (prev(), view(addresses=()), 'eth0 lacks address 10.10.0.5/24'),
    (prev(), view(routes=()), 'route 0.0.0.0/0 via 10.10.0.1 listed in prevResult is missing'),
    (prev(routes=[{'dst': '0.0.0.0/0', 'gw': '10.10.0.254'}]), view(), 'via 10.10.0.254'),
    (prev(interfaces=[]), view(), 'prevResult lists no interface eth0 in /run/netns/pod'),
    (prev(interfaces=[{'name': 'eth0', 'mac': MAC, 'sandbox': '/run/netns/other'}]), view(),
     'prevResult lists no interface eth0'),
    (prev(), {'links': {}, 'routes': set()}, 'eth0 is missing'),
    (prev(ips=[{'address': 'nonsense', 'interface': 0}]), view(), "'nonsense' is not"),
    (prev(routes=[{'dst': 'nowhere'}]), view(), 'is malformed'),
], ids=['mac', 'address', 'route', 'route gateway', 'no interface', 'other sandbox',
        'no device', 'bad address', 'bad route'])
def test_differences_are_named(result, seen, words):
    found = differences(result, seen)
    assert any(words in problem for problem in found), found


def test_other_plugins_entries_are_not_ours_to_judge():
    result = prev()
    result['interfaces'].append({'name': 'tap0', 'mac': '00:11:22:33:44:55'})
    result['ips'].append({'address': '192.168.1.1/24', 'interface': 1})
    result['ips'].append({'address': '192.168.2.1/24'})    # no interface: an IPAM's
    result['routes'].append({'dst': '192.168.0.0/16', 'gw': '10.10.0.1', 'table': 100})
    assert differences(result) == []


def test_route_without_gateway_matches_any():
    assert differences(prev(routes=[{'dst': '10.10.0.0/24'}])) == []


def test_every_interface_of_the_attachment_is_required():
    found = differences(prev(), ifnames=('eth0', 'net1'))
    assert found == ['prevResult lists no interface net1 in /run/netns/pod']


@pytest.mark.parametrize('junk', [{}, {'interfaces': 'eth0'}, {'interfaces': [1, None]},
                                  {'ips': {}, 'routes': 'x', 'interfaces': []}])
def test_malformed_prev_result_fails_without_crashing(junk):
    assert differences(junk) == ['prevResult lists no interface eth0 in /run/netns/pod']
