"""Fixtures of the gate tier: the whole gate topology on one machine.

What the DevStack job (``devstack/``, ``.zuul.yaml``) would run, offline: the
openstack tier's stack (:class:`tests.openstack.stack.Stack`: neutron ML2/OVN,
OVN, MariaDB, kube-apiserver and the real kuryr-controller, in one network
namespace) and the node tier's node (:class:`tests.node.kubenode.KubeNode`:
kubelet and containerd from ``tools/node``, the daemon started by the image's
entrypoint on the DaemonSet's configuration), the node running inside the
stack's namespace: ovs-vswitchd's userspace datapath reaches the pods' veths
only there. kubelet registers as the stack's node, the one kuryr-controller
binds ports to and OVN's chassis is named after; it and the daemon reach the
stack's kube-apiserver on the namespace's loopback, the daemon as the
DaemonSet's service account (the stack applies its RBAC). The daemon's
configuration is the shipped one, unchanged: its ``ovsdb_connection``
(``/run/openvswitch/db.sock``) is the node's ``/run``, where a link to the
stack's Open vSwitch database is put, as on a node whose Open vSwitch is the
host's.

The tier needs what both tiers need (root, ``tools/node build``,
``tools/openstack build``); without it it skips with the reason, except in CI
(``CI=true``), where it fails, as does a stack that cannot start, always.
"""

import os
import tempfile
import time

import pytest

from tests import conftest
from tests.k8s import cluster as k8s
from tests.node import kubenode
from tests.openstack import stack as osstack

SESSION_PREFIX = 'kc-g%d' % os.getpid()
NODE_ADDRESS = '10.251.0.2'     # kubelet's node IP, on a link of the stack's namespace
TIMINGS = []                    # (what, seconds): reported at the end of the run


def record(what, seconds):
    TIMINGS.append((what, seconds))


def pytest_terminal_summary(terminalreporter):
    if TIMINGS:
        terminalreporter.section('gate tier timings')
        for what, seconds in TIMINGS:
            terminalreporter.write_line('%-70s %7.2f s' % (what, seconds))


class StackCluster(k8s.Cluster):
    """The stack's kube-apiserver, seen as the node tier sees its cluster."""

    address = '127.0.0.1'
    port = 6443

    def __init__(self, stack):      # the stack started it: nothing of Cluster.__init__
        self.netns = stack.netns
        self.dir = os.path.join(stack.dir, 'k8s')      # tools/kube-apiserver's files
        self.extra_flags = []
        self.url = stack.env['K8S_URL']
        assert self.url == 'https://%s:%d' % (self.address, self.port), self.url
        self._pool = None
        self._connect()

    def attach(self, host):
        """kubelet's node IP: on a link of the stack's namespace, where the node runs."""
        k8s.ip('-n', host.ns, 'link', 'add', 'kuryr-node', 'type', 'bridge')
        k8s.ip('-n', host.ns, 'addr', 'add', NODE_ADDRESS + '/24', 'dev', 'kuryr-node')
        k8s.ip('-n', host.ns, 'link', 'set', 'kuryr-node', 'up')
        return NODE_ADDRESS

    def close(self):
        """The stack's: only the admin's clients go."""
        self._disconnect()


def _missing():
    return kubenode.missing() or osstack.missing()


@pytest.fixture(scope='session')
def stack():
    conftest.require_tier('gate', _missing())
    started = time.monotonic()
    stack = osstack.Stack(tempfile.mkdtemp(prefix='kc-gate-'), SESSION_PREFIX + '-osp',
                          kubenode.NODE_NAME)
    record('stack start (tools/openstack start)', time.monotonic() - started)
    try:
        yield stack
    finally:
        stack.close()


@pytest.fixture(scope='session')
def cluster(stack):
    cluster = StackCluster(stack)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope='session')
def node(stack, cluster):
    started = time.monotonic()
    # tools/openstack start made the Node object, with no status: kubelet 1.20, finding it
    # registered, panics on its empty capacity. kubelet makes its own.
    stack.k8s('DELETE', '/api/v1/nodes/' + kubenode.NODE_NAME)
    kube_node = kubenode.KubeNode(cluster, SESSION_PREFIX, netns=stack.netns)
    try:
        # The shipped ovsdb_connection, in the node's /run: the stack's database.
        ovs_run = os.path.join(kube_node.dir, 'mnt', 'run', 'openvswitch')
        os.makedirs(ovs_run, exist_ok=True)
        os.symlink(stack.env['OVSDB'].split(':', 1)[1], os.path.join(ovs_run, 'db.sock'))
        kube_node.start_daemon()
        kube_node.wait_ready_node()
        record('node start (tools/node start, the daemon ready, node Ready)',
               time.monotonic() - started)
        yield kube_node
    finally:
        kube_node.close()


@pytest.fixture
def pods(cluster, node):
    """Pods of this test (:class:`tests.node.kubenode.Pods`); all gone after it."""
    with kubenode.pods_deleted_after(cluster, node) as made:
        yield made
