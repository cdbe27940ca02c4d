"""What one node costs kube-apiserver, and what other nodes' pods cost a node: measured.

These are the inputs of the 5,000-node model in ``doc/source/scale.rst``. Each
test asserts what must hold whatever the machine (one list and one watch per
node, no event of another node's pod, memory flat); the figures themselves
(bytes on the node's link to the control plane, TLS and TCP included; CPU
time of kube-apiserver and etcd) are written to
``.cache/k8s-measurements.json`` for the model, not asserted: speed and size
vary with the machine.
"""

import json
import os

import pytest

from tests import wait
from tests.functional import crash
from tests.functional import helpers
from tests.k8s import cluster as k8s
from tools.testbed import host as testhost

PODS_PER_NODE = 110
OTHER_PODS = 5000
RSS_SLACK_KIB = 4 * 1024
REPORT = os.path.join(k8s.REPO, '.cache', 'k8s-measurements.json')
MEASURED = {}


@pytest.fixture(scope='module', autouse=True)
def report():
    yield
    if MEASURED:
        os.makedirs(os.path.dirname(REPORT), exist_ok=True)
        with open(REPORT, 'w') as f:
            json.dump(MEASURED, f, indent=2, sort_keys=True)


def rss_kib(pid):
    """Resident memory of process ``pid``."""
    with open('/proc/%d/smaps_rollup' % pid) as f:
        return next(int(line.split()[1]) for line in f if line.startswith('Rss:'))


def watcher_rss(node):
    [pid] = crash.titled(node, crash.WATCHER_TITLE)
    return rss_kib(pid)


def events_seen(node):
    return sum(value for (name, _), value in helpers.scrape(node).items()
               if name == 'kuryr_cni_watch_events_total')


def start_and_measure(cluster, node):
    """Start ``node``'s daemon; the requests it made and the bytes it moved until ready."""
    since = cluster.audit_offset()
    rx, tx = node.counters()
    node.start_daemon()
    wait.until(lambda: [r for r in cluster.daemon_requests(since) if r['verb'] == 'watch'],
               20, 'the watch')
    rx2, tx2 = node.counters()
    return [r['verb'] for r in cluster.daemon_requests(since)], rx2 - rx, tx2 - tx


def test_a_node_starts_with_one_list_and_one_watch(cluster, node_factory):
    empty, full = node_factory(), node_factory()
    cluster.map(lambda i: cluster.create_pod('default', 'full-%d' % i, full.name,
                                             testhost.Host.vifs(2 + i), typical=True),
                range(PODS_PER_NODE))

    requests, rx, tx = start_and_measure(cluster, empty)
    assert requests == ['list', 'watch']
    requests, rx_full, tx_full = start_and_measure(cluster, full)
    assert requests == ['list', 'watch']
    assert crash.daemon_get(full, '/v1/status')[1]['pods'] == PODS_PER_NODE
    MEASURED['start'] = {
        'requests': len(requests), 'rx_bytes_no_pods': rx, 'tx_bytes_no_pods': tx,
        'rx_bytes_%d_pods' % PODS_PER_NODE: rx_full,
        'list_bytes_per_pod': round((rx_full - rx) / PODS_PER_NODE)}


def test_what_each_pod_event_costs(cluster, node):
    node.start_daemon()
    measured = {}

    def measure(label, change, until):
        """The bytes received and watch events seen while ``change`` is made and delivered."""
        rx, seen = node.counters()[0], events_seen(node)
        change()
        wait.until(until, 20, label)
        measured[label] = {'rx_bytes': node.counters()[0] - rx,
                           'events': events_seen(node) - seen}

    pod = {'metadata': {'name': 'event-1', 'namespace': 'default',
                        'creationTimestamp': '2024-01-01T00:00:00Z'}}
    measure('bare pod added', lambda: cluster.create_pod('default', 'event-1', node.name),
            lambda: events_seen(node) >= 1)
    measure('status reported', lambda: cluster.report_running(pod),
            lambda: events_seen(node) >= 2)
    measure('VIF annotation written', lambda: cluster.set_vifs('default', 'event-1',
                                                               testhost.Host.vifs(6)),
            lambda: events_seen(node) >= 3)
    measure('deleted', lambda: cluster.delete_pod('default', 'event-1'),
            lambda: helpers.metric(node, 'kuryr_cni_watch_events_total', type='DELETED') == 1)
    measure('typical pod added and reported running',
            lambda: cluster.create_pod('default', 'event-2', node.name, testhost.Host.vifs(7),
                                       typical=True),
            lambda: helpers.metric(node, 'kuryr_cni_watch_events_total', type='ADDED') == 2
            and helpers.metric(node, 'kuryr_cni_watch_events_total', type='MODIFIED') >= 3)
    MEASURED['events'] = measured
    assert all(m['rx_bytes'] > 0 and m['events'] >= 1 for m in measured.values())


def test_other_nodes_pods_reach_no_watcher(cluster, node_factory):
    node = node_factory()
    node.start_daemon()
    before_rss, (before_rx, _) = watcher_rss(node), node.counters()

    cluster.map(lambda i: cluster.create_pod('default', 'other-%d' % i, 'other-%d' % (i % 50),
                                             testhost.Host.vifs(2 + i % 200)),
                range(OTHER_PODS))

    # A pod of its own after them: once its event is in, theirs would have been too.
    cluster.create_pod('default', 'mine-1', node.name, testhost.Host.vifs(5))
    wait.until(lambda: events_seen(node) == 1, 20, 'the event of its own pod')
    after_rss, (after_rx, _) = watcher_rss(node), node.counters()
    assert helpers.metric(node, 'kuryr_cni_watch_events_total', type='ADDED') == 1
    assert abs(after_rss - before_rss) <= RSS_SLACK_KIB

    late = node_factory()          # a node starting among them lists none of them
    requests, rx, _ = start_and_measure(cluster, late)
    assert requests == ['list', 'watch']
    assert crash.daemon_get(late, '/v1/status')[1]['pods'] == 0
    late_rss = watcher_rss(late)
    assert abs(late_rss - before_rss) <= RSS_SLACK_KIB
    MEASURED['other_nodes_pods'] = {
        'pods': OTHER_PODS, 'watcher_rss_kib_before': before_rss,
        'watcher_rss_kib_after': after_rss, 'rx_bytes_meanwhile': after_rx - before_rx,
        'late_node_start_rx_bytes': rx, 'late_node_watcher_rss_kib': late_rss}


def test_what_a_relist_costs_from_the_watch_cache_and_from_etcd(cluster):
    node = 'relist-node'
    cluster.map(lambda i: cluster.create_pod('default', 'relist-%d' % i, node,
                                             testhost.Host.vifs(2 + i), typical=True),
                range(PODS_PER_NODE))
    version = cluster.resource_version()
    path = '/api/v1/pods?fieldSelector=spec.nodeName%3D' + node
    costs = {}
    for label, suffix in (('watch_cache_rv_0', '&resourceVersion=0'),
                          ('watch_cache_rv_seen', '&resourceVersion=' + version),
                          ('etcd', '')):
        status, body = cluster.raw('GET', path + suffix, who='daemon')
        assert status == 200 and len(json.loads(body)['items']) == PODS_PER_NODE
        costs[label] = _cost(cluster, lambda: cluster.raw('GET', path + suffix, who='daemon'))
        costs[label]['bytes'] = len(body)
    pods = json.loads(cluster.raw('GET', '/api/v1/pods?resourceVersion=0')[1])['items']
    MEASURED['relist'] = dict(costs, pods_in_cluster=len(pods), pods_listed=PODS_PER_NODE)
    # The watch cache answers from memory, by its spec.nodeName index; etcd sends them all.
    assert costs['etcd']['etcd_cpu_ms'] > costs['watch_cache_rv_0']['etcd_cpu_ms']


def _cost(cluster, request, repeat=20):
    apiserver, etcd = cluster.cpu_seconds(), cluster.cpu_seconds('etcd')
    for _ in range(repeat):
        request()
    return {'apiserver_cpu_ms': round((cluster.cpu_seconds() - apiserver) * 1000 / repeat, 2),
            'etcd_cpu_ms': round((cluster.cpu_seconds('etcd') - etcd) * 1000 / repeat, 2)}


def test_what_open_watches_cost_kube_apiserver(cluster):
    """Goroutines per open watch, and the CPU other nodes' pods cost with watches open.

    Measured over a second step of ``step`` watches: the first also pays for
    what the server starts once. (Go's heap moves with its garbage collector
    more than 500 watches move it: not worth quoting.)
    """
    step, pods = 250, 300
    baseline = cluster.open_pod_watches()

    def create_pods(prefix):
        cpu = cluster.cpu_seconds()
        cluster.map(lambda i: cluster.create_pod('default', '%s-%d' % (prefix, i),
                                                 'unwatched-%d' % (i % 50)), range(pods))
        return (cluster.cpu_seconds() - cpu) * 1000 / pods

    without = create_pods('quiet')
    sockets, samples = [], []
    try:
        for round_ in range(2):
            sockets += cluster.open_watches(['w%d-node-%d' % (round_, i) for i in range(step)])
            wait.until(lambda: cluster.open_pod_watches() >= baseline + len(sockets), 30,
                       'the watches')
            samples.append(_go_runtime(cluster))
        with_watches = create_pods('busy')
    finally:
        cluster.call(lambda: [s.close() for s in sockets])
    first, second = samples
    MEASURED['open_watches'] = {
        'watches': 2 * step,
        'apiserver_goroutines_per_watch': round(
            (second['go_goroutines'] - first['go_goroutines']) / step, 2),
        'apiserver_cpu_ms_per_pod_created_without_watches': round(without, 2),
        'apiserver_cpu_ms_per_pod_created_with_%d_watches' % (2 * step): round(with_watches, 2)}


def _go_runtime(cluster):
    return {line.split()[0]: float(line.split()[1]) for line in cluster.metrics().splitlines()
            if line.split(' ', 1)[0] == 'go_goroutines'}
