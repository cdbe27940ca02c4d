"""Fixtures for functional tests: throwaway network namespaces.

Functional tests need root and iproute2; every test module marks itself with
``pytestmark = pytest.mark.skipif(not CAN_RUN, reason=SKIP_REASON)``.

The one rule: nothing is ever created in the machine's own network
namespace. Tests build their world in namespaces named ``kc-t<pid>-<random>``
and the fixtures delete them (and everything in them) afterwards, even when
the test fails; :func:`root_netns_untouched` checks the rule for the whole
session.
"""

import json
import os
import shutil
import subprocess
import uuid

import pytest

IP = shutil.which('ip')
CAN_RUN = os.geteuid() == 0 and IP is not None
SKIP_REASON = 'needs root and iproute2 (ip) to create network namespaces'

# Every namespace this test session makes starts with this, so the leak check
# judges only its own (another suite may be running on the machine meanwhile).
SESSION_PREFIX = 'kc-t%d' % os.getpid()

GATEWAY4 = '10.99.0.1'
GATEWAY6 = 'fd99::1'
BRIDGE = 'kc-br0'


class Namespace:
    """A throwaway network namespace, inspected through ``ip -j``."""

    def __init__(self, name):
        self.name = name
        self.path = '/run/netns/' + name

    def __repr__(self):
        return '<Namespace %s>' % self.name

    def delete(self):
        """Delete the namespace now (the fixture's teardown then has nothing to do)."""
        subprocess.run([IP, 'netns', 'delete', self.name], check=True, capture_output=True,
                       timeout=30)

    def ip(self, *args, check=True):
        """Run ``ip -n <ns> args``; return its stdout."""
        proc = subprocess.run([IP, '-n', self.name, *args], capture_output=True, text=True,
                              timeout=30)
        if check and proc.returncode:
            raise AssertionError('ip -n %s %s failed: %s'
                                 % (self.name, ' '.join(args), proc.stderr.strip()))
        return proc.stdout

    def run(self, *cmd, timeout=30):
        """Run a command inside the namespace; return the CompletedProcess."""
        return subprocess.run([IP, 'netns', 'exec', self.name, *cmd], capture_output=True,
                              text=True, timeout=timeout)

    def pings(self, address):
        """Whether one ping from inside the namespace to ``address`` is answered."""
        return self.run('ping', '-c1', '-W2', '-q', address).returncode == 0

    def plug(self, container_id='c0ffee', ifname='eth0', default_route=True):
        """A binding Plug putting ``ifname`` of sandbox ``container_id`` in this namespace."""
        from kuryr_cni import binding
        return binding.Plug(container_id, self.path, ifname, default_route)

    def links(self):
        """{ifname: ``ip -j -d link`` object} of every link."""
        return {link['ifname']: link for link in json.loads(self.ip('-j', '-d', 'link', 'show'))}

    def link(self, ifname):
        """The link ``ifname`` (with its addresses under ``addr_info``), or None."""
        out = self.ip('-j', '-d', 'addr', 'show', 'dev', ifname, check=False)
        return json.loads(out)[0] if out.strip() else None

    def addresses(self, ifname, scope='global'):
        """{'addr/prefix'} of ``ifname`` (default: global scope only)."""
        link = self.link(ifname) or {}
        return {'%s/%d' % (a['local'], a['prefixlen']) for a in link.get('addr_info', [])
                if scope is None or a.get('scope') == scope}

    def routes(self):
        """{(dst, gateway or None, dev)} of the main table, both families."""
        found = set()
        for family in ('-4', '-6'):
            for route in json.loads(self.ip('-j', family, 'route', 'show')):
                found.add((route['dst'], route.get('gateway'), route.get('dev')))
        return found


@pytest.fixture(scope='session', autouse=True)
def root_netns_untouched():
    """Fail the session if the root namespace's links changed or a test namespace leaked."""
    if not CAN_RUN:
        yield
        return
    before, namespaces = _root_links(), _test_namespaces()
    yield
    after = _root_links()
    assert after == before, ('the root network namespace changed: added %s, removed %s'
                             % (sorted(after - before), sorted(before - after)))
    leaked = _test_namespaces() - namespaces
    assert not leaked, 'test namespaces left behind: %s' % sorted(leaked)


def _test_namespaces():
    names = subprocess.run([IP, 'netns', 'list'], capture_output=True, text=True,
                           timeout=30).stdout.split()
    return {name for name in names if name.startswith(SESSION_PREFIX + '-')}


def _root_links():
    out = subprocess.run([IP, '-j', 'link', 'show'], capture_output=True, text=True,
                         check=True).stdout
    return {(link['ifindex'], link['ifname']) for link in json.loads(out)}


@pytest.fixture
def netns_factory():
    """Call it to get a new empty :class:`Namespace`; all are deleted afterwards."""
    made = []

    def make():
        ns = Namespace('%s-%s' % (SESSION_PREFIX, uuid.uuid4().hex[:10]))
        subprocess.run([IP, 'netns', 'add', ns.name], check=True, capture_output=True,
                       timeout=30)
        made.append(ns)
        return ns

    yield make
    for ns in made:
        subprocess.run([IP, 'netns', 'delete', ns.name], capture_output=True, timeout=30)


@pytest.fixture
def host_ns(netns_factory):
    """A namespace acting as the node: bridge ``kc-br0``, up, holding the gateways.

    The test puts the gateway addresses on the bridge itself, as the
    network's router would hold them; the daemon never does.
    """
    ns = netns_factory()
    ns.ip('link', 'set', 'lo', 'up')
    ns.ip('link', 'add', BRIDGE, 'type', 'bridge')
    ns.ip('addr', 'add', GATEWAY4 + '/24', 'dev', BRIDGE)
    ns.ip('addr', 'add', GATEWAY6 + '/64', 'dev', BRIDGE, 'nodad')
    ns.ip('link', 'set', BRIDGE, 'up')
    return ns


@pytest.fixture
def pod_ns(netns_factory):
    """Factory of empty pod namespaces (``pod_ns()``)."""
    return netns_factory


# The daemon under test ---------------------------------------------------------
# A test host (tools.testbed.host) is a namespace of its own holding the
# bridge, the gateway, the Kubernetes API stand-in's socket and the daemon.


@pytest.fixture
def vif_timeout():
    """The daemon's [cni_daemon] vif_timeout; parametrize it to override."""
    return 20


@pytest.fixture
def node():
    if not CAN_RUN:
        pytest.skip(SKIP_REASON)
    from tools.testbed import host as testhost
    with testhost.Host(prefix=SESSION_PREFIX) as host:
        host.start_api()
        yield host


@pytest.fixture
def daemon(node, vif_timeout):
    node.start_daemon(workers=4, vif_timeout=vif_timeout)
    return node


@pytest.fixture
def br_int(node):
    """A private Open vSwitch in the node namespace, its ``br-int`` holding 10.20.0.1/24."""
    from tools.testbed import host as testhost
    from tools.testbed import ovs as testovs
    reason = testovs.missing()
    if reason:
        pytest.skip(reason)
    with testovs.PrivateOVS(node.ns) as switch:
        switch.add_bridge('br-int')
        testhost.ip('-n', node.ns, 'addr', 'add', '10.20.0.1/24', 'dev', 'br-int')
        testhost.ip('-n', node.ns, 'link', 'set', 'br-int', 'up')
        yield switch


@pytest.fixture
def runtime(node, tmp_path):
    from tools.testbed import runtime as testruntime
    return testruntime.Runtime(node.socket, node.state_dir, str(tmp_path / 'cni-cache'),
                               shim=node.install_shim())
