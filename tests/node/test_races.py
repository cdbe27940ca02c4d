"""The races kubelet and containerd really make: late VIFs, re-created pods, dead sandboxes.

Each test lets kubelet do what it does and asserts the outcome in the pods
(address, pings) and in the daemon's metrics, never the order of requests,
which belongs to kubelet.
"""

import os
import signal

from tests import wait
from tests.functional import helpers
from tests.node.checks import assert_connected, delta, host_sandboxes, requests


def test_a_vif_that_comes_late(cluster, node, controller, pods):
    """The seed's race by its real author: the first ADD fails, containerd sends DEL,
    kubelet retries with a new sandbox, and the VIF arrives meanwhile."""
    before = requests(node)
    controller.hold('late')
    pods.create('late')
    # The shipped vif_timeout (60 s) passes, the ADD fails, and containerd tears the
    # sandbox down (DEL) within its RunPodSandbox; kubelet retries ~10 s later.
    wait.until(lambda: requests(node).get(('ADD', 'error'), 0)
               > before.get(('ADD', 'error'), 0), 100, 'the first ADD to fail', interval=0.5)
    controller.release('late')
    pod = pods.wait_running(['late'], timeout=120)['late']
    assert_connected(node, controller, pod)
    sent = delta(before, requests(node))
    assert sent.pop(('ADD', 'success')) == 1, sent
    assert sent.pop(('ADD', 'error')) >= 1, sent
    # containerd's DELs of the failed sandbox (sent within its RunPodSandbox, before
    # kubelet retries) found nothing: a failed ADD leaves nothing behind.
    assert sent.pop(('DEL', 'noop')) >= 1, sent
    assert sent == {}, sent
    sandbox = node.sandbox_id(pod)
    binding = helpers.binding(node, 'default/late')
    assert (binding['owner'], list(binding['sandboxes'])) == (sandbox, [sandbox]), binding
    assert host_sandboxes(node) == {sandbox}
    assert_connected(node, controller, pod)


def test_a_pod_re_created_under_its_name(cluster, node, controller, pods):
    """StatefulSet style: the pod force-deleted and re-created at once.

    kubelet stops the old incarnation with the shortest grace period it knows (2 s; its
    `sleep`, PID 1, ignores SIGTERM and takes all of it), and starts the new one meanwhile.
    The new incarnation's ADD takes the pod over and removes the old sandbox's devices:
    the old incarnation has no network for the rest of its grace period. The old
    sandbox's DELs, sent when kubelet stops it (twice, at once) and again by its garbage
    collection a minute later, carry the old UID: rejected and counted, and the new pod
    keeps its network.
    """
    old = pods.wait_running([pods.create('again')['metadata']['name']])['again']
    old_port = controller.port(old)
    stale_before = helpers.stale_dels(node)
    evictions_before = helpers.metric(node, 'kuryr_cni_sandbox_evictions_total')
    before = requests(node)
    pods.delete('again', grace=0)
    new = pods.create('again')
    assert new['metadata']['uid'] != old['metadata']['uid']
    new = pods.wait_running_as('again', 'the new incarnation to run', 60,
                               uid=new['metadata']['uid'])
    assert controller.port(new).ip != old_port.ip
    assert_connected(node, controller, new)
    # The new ADD removed the old incarnation's devices.
    assert helpers.metric(node, 'kuryr_cni_sandbox_evictions_total') == evictions_before + 1

    # Within a minute and a half: the garbage collection's pair comes by then anyway.
    try:
        wait.until(lambda: helpers.stale_dels(node)['pod_uid_mismatch']
                   >= stale_before['pod_uid_mismatch'] + 2, 90, 'the old sandbox\'s DELs',
                   interval=0.2)
    finally:
        sent = delta(before, requests(node))
    assert sent[('ADD', 'success')] == 1, sent
    assert sent[('DEL', 'stale')] >= 2, sent
    # Besides: maybe DELs of earlier tests' sandboxes, which kubelet's cleanup sends
    # whenever it runs, and which find nothing (noop).
    assert set(sent) - {('DEL', 'noop')} == {('ADD', 'success'), ('DEL', 'stale')}, sent
    assert helpers.binding(node, 'default/again')['owner'] == node.sandbox_id(new)
    assert_connected(node, controller, new)


def test_a_sandbox_that_dies(cluster, node, controller, pods):
    """The pause process is killed: kubelet sends DEL for the dead sandbox and ADD for a
    new one; the pod is reconnected, with its address, and the dead sandbox's devices
    are gone.

    Killed twice, so that kubelet removes the first sandbox while the pod runs: it keeps
    the newest dead container of each container, and removes a dead sandbox only once it
    holds no container (seen 2 s after the third sandbox's ADD). The first sandbox's DELs,
    with the pod's own UID, come after the third sandbox took the pod over: the seed's
    late DEL, by its real author. They are rejected and counted, and the pod keeps its
    network.
    """
    pod = pods.wait_running([pods.create('phoenix')['metadata']['name']])['phoenix']
    first = node.sandbox_id(pod)
    stale_before = helpers.stale_dels(node)
    before = requests(node)
    second, pod = kill_sandbox(node, pods, pod)
    assert_connected(node, controller, pod)
    assert host_sandboxes(node) == {second}
    third, pod = kill_sandbox(node, pods, pod)
    assert_connected(node, controller, pod)
    assert host_sandboxes(node) == {third}
    sent = delta(before, requests(node))
    assert sent[('ADD', 'success')] == 2, sent
    assert sent.get(('DEL', 'success'), 0) >= 2, sent
    assert helpers.binding(node, 'default/phoenix')['owner'] == third

    # kubelet stops a sandbox (the DELs) before it removes it from containerd.
    wait.until(lambda: first not in node.containers(), 150,
               'kubelet to remove sandbox %s' % first, interval=1)
    assert_connected(node, controller, pod)
    assert host_sandboxes(node) == {third}
    assert helpers.binding(node, 'default/phoenix')['owner'] == third
    sent = delta(before, requests(node))
    assert sent[('ADD', 'success')] == 2, sent
    rejected = [entry for entry in node.stale_dels() if entry['pod'] == 'default/phoenix']
    assert {entry['container_id'] for entry in rejected} >= {first}, rejected
    assert {(entry['owner'], entry['reason']) for entry in rejected} == {
        (third, 'container_id_mismatch')}, rejected
    assert sent[('DEL', 'stale')] == len(rejected), (sent, rejected)
    assert helpers.stale_dels(node)['container_id_mismatch'] == \
        stale_before['container_id_mismatch'] + len(rejected)


def kill_sandbox(node, pods, pod):
    """Kill ``pod``'s pause process; the new sandbox's ID and the pod once it runs there."""
    dead = node.sandbox_id(pod)
    os.kill(node.sandbox_pid(pod), signal.SIGKILL)
    name = pod['metadata']['name']
    pod = pods.wait_running_as(name, 'a new sandbox of %s' % name, 90,
                               judge=lambda pod: node.sandbox_id(pod) not in (None, dead))
    return node.sandbox_id(pod), pod
