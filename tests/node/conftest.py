"""Fixtures of the node tier: one real node, driven by kubelet, for the whole session.

The tier needs root and a built node (``tools/node build``, which builds
kube-apiserver and kubelet too; ``tools/test`` runs it). Without them it
skips with the reason, except in CI (``CI=true``), where a missing build
fails every test.

The session owns a kube-apiserver (:class:`tests.k8s.cluster.Cluster`, with the
DaemonSet's RBAC and the KuryrPort CRD applied), one node
(:class:`tests.node.kubenode.KubeNode`: containerd, kubelet and the daemon as
shipped) and the controller that plays kuryr-controller and Neutron for it
(:class:`tests.node.controller.Controller`). kubelet's own API rate limit is
raised (``--kube-api-qps``): at its default of 5 requests a second, status
updates of a burst of pods queue for many seconds whatever the CNI plugin
does. Each test's pods are deleted after it, and the test fails if any pod,
device, binding or queued DEL is left.
"""

import os
import re

import pytest

from tests import conftest
from tests import wait
from tests.k8s import cluster as k8s
from tests.node import controller as kcontroller
from tests.node import kubenode

SESSION_PREFIX = 'kc-n%d' % os.getpid()
LOG_LINES = 40          # of the daemon's log, shown with a failing test
SLOW_LINES = 10         # of etcd's warnings and kube-apiserver's slow requests
PROBLEM_LINES = 30      # of its warnings and errors: the tail may hold only retries
_PROBLEM = re.compile(r' (WARNING|ERROR|CRITICAL) '
                      r'| kuryr_cni\.listwatch .*(expired|re-established|cannot list)')
# etcd's warnings (slow fdatasync, requests that took too long) and errors;
# kube-apiserver's slow requests are its traces' first lines.
_SLOW = {'etcd.log': re.compile(r' [WE] \| '), 'kube-apiserver.log': re.compile(r'Trace\[\d+\]: "')}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test, or a test whose pods were not all cleaned up after it, shows what
    the stand-in did, etcd's and kube-apiserver's slow requests, the daemon's warnings
    and errors (and its watches' restarts), and the end of the daemon's log: the node
    and its files are gone once the session ends. They come first, before pytest's
    captured output, so a record that keeps only the head of a failure still has them."""
    report = (yield).get_result()
    if report.when == 'setup' or not report.failed:
        return
    node, playing = item.funcargs.get('node'), item.funcargs.get('controller')
    server = item.funcargs.get('cluster')
    sections = []
    if playing is not None:
        sections.append(('the stand-in controller', playing.account()))
    if server is not None:
        sections.extend(_slow_requests(server))
    if node is not None and os.path.exists(node.daemon_log_path):   # gone with the session
        lines = node.daemon_log().splitlines()
        problems = [line for line in lines if _PROBLEM.search(line)][:PROBLEM_LINES]
        sections.append(('the daemon\'s first %d warnings, errors and watch restarts'
                         % len(problems), '\n'.join(problems)))
        sections.append(('the daemon\'s log, last %d lines' % LOG_LINES,
                         '\n'.join(lines[-LOG_LINES:])))
    report.sections[:0] = sections


def _slow_requests(server):
    for name, wanted in _SLOW.items():
        path = os.path.join(server.dir, 'logs', name)
        if not os.path.exists(path):    # gone with the session
            continue
        with open(path, errors='replace') as log:
            lines = [line.rstrip() for line in log if wanted.search(line)]
        yield ('%s: %d slow requests or warnings, the last %d'
               % (name, len(lines), min(len(lines), SLOW_LINES)),
               '\n'.join(lines[-SLOW_LINES:]))


@pytest.fixture(scope='session')
def cluster():
    conftest.require_tier('node', kubenode.missing())
    with k8s.serving(SESSION_PREFIX) as server:
        yield server


@pytest.fixture(scope='session')
def node(cluster):
    kube_node = kubenode.KubeNode(cluster, SESSION_PREFIX)
    try:
        kube_node.start_daemon()
        kube_node.wait_ready_node()
        yield kube_node
    finally:
        kube_node.close()


@pytest.fixture(scope='session')
def controller(cluster, node):
    playing = kcontroller.Controller(cluster, node)
    try:
        yield playing
    finally:
        playing.close()


@pytest.fixture
def pods(cluster, node, controller):
    """Pods of this test (:class:`tests.node.kubenode.Pods`); all gone after it."""
    with kubenode.pods_deleted_after(cluster, node) as made:
        try:
            yield made
        finally:
            if node.daemon.poll() is not None:      # a test that stopped it failed
                node.start_daemon()     # or nothing could delete its pods
    wait.until(lambda: not controller.ports, 60, 'the controller to see every pod gone')
    try:
        wait.until(lambda: node.leftovers() == kubenode.NOTHING, 30, 'nothing left')
    except AssertionError:
        assert node.leftovers() == kubenode.NOTHING
