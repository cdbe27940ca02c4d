"""The daemon and kubelet restarted, or the daemon killed, while pods run, go and start."""

import os
import re
import signal
import time

import pytest

from tests import pace
from tests import wait
from tests.functional import helpers
from tests.node.checks import assert_connected, delta, host_sandboxes, requests

# recovery.replay_queue's line for each queued DEL it applied.
REPLAYED = re.compile(r'Replayed queued DEL (\S+) for (\S+): (\w+)')


def _wait_queue_replayed(node):
    """The DEL queue emptied. A DEL of a sandbox with a binding is replayed before the
    socket opens; one without (kubelet's DELs of earlier tests' sandboxes, or the
    owner's second DEL) waits for the pods' list, which alone could prove kuryr-daemon's
    devices of it, and is applied by housekeeping's next round (every 2 s) after it."""
    wait.until(lambda: node.queued_dels() == [], 60, 'the DEL queue to be replayed')


def test_the_daemon_restarted_while_pods_run_and_go(node, controller, pods):
    """Stopped cleanly (SIGTERM), as a DaemonSet update does, while kubelet deletes a pod:
    the running pods keep their network, the deleted pod's DELs are queued by the shim
    and replayed by the new daemon before it serves, and nothing of that pod is left."""
    running = pods.wait_running([pods.create(n)['metadata']['name']
                                 for n in ('r-1', 'r-2', 'r-3')])
    sandboxes = {name: node.sandbox_id(pod) for name, pod in running.items()}
    assert node.stop_daemon(signal.SIGTERM) == 0
    # Without the daemon the pods keep their network: it lives in the kernel.
    assert_connected(node, controller, running['r-1'], running['r-2'])
    pods.delete('r-3')
    pods.wait_gone(['r-3'])
    queued = node.queued_dels()
    # kubelet may meanwhile send DELs of earlier tests' sandboxes too (its cleanup of
    # pods gone): the shim queues them as well, and they are replayed as no-ops.
    of_r3 = [sent for sent in node.queued_del_bodies(queued)
             if 'K8S_POD_NAME=r-3' in sent['CNI_ARGS'].split(';')]
    assert {(sent['CNI_COMMAND'], sent['CNI_CONTAINERID']) for sent in of_r3} == {
        ('DEL', sandboxes['r-3'])}
    # Its host device went with its namespace; its binding waits for the DELs.
    assert helpers.binding(node, 'default/r-3')['owner'] == sandboxes['r-3']

    log_start = len(node.daemon_log())
    node.start_daemon()
    _wait_queue_replayed(node)
    # Replayed (a DEL kubelet sent after the snapshot above is one more): the first
    # unplugged r-3, the others found nothing left.
    replayed = REPLAYED.findall(node.daemon_log()[log_start:])
    assert set(queued) <= {os.path.basename(path) for path, _, _ in replayed}, replayed
    outcomes = sorted(outcome for _, cid, outcome in replayed if cid == sandboxes['r-3'])
    assert len(outcomes) >= len(of_r3), replayed
    assert outcomes == ['noop'] * (len(outcomes) - 1) + ['success'], replayed
    assert {outcome for _, cid, outcome in replayed if cid != sandboxes['r-3']} <= {'noop'}
    assert helpers.metric(node, 'kuryr_cni_queued_del_replayed_total') == len(replayed)
    assert host_sandboxes(node) == {sandboxes['r-1'], sandboxes['r-2']}
    assert helpers.binding(node, 'default/r-3') is None
    assert helpers.metric(node, 'kuryr_cni_attachments') == 2
    before = requests(node)
    assert_connected(node, controller, running['r-1'], running['r-2'])
    assert_connected(node, controller, running['r-2'], running['r-1'])
    assert delta(before, requests(node)) == {}


def test_the_daemon_killed_while_kubelet_deletes_a_pod(node, controller, pods):
    running = pods.wait_running([pods.create(n)['metadata']['name'] for n in ('k-1', 'k-2')])
    sandbox = node.sandbox_id(running['k-1'])
    os.killpg(node.daemon.pid, signal.SIGKILL)
    node.daemon.wait(30)
    pods.delete('k-1')
    pods.wait_gone(['k-1'])
    # kubelet's DELs of k-1's sandbox could not be delivered: the shim queued them and
    # answered success, so kubelet let the pod go.
    queued = node.queued_dels()
    # What kubelet and containerd sent, as the shim kept it: DELs of k-1's sandbox, each
    # naming the pod and its UID (and maybe DELs of earlier tests' sandboxes).
    of_k1 = [sent for sent in node.queued_del_bodies(queued)
             if 'K8S_POD_NAME=k-1' in sent['CNI_ARGS'].split(';')]
    assert of_k1
    for sent in of_k1:
        assert (sent['CNI_COMMAND'], sent['CNI_CONTAINERID']) == ('DEL', sandbox)
        assert dict(pair.split('=', 1) for pair in sent['CNI_ARGS'].split(';')) == {
            'IgnoreUnknown': '1', 'K8S_POD_NAMESPACE': 'default', 'K8S_POD_NAME': 'k-1',
            'K8S_POD_INFRA_CONTAINER_ID': sandbox, 'K8S_POD_UID': running['k-1']['metadata']['uid']}
    assert_connected(node, controller, running['k-2'])

    node.start_daemon()
    _wait_queue_replayed(node)
    assert helpers.metric(node, 'kuryr_cni_queued_del_replayed_total') >= len(queued)
    assert helpers.metric(node, 'kuryr_cni_attachments') == 1
    assert helpers.binding(node, 'default/k-1') is None
    assert_connected(node, controller, running['k-2'])


def test_kubelet_restarted_while_pods_run(node, controller, pods):
    running = pods.wait_running([pods.create(n)['metadata']['name'] for n in ('u-1', 'u-2')])
    sandboxes = {name: node.sandbox_id(pod) for name, pod in running.items()}
    before = requests(node)
    node.stop_kubelet()
    node.start_kubelet()
    node.wait_ready_node()
    # kubelet finds its pods running (its status sync writes them again) and leaves them.
    pods.wait_running(sandboxes, timeout=60)
    for name in sandboxes:
        pod = pods.running(name)
        assert node.sandbox_id(pod) == sandboxes[name]
    assert_connected(node, controller, pods.running('u-1'), pods.running('u-2'))
    # Nothing for these pods (a DEL of theirs would unplug: success). A restarted kubelet
    # cleans up at once what earlier tests left in containerd: DELs that find nothing.
    sent = delta(before, requests(node))
    sent.pop(('DEL', 'noop'), None)
    assert sent == {}, sent


def _replace(node):
    """A DaemonSet-style replace: the next daemon started as the old one is told to stop."""
    old = node.daemon
    os.kill(old.pid, signal.SIGTERM)
    node.start_daemon()
    assert old.wait(60) == 0


def _kill(node):
    """A crash of the whole daemon, its supervisor starting the next."""
    os.killpg(node.daemon.pid, signal.SIGKILL)
    node.daemon.wait(30)
    node.start_daemon()


RESTART_RATE = 10       # pods created a second across the restart
RESTART_PODS = 60       # at most


@pytest.mark.parametrize('restart', [_replace, _kill], ids=['replace', 'kill'])
def test_no_pod_start_fails_while_the_daemon_restarts(cluster, node, pods, restart):
    """Pods created at 10 a second across a restart: all run, and kubelet records no
    FailedCreatePodSandBox (the shim waited for the next daemon)."""
    prefix = 's-%s-' % restart.__name__.strip('_')
    names = ['%s%d' % (prefix, i) for i in range(RESTART_PODS)]
    with pace.Stream(pods.create, names, RESTART_RATE) as created:
        created.wait_sent(RESTART_RATE)     # a second of pods before the restart
        down = time.monotonic()
        restart(node)
        up = time.monotonic()
        created.wait_sent(created.wait_sent(0) + RESTART_RATE)
    made = [c.outcome['metadata']['name'] for c in created.calls]
    pods.wait_running(made, timeout=240)
    failures = [(event['involvedObject']['name'], event['message'])
                for event in cluster.events()
                if event['reason'] == 'FailedCreatePodSandBox'
                and event['involvedObject']['name'].startswith(prefix)]
    assert failures == []
    sent_during = [c for c in created.calls if down <= c.started <= up]
    assert sent_during      # or the restart met no pod start
    print('\n%s: %d pods, %d created during the %.2f s restart, 0 FailedCreatePodSandBox'
          % (restart.__name__, len(made), len(sent_during), up - down))
