"""The list+watch against a real kube-apiserver: restarts, compaction, 410.

kube-apiserver 1.20 serves watches from its watch cache, which a restart
starts anew at etcd's current revision: a watch resumes from a version at
least that recent, an older one gets 410 Gone, whatever etcd still holds. A
server without the watch cache serves watches from etcd, which answers 410
only for versions compacted away. Both are exercised here.
"""

import datetime
import http.client
import json
import re
import ssl
import time

import pytest

from kuryr_cni import vifsource
from tests import wait
from tests.functional import crash
from tests.functional import helpers
from tests.k8s import cluster as k8s
from tests.k8s import conftest
from tools.testbed import apiserver
from tools.testbed import host as testhost


def ready(node):
    return crash.health(node, 'ready')[0] == 200


def pod_requests(cluster, since):
    return [(r['verb'], k8s.query(r).get('resourceVersion'))
            for r in cluster.daemon_requests(since, resource='pods')]


def test_after_a_restart_the_watch_resumes_and_an_add_works(cluster, node, runtime):
    node.start_daemon(vif_timeout=60)
    first = cluster.create_pod('default', 'before-1', node.name, testhost.Host.vifs(5))
    wait.until(lambda: helpers.metric(node, 'kuryr_cni_watch_events_total',
                                      type='ADDED') == 1, 20, 'the pod to be seen')
    # Nothing else is written meanwhile: the restarted watch cache starts at this version.
    last = first['metadata']['resourceVersion']
    since = cluster.audit_offset()

    cluster.stop()
    wait.until(lambda: not ready(node), 30, '/ready to fail while the server is down')
    cluster.start()
    pod = cluster.create_pod('default', 'after-1', node.name, testhost.Host.vifs(6))
    outcome = runtime.add(node.sandbox(pod))
    assert outcome.ok, outcome
    wait.until(lambda: ready(node), 30, '/ready to pass again')

    requests = pod_requests(cluster, since)
    assert requests[0] == ('watch', last)             # resumed from the last version seen
    assert [verb for verb, _ in requests] == ['watch'] * len(requests)   # and no relist
    assert helpers.metric(node, 'kuryr_cni_watch_restarts_total', reason='expired') == 0
    # kube-apiserver 1.20 is ready before its RBAC authorizer has read the roles: for a
    # moment it refuses the resume (403), which is retried from the start of the backoff.
    refused = cluster.refused(since)
    assert all(k8s.query_of(uri)['resourceVersion'] == last for uri in refused), refused
    assert 'cannot watch resource "pods"' in node.daemon_log() or not refused


# listwatch's warning for each failure, with the backoff that follows it.
BACKOFF = re.compile(r'^(\S+ \S+) \d+ WARNING kuryr_cni\.listwatch .*?; retrying in ([\d.]+) s',
                     re.MULTILINE)
LONGEST_BACKOFF = 15        # seconds: the least of the last tier (backoff_max 30, halved)


def backoffs(log):
    """``[(wall-clock end, seconds)]`` of each backoff the watcher logged."""
    return [(datetime.datetime.strptime(at, '%Y-%m-%d %H:%M:%S.%f').timestamp()
             + float(delay), float(delay)) for at, delay in BACKOFF.findall(log)]


def test_after_an_outage_an_add_for_a_new_pod_cuts_the_watchers_backoff_short(
        cluster, node, runtime):
    """kube-apiserver stopped and started again, the node's link to it down meanwhile
    and until the watcher begins a backoff of 15-30 s (~25 s of outage or more; the
    link makes the server's return, for the node, an instant of the test's choosing).
    A pod created as soon as the server answers the node again is ADDed well before
    that backoff ends: the ADD waiting for it makes the watcher retry early."""
    node.start_daemon(vif_timeout=60)
    log_start = len(node.daemon_log())
    cluster.stop()
    # Down once the watcher saw the server go (its stream ended), or it would wait on.
    wait.until(lambda: backoffs(node.daemon_log()[log_start:]), 30, 'the first failure')
    testhost.ip('-n', node.ns, 'link', 'set', k8s.NODE_LINK, 'down')
    try:
        cluster.start()
        before = len(backoffs(node.daemon_log()[log_start:]))
        ends, delay = wait.until(
            lambda: next((b for b in backoffs(node.daemon_log()[log_start:])[before:]
                          if b[1] >= LONGEST_BACKOFF), None),
            120, 'a backoff of the longest kind')
    finally:
        testhost.ip('-n', node.ns, 'link', 'set', k8s.NODE_LINK, 'up')
    answering = time.time()
    pod = cluster.create_pod('default', 'after-outage', node.name, testhost.Host.vifs(7))
    log_at_create = len(node.daemon_log())
    outcome = runtime.add(node.sandbox(pod))
    added = time.time()
    assert outcome.ok, outcome
    # Long before the backoff under way would have ended: the watcher retried early.
    assert added < ends, (added, ends)
    assert 'retrying the API server' in node.daemon_log()[log_at_create:]
    print('\nADDed %.2f s after the server answered the node again, %.1f s before the '
          '%.1f s backoff would have ended' % (added - answering, ends - added, delay))


def test_after_a_restart_an_expired_version_relists_once_from_the_cache(cluster, node):
    node.start_daemon()
    seen = cluster.create_pod('default', 'seen-1', node.name, testhost.Host.vifs(5))
    wait.until(lambda: helpers.metric(node, 'kuryr_cni_watch_events_total',
                                      type='ADDED') == 1, 20, 'the pod to be seen')
    cluster.create_pod('default', 'moved-on-1', 'node-elsewhere')    # the version moves on
    since = cluster.audit_offset()

    cluster.restart()
    wait.until(lambda: [r for r in pod_requests(cluster, since) if r[0] == 'list'],
               30, 'the relist')
    wait.until(lambda: pod_requests(cluster, since)[-1][0] == 'watch', 30,
               'the watch after it')
    wait.until(lambda: ready(node), 30, '/ready to pass again')
    requests = pod_requests(cluster, since)
    version = seen['metadata']['resourceVersion']
    # Resumes from the version seen (the first may meet the RBAC warm-up's 403), a 410,
    # one list not older than what was seen (from the watch cache), a watch from there.
    resumes, relist, watch = requests[:-2], requests[-2], requests[-1]
    assert resumes and set(resumes) == {('watch', version)}, requests
    assert relist == ('list', version) and watch[0] == 'watch', requests
    assert helpers.metric(node, 'kuryr_cni_watch_restarts_total', reason='expired') == 1


@pytest.fixture(scope='module')
def etcd_served():
    """A second server, whose watches etcd serves (no watch cache)."""
    conftest._unavailable()
    server = k8s.Cluster(conftest.SESSION_PREFIX, extra_flags=['--watch-cache=false'])
    try:
        server.apply_daemonset_rbac()
        yield server
    finally:
        server.close()


def test_a_compaction_past_its_version_relists_exactly_once(etcd_served):
    cluster = etcd_served
    node = conftest.Node(cluster)
    try:
        since = cluster.audit_offset()
        node.start_daemon(extra='\n[kubernetes]\nwatch_timeout = 10\n')
        wait.until(lambda: pod_requests(cluster, since)[-1:] == [('watch', None)]
                   or len(pod_requests(cluster, since)) >= 2, 20, 'the first watch')
        for index in range(3):       # other nodes' pods: the daemon's version stays behind
            cluster.create_pod('default', 'elsewhere-%d' % index, 'node-elsewhere')
        compacted = cluster.compact()

        # The watch ends at its timeout; resuming from a compacted version gets 410.
        wait.until(lambda: helpers.metric(node, 'kuryr_cni_watch_restarts_total',
                                          reason='expired') == 1, 40, 'the relist')
        wait.until(lambda: pod_requests(cluster, since)[-1][0] == 'watch', 30,
                   'the watch after it')
        requests = pod_requests(cluster, since)
        assert [verb for verb, _ in requests].count('list') == 2, requests   # start + one
        assert int(requests[-1][1]) >= compacted
        assert 'expired' in node.daemon_log()
        assert ready(node)
        assert cluster.refused(since) == []
    finally:
        node.close()


POISON_BYTES = 1400 * 1024     # a pod this large still fits etcd's 1.5 MiB


def test_the_real_server_sends_live_pods_metadata_alone_so_a_poison_pod_is_harmless(
        cluster, node, runtime):
    """kube-apiserver 1.20 honours what the watch asks: metadata alone, not terminated."""
    node.start_daemon(vif_timeout=20)
    cluster.create_pod('default', 'finished-1', node.name)
    wait.until(lambda: helpers.metric(node, 'kuryr_cni_watch_events_total',
                                      type='ADDED') == 1, 20, 'the pod to be seen')
    received = node.counters()[0]
    poison = {'apiVersion': 'v1', 'kind': 'Pod',
              'metadata': {'name': 'commas-1', 'namespace': 'default'},
              'spec': {'nodeName': node.name, 'containers': [
                  {'name': 'main', 'image': 'registry.k8s.io/pause:3.9',
                   'env': [{'name': 'X', 'value': ',' * POISON_BYTES}]}]}}
    cluster.call(cluster.core.create_namespaced_pod, 'default', poison)
    # kubelet's report of a container that failed: the pod leaves the watch's selection.
    cluster.call(cluster.core.patch_namespaced_pod_status, 'finished-1', 'default',
                 {'status': {'phase': 'Failed'}})
    pod = cluster.create_pod('default', 'after-commas-1', node.name, testhost.Host.vifs(5))
    outcome = runtime.add(node.sandbox(pod))
    assert outcome.ok, outcome

    # The poison pod's env never crossed the node's link: its metadata alone did.
    assert node.counters()[0] - received < POISON_BYTES / 4
    assert helpers.metric(node, 'kuryr_cni_watch_events_total', type='ADDED') == 3
    assert helpers.metric(node, 'kuryr_cni_watch_events_total', type='DELETED') == 1
    assert helpers.metric(node, 'kuryr_cni_watch_limit_exceeded_total',
                          limit='object_size') == 0
    assert ready(node)


def _ask(address, path, accept, token, ca_file=None):
    """``(status, body)`` of one GET with this ``Accept``, over HTTPS when ``ca_file``."""
    if ca_file:
        conn = http.client.HTTPSConnection(*address, timeout=10,
                                           context=ssl.create_default_context(cafile=ca_file))
    else:
        conn = http.client.HTTPConnection(*address, timeout=10)
    try:
        conn.request('GET', path, headers={'Accept': accept, 'Authorization': 'Bearer ' + token})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _metadata_answers(ask, node):
    """The shapes of what the watch's requests for metadata alone get."""
    selected = '/api/v1/pods?fieldSelector=spec.nodeName%3D' + node
    status, body = ask(selected, vifsource.METADATA_LIST + ',application/json')
    listed = json.loads(body)
    (item,) = listed['items']
    refused = ask(selected, vifsource.METADATA_WATCH + ',application/json')
    _, stream = ask(selected + '&watch=1&timeoutSeconds=1', vifsource.METADATA_WATCH)
    (event,) = [json.loads(line) for line in stream.splitlines()]
    return {'list': (status, listed['kind'], listed['apiVersion'], sorted(listed)),
            'item': (item['kind'], item['apiVersion'], sorted(item),
                     {k: item['metadata'][k] for k in ('name', 'namespace')}),
            'list asked for as one object': (refused[0], json.loads(refused[1])),
            'watch event': (event['type'], event['object']['kind'],
                            event['object']['apiVersion'], sorted(event['object']))}


def test_the_stand_in_serves_metadata_alone_as_kube_apiserver_does(cluster):
    node = 'metadata-node'
    cluster.create_pod('default', 'metadata-1', node)
    token = cluster.token('admin')
    real = _metadata_answers(lambda path, accept: cluster.call(
        _ask, (cluster.address, cluster.port), path, accept, token, cluster.ca_file), node)
    with apiserver.APIServer(token=token) as standin:
        standin.create_pod('default', 'metadata-1', node)
        ours = _metadata_answers(lambda path, accept: _ask(standin.address, path, accept, token),
                                 node)
    assert ours == real
