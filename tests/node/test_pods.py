"""Pods on a real node: kubelet and containerd call the shim as a node does."""

import concurrent.futures

from tests.functional import helpers
from tests.node.checks import assert_connected, delta, requests
from tools.testbed import host as testhost


def create_at_once(cluster, pods, names):
    """Create every pod named at the same time (a Deployment scaled up); their objects."""
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        return list(pool.map(pods.create, names, timeout=120))


def test_pods_start_ping_and_leave_nothing(node, controller, pods):
    before = requests(node)
    for name in ('a-1', 'a-2'):
        pods.create(name)
    running = pods.wait_running(['a-1', 'a-2'])
    one, two = running['a-1'], running['a-2']
    assert_connected(node, controller, one, two)
    assert_connected(node, controller, two, one)
    started = delta(before, requests(node))
    assert started == {('ADD', 'success'): 2}, started
    assert helpers.metric(node, 'kuryr_cni_attachments') == 2

    pods.delete('a-1')
    pods.delete('a-2')
    pods.wait_gone(['a-1', 'a-2'])
    ended = delta(before, requests(node))
    # kubelet and containerd send several DELs per sandbox (4 to 5 here: StopPodSandbox
    # with the netns and again without, from kubelet's pod workers and its cleanup): the
    # first unplugs, the others find nothing left to do.
    noop = ended.pop(('DEL', 'noop'), 0)
    assert ended == {('ADD', 'success'): 2, ('DEL', 'success'): 2}, (ended, noop)
    assert helpers.metric(node, 'kuryr_cni_attachments') == 0


def burst(cluster, node, controller, pods, count):
    names = ['burst-%d' % i for i in range(count)]
    before = requests(node)
    create_at_once(cluster, pods, names)
    running = pods.wait_running(names, timeout=60 + 3 * count)
    addresses = {controller.port(pod).ip for pod in running.values()}
    assert len(addresses) == count
    for name, pod in running.items():
        assert node.pod_addresses(pod) == {controller.port(pod).ip + '/24'}, name
        assert node.pod_pings(pod, testhost.GATEWAY), name
    # Every pod reaches another: the first one, and the first one the last.
    first, last = running[names[0]], running[names[-1]]
    for name, pod in running.items():
        assert node.pod_pings(pod, controller.port(first).ip), name
    assert node.pod_pings(first, controller.port(last).ip)
    sent = delta(before, requests(node))
    # Besides: maybe DELs of earlier tests' sandboxes, which kubelet's cleanup sends
    # whenever it runs, and which find nothing. No ADD failed, none was retried.
    sent.pop(('DEL', 'noop'), None)
    assert sent == {('ADD', 'success'): count}, sent


def test_a_burst_of_30_pods(cluster, node, controller, pods):
    burst(cluster, node, controller, pods, 30)


def test_a_burst_of_110_pods_kubelets_maximum(cluster, node, controller, pods):
    burst(cluster, node, controller, pods, 110)
