"""Restarts and failures: the daemon, kuryr-controller, and a port that never turns ACTIVE."""

import concurrent.futures
import time

import pytest

from tests.openstack import steps


def test_daemon_restarted_while_pods_run(stack, node, runtime, pods):
    a = steps.start_pod(stack, node, runtime, pods)
    b = steps.start_pod(stack, node, runtime, pods)
    assert a.outcome.ok and b.outcome.ok, (a.outcome.output, b.outcome.output)
    address_b = stack.port(b.port_id)['fixed_ips'][0]['ip_address']
    assert node.stop_daemon() == 0
    assert node.ping(a.sandbox.netns, address_b, count=2, wait=5)     # not in the datapath
    node.start_daemon()
    assert runtime.check(a.sandbox).ok
    assert runtime.check(b.sandbox).ok
    assert node.ping(a.sandbox.netns, address_b, count=2, wait=5)
    assert runtime.delete(b.sandbox).ok
    assert stack.plugged(b.port_id) is None
    stack.wait_for_status(b.port_id, 'DOWN')
    assert stack.port(a.port_id)['status'] == 'ACTIVE'


@pytest.mark.parametrize('ready_signal', ['first', 'active'])
def test_kuryr_controller_restarted_while_a_pod_is_created(
        stack, node, runtime, pods, ready_signal):
    node.stop_daemon()
    node.start_daemon(extra='\n[cni_daemon]\nready_signal = %s\n' % ready_signal)
    pod = pods()
    vif = stack.wait_for_vif(pod['metadata']['name'])
    port_id = vif['versioned_object.data']['id']
    # kuryr-controller is gone before it could see the port ACTIVE: the ADD plugs, Neutron
    # turns the port ACTIVE, and only the restarted controller can tell the daemon; OVN's
    # ovn-installed tells it on the node.
    stack.stop('kuryr-controller')
    sandbox = steps.sandbox_of(node, pod)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        add = pool.submit(runtime.add, sandbox)
        stack.wait_for_status(port_id, 'ACTIVE')
        if ready_signal == 'first':
            outcome = add.result(timeout=60)
            assert outcome.ok, (outcome.output, node.log_tail())
        else:
            assert not add.done()
        stack.start()
        outcome = add.result(timeout=120)
    assert outcome.ok, (outcome.output, node.log_tail())
    assert [p['id'] for p in stack.ports_of(pod['metadata']['uid'])] == [port_id]


def test_a_port_that_never_turns_active_fails_the_add_in_time(stack, node, runtime, pods):
    vif_timeout = 10
    node.stop_daemon()
    node.start_daemon(vif_timeout=vif_timeout)
    # The node's ovn-controller goes: Neutron still binds ports to the node's chassis (its
    # record stays), but nothing on the node claims them, so none ever turns ACTIVE.
    stack.stop('ovn-controller')
    try:
        pod = pods()
        # The KuryrPort first: on a loaded machine kuryr-controller may take longer than
        # vif_timeout to write it, and the ADD would time out on that instead.
        port_id = stack.wait_for_vif(pod['metadata']['name'])['versioned_object.data']['id']
        sandbox = steps.sandbox_of(node, pod)
        started = time.monotonic()
        outcome = runtime.add(sandbox)
        took = time.monotonic() - started
        assert outcome.error_code == 11, outcome.output
        assert took < vif_timeout + 5, took
        assert stack.port(port_id)['status'] == 'DOWN'
        reasons = {e['reason'] for e in stack.events()
                   if e['involvedObject'].get('uid') == pod['metadata']['uid']}
        assert {'CNIWaitingForActiveVIFs', 'CNITimedOutWaitingForActiveVIFs'} <= reasons, \
            (reasons, outcome.output, node.log_tail())
        assert runtime.delete(sandbox).ok
        assert stack.plugged(port_id) is None
    finally:
        stack.start()
    # ovn-controller is back: the runtime's next sandbox gets the port.
    node.stop_daemon()
    node.start_daemon()
    retried = steps.sandbox_of(node, pod, 'sandbox-%s-2' % pod['metadata']['name'])
    outcome = runtime.add(retried)
    assert outcome.ok, (outcome.output, node.log_tail())
    stack.wait_for_status(port_id, 'ACTIVE')
