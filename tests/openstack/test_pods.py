"""Pods behind the real kuryr-controller and Neutron: ADD, traffic through OVN, DEL."""

import ipaddress

from tests import wait
from tests.openstack import conftest
from tests.openstack import steps
from tests.openstack import tcp


def _started(stack, node, runtime, pods, wait_for=()):
    started = steps.start_pod(stack, node, runtime, pods, wait_for)
    assert started.outcome.ok, (started.outcome.output, node.log_tail())
    for step in steps.STEPS:
        if step in started.at:
            conftest.record('pod %s: %s' % (started.name, step), started.at[step])
    return started


def test_add_plugs_into_br_int_and_answers_once_ovn_installed_its_flows(
        stack, node, runtime, pods):
    started = _started(stack, node, runtime, pods, wait_for=steps.STEPS[:-1])
    at = started.at
    # Each part did its step, in causal order: nothing was installed by OVN or turned
    # ACTIVE before the daemon plugged, and the ADD answered only once OVN had installed
    # the port's flows (ready_signal = first; ACTIVE reaches the KuryrPort later).
    assert set(at) == set(steps.STEPS), at
    assert at['port created'] <= at['KuryrPort written'] <= at['plugged'] \
        <= at['ovn-installed'] <= at['ADD answered'], at
    assert at['plugged'] <= at['ACTIVE'] <= at['KuryrPort active'], at
    port = stack.port(started.port_id)
    assert port['status'] == 'ACTIVE'
    assert port['binding:host_id'] == stack.node
    assert port['device_id'] == started.pod['metadata']['uid']
    # The result is the port's: its MAC, its address on the pod's interface.
    [address] = [ip['ip_address'] for ip in port['fixed_ips']]
    [ip] = started.outcome.output['ips']
    assert ipaddress.ip_interface(ip['address']).ip == ipaddress.ip_address(address)
    assert node.addresses(started.sandbox.netns, 'eth0') == {ip['address']}
    [interface] = [i for i in started.outcome.output['interfaces'] if i.get('sandbox')]
    assert interface['mac'] == port['mac_address']
    # OVN bound the port to this node's chassis.
    assert stack.sbctl('--bare', '--columns=chassis', 'find', 'Port_Binding',
                       'logical_port=' + started.port_id).strip()


def test_two_pods_reach_each_other_through_ovn(stack, node, runtime, pods):
    a = _started(stack, node, runtime, pods)
    b = _started(stack, node, runtime, pods)
    address_b = stack.port(b.port_id)['fixed_ips'][0]['ip_address']
    assert node.ping(a.sandbox.netns, address_b, count=3, wait=5)
    for pod in (a, b):
        stack.checksum_offload_off(pod.sandbox.netns)
    assert tcp.echo(_in(b), _in(a), address_b) == b'through OVN'


def _in(pod):
    return ['ip', 'netns', 'exec', pod.sandbox.netns.rsplit('/', 1)[1]]


def test_deleted_pod_leaves_nothing_behind(stack, node, runtime, pods):
    # Deleted once kuryr-controller has seen it ACTIVE: a port unplugged before holds up
    # its own deletion behind kuryr-controller's activation retries (see conftest.pods).
    started = _started(stack, node, runtime, pods, wait_for=('KuryrPort active',))
    assert runtime.delete(started.sandbox).ok
    assert stack.plugged(started.port_id) is None
    stack.wait_for_status(started.port_id, 'DOWN')
    stack.delete_pod(started.name)
    # kuryr-controller deletes the port, then lifts its finalizers: the KuryrPort and the
    # pod go only once the port is gone, in either order.
    wait.until(lambda: stack.pod(started.name) is None
               and stack.kuryrport(started.name) is None,
               60, 'the pod and its KuryrPort to be gone', 0.1)
    assert stack.port(started.port_id) is None
    assert stack.br_int_ports() == {}
    assert runtime.delete(started.sandbox).ok        # the runtime's repeated DEL
