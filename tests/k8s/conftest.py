"""Fixtures of the k8s tier: a real kube-apiserver, and daemons that use it.

The tier needs root (network namespaces) and a built kube-apiserver
(``tools/kube-apiserver build``; ``tools/test`` builds it). Without them it
skips with the reason, except in CI (``CI=true``), where a missing server
fails every test: a tier that silently skips there would prove nothing.

One server serves the whole session (:class:`tests.k8s.cluster.Cluster`),
with the RBAC objects of ``etc/kubernetes/kuryr-cni-daemonset.yaml`` and
the KuryrPort CRD of ``etc/kubernetes/kuryrport-crd.yaml`` applied. Each test
gets nodes of its own name, so no daemon ever sees another test's pods; the
objects stay until the session's server goes.
"""

import json
import os
import subprocess
import uuid

import pytest

from tests import conftest
from tests.k8s import cluster as k8s
from tools.testbed import host as testhost
from tools.testbed import runtime as testruntime

SESSION_PREFIX = 'kc-k%d' % os.getpid()


def _unavailable():
    conftest.require_tier('k8s', k8s.missing())


@pytest.fixture(scope='session', autouse=True)
def root_netns_untouched():
    """Fail the session if the machine's namespace changed or a namespace of ours leaked."""
    if k8s.missing():
        yield
        return
    before = _root_links()
    yield
    assert _root_links() == before, 'the root network namespace changed'
    names = subprocess.run(['ip', 'netns', 'list'], capture_output=True, text=True,
                           timeout=30).stdout.split()
    leaked = [name for name in names if name.startswith(SESSION_PREFIX)]
    assert not leaked, 'namespaces left behind: %s' % leaked


def _root_links():
    out = subprocess.run(['ip', '-j', 'link', 'show'], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    return {(link['ifindex'], link['ifname']) for link in json.loads(out)}


@pytest.fixture(scope='session')
def cluster():
    _unavailable()
    with k8s.serving(SESSION_PREFIX) as server:
        yield server


class Node(testhost.Host):
    """A test host wired to the cluster, whose daemon is named ``self.name`` there."""

    def __init__(self, cluster):
        super().__init__(prefix=SESSION_PREFIX)
        self.cluster = cluster
        self.name = 'node-%s' % uuid.uuid4().hex[:8]
        try:
            self.address = cluster.attach(self)
        except BaseException:
            self.close()
            raise

    def start_daemon(self, vif_source='annotation', extra='', **kwargs):
        return super().start_daemon(
            extra=self.cluster.daemon_config(self.name, vif_source) + extra, **kwargs)

    def sandbox(self, pod):
        """A sandbox of ``pod`` (an API object) in a new pod namespace of this node."""
        return testruntime.Sandbox('sandbox-' + pod['metadata']['name'], self.pod_netns(),
                                   pod['metadata']['name'], pod_uid=pod['metadata']['uid'])

    def counters(self):
        """``(rx_bytes, tx_bytes)`` of the node's link to the control plane."""
        out = testhost.ip('-n', self.ns, '-j', '-s', 'link', 'show', 'dev', k8s.NODE_LINK).stdout
        stats = json.loads(out)[0]['stats64']
        return stats['rx']['bytes'], stats['tx']['bytes']

    def daemon_log(self):
        try:
            with open(os.path.join(self.workdir, 'daemon.log'), errors='replace') as f:
                return f.read()
        except FileNotFoundError:       # not written yet
            return ''


@pytest.fixture
def node_factory(cluster):
    made = []

    def make():
        made.append(Node(cluster))
        return made[-1]

    yield make
    token = cluster.token('daemon')
    try:
        for node in made:
            # Whatever failed (403s, outages, restarts), the token never reached a log.
            for name in ('daemon.log', 'daemon.stderr'):
                path = os.path.join(node.workdir, name)
                if os.path.exists(path):
                    with open(path, errors='replace') as f:
                        assert token not in f.read(), '%s of %s' % (name, node.name)
    finally:
        for node in made:
            node.close()


@pytest.fixture
def node(node_factory):
    return node_factory()


@pytest.fixture
def runtime(node, tmp_path):
    return testruntime.Runtime(node.socket, node.state_dir, str(tmp_path / 'cni-cache'),
                               shim=node.install_shim())
