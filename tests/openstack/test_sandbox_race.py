"""The race this project exists for (DESIGN §1), with a real port behind the pod.

ADD A is abandoned by its runtime (the shim gives up before kuryr-controller
and Neutron are done), ADD B of the same pod succeeds, and DELs of A arrive
late, with and without A's namespace. Pod B keeps its interface and its
port on br-int, Neutron keeps the port ACTIVE, and B stays reachable.
"""

from tests.openstack import steps
from tools.testbed import runtime as testruntime


def test_late_dels_of_an_abandoned_sandbox_leave_the_new_one_connected(stack, node, runtime,
                                                                       pods, tmp_path):
    peer = steps.start_pod(stack, node, runtime, pods)
    assert peer.outcome.ok, peer.outcome.output
    pod = pods()
    a = steps.sandbox_of(node, pod, 'sandbox-a')
    b = steps.sandbox_of(node, pod, 'sandbox-b')
    impatient = testruntime.Runtime(node.socket, node.state_dir, str(tmp_path / 'cache-a'),
                                    cni_version='1.0.0', shim=runtime.shim, timeout=1)
    abandoned = impatient.add(a)
    assert abandoned.error_code == 11, abandoned.output
    added = runtime.add(b)
    assert added.ok, (added.output, node.log_tail())
    [port] = stack.ports_of(pod['metadata']['uid'])
    plugged = stack.plugged(port['id'])
    assert plugged is not None
    for netns in (None, ''):        # the late DEL, then the runtime's second one without netns
        assert impatient.delete(a, netns=netns).ok
    assert stack.plugged(port['id']) == plugged
    assert 'eth0' in node.links(b.netns)
    assert stack.port(port['id'])['status'] == 'ACTIVE'
    address = port['fixed_ips'][0]['ip_address']
    assert node.ping(peer.sandbox.netns, address, count=2, wait=5)
    assert stack.port(port['id'])['status'] == 'ACTIVE'
