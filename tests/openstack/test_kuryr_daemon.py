"""The real kuryr-daemon 10.0.0 on the tier's node, and the seed's race run against it and us.

kuryr-daemon (``tools/openstack build-kuryr-daemon``) plugs pods behind the
real kuryr-controller and Neutron/OVN through its own ``kuryr-cni``, driven by
the same runtime emulator as our shim. For this module kuryr-controller runs
from kuryr-daemon's build: a 10.0.0 node ran both from one image, and the
os-vif kuryr-controller's own build has writes a port profile (1.4) that
kuryr-daemon's os-vif (3.5) cannot read. Our daemon runs the same scenarios
behind the same controller, so both see the same VIFs.

The race (``doc/source/ownership.rst``): a pod's sandbox A is plugged (its ADD
abandoned by the runtime, as in ``test_sandbox_race``), sandbox B replaces it,
and A's DELs arrive late, with and without A's namespace; in the restart
variant the CNI daemon restarts between B's ADD and A's DELs. What each
daemon leaves of B (its port on br-int, its eth0, its reachability) is
recorded and shown in the run's summary, and asserted: ours keeps B in both
variants; kuryr-daemon keeps B without a restart and, after one, deletes B's
host end (every sandbox of a pod gets the same ``tap<port>`` name, and the
container ID it compares with was kept in memory only).
"""

import concurrent.futures
import dataclasses
import os
import signal

import pytest

from tests import wait
from tests.openstack import conftest
from tests.openstack import steps
from tools.testbed import runtime as testruntime

ABANDON_AFTER = 1       # seconds our shim gives the ADD of the sandbox that is abandoned
REACHABLE_WITHIN = 20   # seconds B gets to answer a ping after the late DELs


@pytest.fixture
def kuryr_cni(kuryr, tmp_path):
    runtime = conftest.kuryr_runtime(kuryr, str(tmp_path / 'kuryr-cni-cache'))
    yield runtime
    runtime.delete_all()


def test_kuryr_daemon_plugs_pods_behind_kuryr_controller(stack, kuryr, pod_host, pods,
                                                         kuryr_cni):
    a = steps.start_pod(stack, pod_host, kuryr_cni, pods)
    b = steps.start_pod(stack, pod_host, kuryr_cni, pods)
    for started in (a, b):
        assert started.outcome.ok, (started.outcome.output, kuryr.log_tail())
        conftest.record('kuryr-daemon 10.0.0 ADD, pod creation to answer',
                        started.at['ADD answered'])
        assert stack.port(started.port_id)['status'] == 'ACTIVE'
    address_b = stack.port(b.port_id)['fixed_ips'][0]['ip_address']
    assert b.outcome.output['ips'][0]['address'].split('/')[0] == address_b
    assert _ping(stack, a.sandbox.netns, address_b)
    assert kuryr_cni.delete(b.sandbox).ok
    assert stack.plugged(b.port_id) is None
    stack.wait_for_status(b.port_id, 'DOWN')
    assert stack.port(a.port_id)['status'] == 'ACTIVE'


# The race, both daemons ------------------------------------------------------------------------

@dataclasses.dataclass
class Kept:
    """What was left of sandbox B after A's late DELs."""
    port_on_br_int: bool
    eth0: bool
    reachable: bool
    late_dels_ok: bool

    def __str__(self):
        return ('B on br-int: %s, eth0: %s, reachable: %s, late DELs answered ok: %s'
                % (self.port_on_br_int, self.eth0, self.reachable, self.late_dels_ok))


def race(stack, node, pods, runtime, abandon, restart):
    """The seed's race with a real port behind the pod, through ``runtime``: ``abandon(a)``
    sends sandbox A's ADD and gives up on it while the daemon goes on, returning the means
    (a runtime) of A's late DELs; ``restart()`` comes between B's ADD and those DELs."""
    peer = steps.start_pod(stack, node, runtime, pods)
    assert peer.outcome.ok, peer.outcome.output
    pod = pods()
    a = steps.sandbox_of(node, pod, 'sandbox-a')
    b = steps.sandbox_of(node, pod, 'sandbox-b')
    runtime.sandboxes.append(a)         # DELed at the end whatever happens
    late = abandon(stack, node, pod, a)
    port_id = stack.wait_for_vif(pod['metadata']['name'])['versioned_object.data']['id']
    stack.wait_for_status(port_id, 'ACTIVE')
    added = runtime.add(b)
    assert added.ok, added.output
    plugged = stack.plugged(port_id)
    assert plugged and 'eth0' in node.links(b.netns)
    if restart:
        restart()
    dels = [late.delete(a, netns=netns).ok for netns in (None, '')]
    address = stack.port(port_id)['fixed_ips'][0]['ip_address']
    return Kept(stack.plugged(port_id) == plugged, 'eth0' in node.links(b.netns),
                _reachable(stack, peer.sandbox.netns, address), all(dels))


def _a_plugged(stack, node, pod, a):
    port_id = stack.wait_for_vif(pod['metadata']['name'])['versioned_object.data']['id']
    wait.until(lambda: stack.plugged(port_id) and 'eth0' in node.links(a.netns), 60,
               'A to be plugged', 0.05)


def _give_up(container_id):
    """Kill the plugin running ADD for ``container_id``, as libcni does when its context
    expires (kuryr-cni has no timeout of its own but a 180 s alarm)."""
    wanted = {b'CNI_COMMAND=ADD', b'CNI_CONTAINERID=' + container_id.encode()}
    killed = 0
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open('/proc/%s/environ' % pid, 'rb') as f:
                if wanted <= set(f.read().split(b'\0')):
                    os.kill(int(pid), signal.SIGKILL)
                    killed += 1
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return killed


@pytest.mark.parametrize('restarted', [False, True], ids=['no-restart', 'restart'])
def test_race_kuryr_daemon(stack, kuryr, pod_host, pods, kuryr_cni, restarted):
    def abandon(stack, node, pod, a):
        # kuryr-cni takes seconds to import os-vif before it asks the daemon anything: the
        # runtime gives up only once the daemon has plugged A (and so goes on with it).
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            add = pool.submit(kuryr_cni.add, a)
            _a_plugged(stack, node, pod, a)
            assert _give_up(a.container_id) == 1
            assert add.result(timeout=30).code == -signal.SIGKILL
        return kuryr_cni

    kept = race(stack, pod_host, pods, kuryr_cni, abandon, kuryr.restart if restarted else None)
    conftest.record('race, kuryr-daemon 10.0.0, %s: %s'
                    % ('restart' if restarted else 'no restart', kept), 0)
    if not restarted:
        # Its in-memory container ID fences the late DELs off while it lives. But B's ADD
        # replaced A's veth by one of the same name (tap<port>) under the same OVS port, and
        # the userspace datapath keeps the device it opened for A's: B never answers.
        assert kept == Kept(True, True, False, True), str(kept)
        assert kuryr.count('Received DEL request for unknown ADD call') == 2
    else:
        # Restarted, it forgot the container ID; the late DEL of A unplugs tap<port>, which
        # is B's: the live pod is cut off, and the DEL answers success.
        assert kept == Kept(False, False, False, True), str(kept)
        assert kuryr.count('Received DEL request for unknown ADD call') == 0


@pytest.mark.parametrize('restarted', [False, True], ids=['no-restart', 'restart'])
def test_race_ours_beside_it(stack, release_controller, node, runtime, pods, tmp_path,
                             restarted):
    impatient = testruntime.Runtime(node.socket, node.state_dir, str(tmp_path / 'cache-a'),
                                    cni_version='1.0.0', shim=runtime.shim,
                                    timeout=ABANDON_AFTER)

    def abandon(stack, node, pod, a):
        # The shim gives up after its timeout, long before the VIF is there.
        abandoned = impatient.add(a)
        assert abandoned.error_code == 11, abandoned.output
        _a_plugged(stack, node, pod, a)
        return impatient

    def restart():
        assert node.stop_daemon() == 0
        node.start_daemon()

    kept = race(stack, node, pods, runtime, abandon, restart if restarted else None)
    conftest.record('race, kuryr-cni (ours), %s: %s'
                    % ('restart' if restarted else 'no restart', kept), 0)
    assert kept == Kept(True, True, True, True), str(kept)


def _ping(stack, netns_path, address):
    proc = stack.run_in(netns_path, 'ping', '-c', '2', '-W', '5', '-q', address)
    return proc.returncode == 0


def _reachable(stack, netns_path, address, within=REACHABLE_WITHIN):
    """Whether ``address`` answers one ping within ``within`` seconds (at the first reply)."""
    proc = stack.run_in(netns_path, 'ping', '-c', '1', '-w', str(within), '-q', address,
                        timeout=within + 10)
    return proc.returncode == 0
