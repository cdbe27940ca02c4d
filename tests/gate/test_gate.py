"""The gate topology on one machine: kubelet's pods, kuryr-controller's ports, OVN's datapath.

kubelet and containerd start pods; the real kuryr-controller creates their
ports in the real Neutron and writes their KuryrPorts; the daemon, started as
the DaemonSet starts it, plugs them into OVN's br-int; once ovn-controller has
installed their flows (ovn-installed) the ADD answers and the pod runs, while
Neutron turns them ACTIVE and kuryr-controller says so in the KuryrPort.
Deleted, the pods are unplugged, their ports go, and nothing is left on
br-int or in the daemon's state.
"""

import ipaddress
import subprocess
import time

from tests import wait
from tests.gate import conftest
from tests.node import checks
from tests.node import kubenode
from tests.openstack import steps
from tests.openstack import tcp

# Each step of a pod's start as it happens, in causal order; ACTIVE (then the KuryrPort's
# active) follows the plug too, unordered with the ADD's answer.
ORDER = ('port created', 'KuryrPort written', 'plugged', 'ovn-installed', 'ADD answered',
         'Running')
ACTIVATION = ('plugged', 'ACTIVE', 'KuryrPort active')
# A pod starts in about 4 s; past the shipped vif_timeout (60 s), its ADD failed.
START_TIMEOUT = 90


def _adds(node):
    return checks.requests(node).get(('ADD', 'success'), 0)


def _start(stack, node, pods, name):
    """Create pod ``name``; every step's time, once kubelet reports it running."""
    before = _adds(node)
    started = time.monotonic()
    pod = pods.create(name)
    at, port_id = steps.observe(stack, pod, started, timeout=START_TIMEOUT, ends={
        'ADD answered': lambda: _adds(node) > before,
        'Running': lambda: pods.running(name) is not None}, wait_for=ACTIVATION)
    for step in steps.STEPS + ('Running',):
        if step in at:
            conftest.record('pod %s: %s' % (name, step), at[step])
    assert set(at) == set(ORDER + ACTIVATION), at
    for order in (ORDER, ACTIVATION):
        times = [at[step] for step in order]
        assert times == sorted(times), at
    return pods.running(name), port_id


def _in(node, pod):
    """A command prefix that runs a command in ``pod``'s network namespace."""
    return ['nsenter', '--target', str(node.container_pid(pod)), '--net', '--']


def test_pods_started_by_kubelet_behind_kuryr_controller_reach_each_other_through_ovn(
        stack, node, pods):
    before = checks.requests(node)
    started = time.monotonic()
    a, port_a = _start(stack, node, pods, 'gate-a')
    b, port_b = _start(stack, node, pods, 'gate-b')

    for pod, port_id in ((a, port_a), (b, port_b)):
        port = stack.port(port_id)
        assert port['status'] == 'ACTIVE'
        assert port['binding:host_id'] == node.name
        assert port['device_id'] == pod['metadata']['uid']
        [address] = [ip['ip_address'] for ip in port['fixed_ips']]
        assert pod['status']['podIP'] == address
        prefix = ipaddress.ip_network(stack.env['POD_CIDR']).prefixlen
        assert node.pod_addresses(pod) == {'%s/%d' % (address, prefix)}
    address_b = stack.port(port_b)['fixed_ips'][0]['ip_address']
    assert node.pod_pings(a, address_b), 'a does not reach b through OVN'
    assert node.pod_pings(b, stack.port(port_a)['fixed_ips'][0]['ip_address'])
    # TCP on the userspace datapath: see tests/openstack/conftest.py.
    for pod in (a, b):
        off = subprocess.run([*_in(node, pod), stack.env['ETHTOOL'], '-K', 'eth0', 'tx', 'off'],
                             capture_output=True, text=True, timeout=30)
        assert off.returncode == 0, off.stderr
    assert tcp.echo(_in(node, b), _in(node, a), address_b) == b'through OVN'
    assert checks.delta(before, checks.requests(node)) == {('ADD', 'success'): 2}

    deleting = time.monotonic()
    pods.delete('gate-a')
    pods.delete('gate-b')
    pods.wait_gone(['gate-a', 'gate-b'])
    # kuryr-controller deletes each port once its pod is gone, then lifts its finalizer.
    for pod, port_id in ((a, port_a), (b, port_b)):
        wait.until(lambda: stack.port(port_id) is None, 60, 'port %s to go' % port_id, 0.1)
        wait.until(lambda: stack.kuryrport(pod['metadata']['name']) is None, 60,
                   'the KuryrPort of %s to go' % pod['metadata']['name'], 0.1)
    conftest.record('both pods deleted: ports and KuryrPorts gone', time.monotonic() - deleting)
    assert stack.br_int_ports() == {}
    assert node.leftovers() == kubenode.NOTHING
    ended = checks.delta(before, checks.requests(node))
    ended.pop(('DEL', 'noop'), None)         # kubelet and containerd repeat their DELs
    assert ended == {('ADD', 'success'): 2, ('DEL', 'success'): 2}, ended
    conftest.record('the scenario (two pods up, traffic, down)', time.monotonic() - started)
