"""The daemon against a real kube-apiserver, end to end: RBAC of the DaemonSet, the real
shim, real network namespaces.

The daemon's identity is the static token user named like the DaemonSet's
ServiceAccount, bound by the manifest's own ClusterRoleBinding; its token
file ends in a newline, as hand-written ones do.
"""

import concurrent.futures

from tests import wait
from tests.functional import helpers
from tests.k8s import cluster as k8s
from tests.unit import osvif_fixtures as fx
from tools.testbed import host as testhost

MAC = 'fa:16:3e:98:7b:05'


def assert_connected(node, box, index):
    assert node.addresses(box.netns, 'eth0') == {'10.10.0.%d/24' % index}
    assert node.ping(box.netns, testhost.GATEWAY)


def test_add_check_del_through_the_real_shim(cluster, node, runtime):
    since = cluster.audit_offset()
    node.start_daemon(vif_timeout=20)
    pod = cluster.create_pod('default', 'web-1', node.name, testhost.Host.vifs(5))
    box = node.sandbox(pod)

    added = runtime.add(box)
    assert added.ok, added
    assert [ip['address'] for ip in added.output['ips']] == ['10.10.0.5/24']
    assert_connected(node, box, 5)
    assert runtime.check(box).ok
    assert runtime.delete(box).ok
    assert helpers.leftovers(node) == helpers.NOTHING

    assert cluster.refused(since) == []
    assert ' 403 ' not in node.daemon_log() and 'Forbidden' not in node.daemon_log()
    watches = cluster.daemon_requests(since, resource='pods')
    assert [r['verb'] for r in watches] == ['list', 'watch']
    assert k8s.query(watches[1])['fieldSelector'] == (
        'spec.nodeName=%s,status.phase!=Succeeded,status.phase!=Failed' % node.name)


def test_an_add_that_times_out_creates_its_event(cluster, node, runtime):
    since = cluster.audit_offset()
    node.start_daemon(vif_timeout=1)
    pod = cluster.create_pod('default', 'late-1', node.name)      # no VIFs published

    outcome = runtime.add(node.sandbox(pod))
    assert outcome.error_code == 11, outcome
    [event] = wait.until(lambda: [e for e in cluster.events()
                                  if e['involvedObject']['name'] == 'late-1'],
                         20, 'the Event')
    assert event['reason'] == 'CNITimedOutWaitingForVIFAnnotation' and event['type'] == 'Warning'
    assert event['involvedObject']['uid'] == pod['metadata']['uid']
    assert event['source'] == {'component': 'kuryr-daemon', 'host': node.name}
    assert cluster.refused(since) == []
    assert 'Could not post' not in node.daemon_log()


def test_the_kuryrport_source_with_the_shipped_crd(cluster, node, runtime):
    testhost.ip('-n', node.ns, 'addr', 'add', 'fd10::1/64', 'dev', testhost.BRIDGE, 'nodad')
    since = cluster.audit_offset()
    node.start_daemon(vif_source='kuryrport', vif_timeout=30)
    pod = cluster.create_pod('default', 'kp-1', node.name)
    uid = pod['metadata']['uid']
    box = node.sandbox(pod)
    network = fx.network([
        fx.subnet('10.10.0.0/24', ['10.10.0.5'], gateway='10.10.0.1'),
        fx.subnet('fd10::/64', ['fd10::5'], gateway='fd10::1')])
    inactive = fx.status_vifs(fx.bridge_vif(active=False, bridge_name=testhost.BRIDGE,
                                            network=network))
    active = fx.status_vifs(fx.bridge_vif(active=True, bridge_name=testhost.BRIDGE,
                                          network=network))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        add = helpers.add_in_background(pool, node, runtime, box, published=False)
        cluster.create_kuryrport('default', 'kp-1', node.name, uid, inactive)
        cluster.update_kuryrport_vifs('default', 'kp-1', active)
        outcome = add.result(timeout=60)
    assert outcome.ok, outcome
    eth0 = node.links(box.netns)['eth0']
    assert eth0.get('address') == MAC
    assert node.addresses(box.netns, 'eth0') == {'10.10.0.5/24', 'fd10::5/64'}
    assert runtime.delete(box).ok
    assert helpers.leftovers(node) == helpers.NOTHING

    assert cluster.refused(since) == []
    pods = cluster.daemon_requests(since, resource='pods')
    ports = cluster.daemon_requests(since, resource='kuryrports')
    assert [r['verb'] for r in pods] == ['list', 'watch']
    assert [r['verb'] for r in ports] == ['list', 'watch']
    assert k8s.query(ports[1])['labelSelector'] == 'kuryr.openstack.org/nodeName=' + node.name
