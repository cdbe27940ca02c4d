"""The race this project exists for (DESIGN §1), with a real port behind the pod.

ADD A is abandoned by its runtime (the shim gives up long before
kuryr-controller and Neutron are done) and completes in the daemon anyway;
ADD B of the same pod follows, and DELs of A arrive late, with and without
A's namespace. Pod B keeps its interface and its port on br-int, Neutron
keeps the port ACTIVE, and B stays reachable.
"""

from tests import wait
from tests.openstack import steps
from tools.testbed import runtime as testruntime


def test_late_dels_of_an_abandoned_sandbox_leave_the_new_one_connected(stack, node, runtime,
                                                                       pods, tmp_path):
    peer = steps.start_pod(stack, node, runtime, pods)
    assert peer.outcome.ok, peer.outcome.output
    pod = pods()
    a = steps.sandbox_of(node, pod, 'sandbox-a')
    b = steps.sandbox_of(node, pod, 'sandbox-b')
    runtime.sandboxes.append(a)         # DELed at the end whatever happens
    impatient = testruntime.Runtime(node.socket, node.state_dir, str(tmp_path / 'cache-a'),
                                    cni_version='1.0.0', shim=runtime.shim, timeout=1)
    abandoned = impatient.add(a)
    assert abandoned.error_code == 11, abandoned.output
    # The daemon went on with A: plugged it, and Neutron and kuryr-controller saw it.
    port_id = stack.wait_for_vif(pod['metadata']['name'])['versioned_object.data']['id']
    wait.until(lambda: stack.br_int_ports().get(stack.plugged(port_id) or '', {})
               .get('container-id') == a.container_id, 30, 'A to be plugged', 0.05)
    stack.wait_for_status(port_id, 'ACTIVE')
    added = runtime.add(b)
    assert added.ok, (added.output, node.log_tail())
    plugged = stack.plugged(port_id)
    assert stack.br_int_ports()[plugged]['container-id'] == b.container_id
    stack.wait_for_status(port_id, 'ACTIVE')
    for netns in (None, ''):        # the late DEL, then the runtime's second one without netns
        assert impatient.delete(a, netns=netns).ok
    assert stack.plugged(port_id) == plugged
    assert 'eth0' in node.links(b.netns)
    address = stack.port(port_id)['fixed_ips'][0]['ip_address']
    assert node.ping(peer.sandbox.netns, address, count=2, wait=5)
    assert stack.port(port_id)['status'] == 'ACTIVE'
