"""Fixtures of the openstack tier: the daemon behind the real kuryr-controller and Neutron.

One stack serves the whole session (:class:`tests.openstack.stack.Stack`,
``tools/openstack``): neutron 29 with ML2/OVN, OVN 23.03 on a private
userspace Open vSwitch, MariaDB, kube-apiserver and kuryr-controller 10.0.0,
all in one network namespace. The daemon under test runs in that namespace
too (ovs-vswitchd's userspace datapath reaches the pods' veths only there),
with ``vif_source = kuryrport``: it gets its VIFs from kuryr-controller alone,
and Neutron alone decides when a port is ACTIVE. Pods are Kubernetes objects
bound to the stack's node; their sandboxes are network namespaces, and the
runtime is :class:`tools.testbed.runtime.Runtime` driving the real shim.

The tier needs root, Open vSwitch, and both builds (``tools/kube-apiserver
build``, ``tools/openstack build``; ``tools/test`` runs them). Without them it
skips with the reason, except in CI (``CI=true``), where it fails; a stack
that cannot start fails every test, always.

TCP between pods: the userspace datapath reads a pod's packets from its veth
as the kernel left them, and with TX checksum offload on (a veth's default)
the kernel leaves TCP checksums for the hardware to fill in, which here
never happens: the peer drops every segment (ICMP is checksummed by the
stack and passes). Production ML2/OVN nodes use the kernel datapath, where
this cannot happen, and upstream kuryr does not touch offloads either, so
the daemon does not: the tier turns TX checksum offload off inside each pod
it wants TCP from (``Stack.checksum_offload_off``, ethtool from Debian), the
way a userspace-datapath node's operator would.
"""

import os
import tempfile
import time
import uuid

import pytest

from tests import conftest
from tests import wait
from tests.openstack import stack as osstack
from tools.testbed import host as testhost
from tools.testbed import kuryr_daemon as testkuryr
from tools.testbed import runtime as testruntime

NODE = 'node1'
VIF_TIMEOUT = 90        # kuryr-controller patches `active` on a backoff of 2, 6, 11, 18 s...
SESSION_PREFIX = 'kc-o%d' % os.getpid()
TIMINGS = []            # (what, seconds): reported at the end of the run
LOG_TAILS = []          # (log, its last lines): reported at the end of a run that failed
KURYR_DAEMON_CONSTRAINTS = os.path.join(osstack.REPO, 'tools', 'kuryr-daemon-constraints.txt')
LOGS = ('kuryr-controller', 'neutron', 'ovn-controller', 'ovn-northd', 'ovs-vswitchd')


def _unavailable():
    conftest.require_tier('openstack', osstack.missing())


def record(what, seconds):
    TIMINGS.append((what, seconds))


def pytest_terminal_summary(terminalreporter):
    for name, tail in LOG_TAILS:
        terminalreporter.section('openstack tier: the end of %s\'s log' % name)
        terminalreporter.write_line(tail)
    if TIMINGS:
        terminalreporter.section('openstack tier timings')
        for what, seconds in TIMINGS:
            terminalreporter.write_line('%-70s %7.2f s' % (what, seconds))


@pytest.fixture(scope='session')
def build():
    """The directory of ``tools/openstack build``'s build (the tier skips or fails without)."""
    _unavailable()
    return osstack.build_dir()


@pytest.fixture(scope='session')
def stack(build, request):
    temporary = set(os.listdir(tempfile.gettempdir()))
    started = time.monotonic()
    stack = osstack.Stack(tempfile.mkdtemp(prefix='kc-osp-'), SESSION_PREFIX + '-osp', NODE)
    record('stack start (tools/openstack start)', time.monotonic() - started)
    try:
        yield stack
        # What every test's pods left: nothing on the integration bridge, no port in Neutron.
        assert stack.br_int_ports() == {}
        assert stack.neutron('GET', '/ports?device_owner=compute:kuryr')['ports'] == []
    finally:
        if request.session.testsfailed:
            # The stack's files go with it: what a failure needs of them is shown now.
            for name in LOGS:
                LOG_TAILS.append((name, '\n'.join(stack.log(name).splitlines()[-40:])))
        stack.close()
    # The stack's processes keep their temporary files in its directory.
    assert not {name for name in set(os.listdir(tempfile.gettempdir())) - temporary
                if name.startswith('neutron')}


class Node(testhost.Host):
    """The stack's node: the daemon under test, and pod namespaces, in the stack's namespace."""

    def __init__(self, stack):
        super().__init__(prefix=SESSION_PREFIX, bridge=False, netns=stack.netns)
        self.stack = stack

    def start_daemon(self, vif_timeout=VIF_TIMEOUT, extra='', **kwargs):
        return super().start_daemon(
            vif_timeout=vif_timeout, extra=self.stack.daemon_config(vif_timeout) + extra,
            **kwargs)


@pytest.fixture
def node(stack):
    """The node, its daemon running (``node.start_daemon`` again after a stop)."""
    node = Node(stack)
    try:
        node.start_daemon()
        yield node
    finally:
        node.close()


class Runtime(testruntime.Runtime):
    """A runtime that, like a real one, DELs every sandbox it sent an ADD for, in the end."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sandboxes = []

    def add(self, sandbox):
        self.sandboxes.append(sandbox)
        return super().add(sandbox)

    def delete_all(self):
        for sandbox in self.sandboxes:
            self.delete(sandbox)


@pytest.fixture
def runtime(node, tmp_path):
    """A container runtime on the node: libcni's calls through the installed shim."""
    runtime = Runtime(node.socket, node.state_dir, str(tmp_path / 'cni-cache'),
                      cni_version='1.0.0', shim=node.install_shim())
    yield runtime
    runtime.delete_all()


@pytest.fixture
def pods(stack):
    """``pods()`` makes a pod (API object) on the node; all are deleted after the test,
    and their ports with them (kuryr-controller's finalizers run to the end)."""
    made = []

    def make():
        pod = stack.create_pod('pod-' + uuid.uuid4().hex[:8])
        made.append(pod)
        return pod

    yield make
    for pod in made:
        if stack.pod(pod['metadata']['name']) is not None:
            stack.delete_pod(pod['metadata']['name'])

    def deleted():
        return all(stack.pod(p['metadata']['name']) is None
                   and stack.kuryrport(p['metadata']['name']) is None
                   and not stack.ports_of(p['metadata']['uid']) for p in made)
    try:
        wait.until(deleted, 20, 'kuryr-controller to delete the pods', 0.1)
    except AssertionError:
        # kuryr-controller handles a KuryrPort's events one after the other: the deletion of
        # a port that never turned ACTIVE waits behind its activation's retries (500 s). A
        # restarted controller finalizes at once.
        stack.stop('kuryr-controller')
        stack.start()
        wait.until(deleted, 60, 'kuryr-controller to delete the pods', 0.1)


# The real kuryr-daemon 10.0.0 on the node (tools/testbed/kuryr_daemon.py) ----------------

@pytest.fixture(scope='module')
def kuryr_build(build):
    path = testkuryr.build_dir(osstack.CACHE, KURYR_DAEMON_CONSTRAINTS)
    conftest.require_tier('openstack', None if os.path.exists(os.path.join(path, 'complete'))
                          else 'kuryr-daemon is not built (tools/openstack '
                          'build-kuryr-daemon; cache %s)' % osstack.CACHE)
    return path


@pytest.fixture(scope='module')
def release_controller(stack, kuryr_build):
    """kuryr-controller of kuryr-daemon's release for this module, the stack's own after."""
    stack.swap_controller('kuryr-daemon')
    try:
        yield
    finally:
        stack.swap_controller(None)


@pytest.fixture
def kuryr(stack, kuryr_build, release_controller):
    daemon = testkuryr.KuryrDaemon(kuryr_build, stack.netns, stack.node, stack.env,
                                   stack.env['K8S_ADMIN_TOKEN'])
    try:
        daemon.start()
        yield daemon
    except BaseException:
        LOG_TAILS.append(('kuryr-daemon', daemon.log_tail()))
        raise
    finally:
        daemon.close()


# The runtime's fixture comes after ``pods`` in each test's arguments: it DELs every sandbox
# before the pods go, as kubelet does. kuryr-daemon ignores a DEL that comes after the pod's
# KuryrPort is gone, and its OVS port would stay.
def kuryr_runtime(kuryr, cache_dir, timeout=150):
    cni, plugin = kuryr.install_cni()
    # 0.3.1: what kuryr-cni 10.0.0 answers in (it ignores the config's version).
    return Runtime(None, None, cache_dir, cni_version='0.3.1', shim=cni, plugin=plugin,
                   timeout=timeout)


@pytest.fixture
def pod_host(stack):
    """The node's pod namespaces, without our daemon (kuryr-daemon's tests)."""
    host = testhost.Host(prefix=SESSION_PREFIX, bridge=False, netns=stack.netns)
    yield host
    host.close()
