"""Health and metrics on their default address, ``::``: both families, or IPv4 alone.

An IPv6-only node: a namespace whose only address besides loopback's is an
IPv6 one. A node without IPv6: a namespace with net.ipv6.conf.all.disable_ipv6
set to 1 (inside it, never on the machine).
"""

import pytest

from tests.functional import conftest
from tests.functional import helpers
from tools.testbed import host as testhost

pytestmark = pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON)

NODE_ADDRESS6 = 'fd42::5'
HEALTH, METRICS = 8090, 9655


@pytest.fixture
def node():
    # No bridge: it would carry the IPv4 gateway address.
    with testhost.Host(prefix=conftest.SESSION_PREFIX, bridge=False) as host:
        host.start_api()
        yield host


def _log(node):
    with open(node.workdir + '/daemon.log') as f:
        return f.read()


def test_an_ipv6_only_node_reaches_them_over_ipv6_and_loopback_over_both(node):
    # A veth pair inside the namespace (some kernels have no dummy links).
    testhost.ip('-n', node.ns, 'link', 'add', 'uplink0', 'type', 'veth', 'peer', 'name', 'peer0')
    testhost.ip('-n', node.ns, 'addr', 'add', NODE_ADDRESS6 + '/64', 'dev', 'uplink0', 'nodad')
    for link in ('uplink0', 'peer0'):
        testhost.ip('-n', node.ns, 'link', 'set', link, 'up')
    addresses = testhost.ip('-n', node.ns, '-o', 'addr', 'show', 'scope', 'global').stdout
    assert ' inet ' not in addresses and NODE_ADDRESS6 in addresses
    # Where sockets are IPv6-only unless they say otherwise, ours still take IPv4.
    testhost.ip('netns', 'exec', node.ns, 'sysctl', '-qw', 'net.ipv6.bindv6only=1')
    node.start_daemon(config_files=[helpers.node_config(node)])
    for address in ('::1', NODE_ADDRESS6, '127.0.0.1'):
        assert node.http_get(HEALTH, '/ready', address=address)[0] == 200, address
        assert node.http_get(METRICS, '/metrics', address=address)[0] == 200, address
    assert 'health on [::]:8090, metrics on [::]:9655' in _log(node)


def test_a_node_without_ipv6_gets_them_on_ipv4(node):
    out = testhost.ip('netns', 'exec', node.ns, 'sysctl', '-w',
                      'net.ipv6.conf.all.disable_ipv6=1').stdout
    assert out.strip() == 'net.ipv6.conf.all.disable_ipv6 = 1'
    node.start_daemon(config_files=[helpers.node_config(node)])
    assert node.http_get(HEALTH, '/ready')[0] == 200
    assert node.http_get(METRICS, '/metrics')[0] == 200
    assert 'health on 0.0.0.0:8090, metrics on 0.0.0.0:9655' in _log(node)
