"""The KuryrPort VIF source: its list+watches against the API stand-in, and the merge with
pods."""

import threading

import pytest

from kuryr_cni import apiclient
from kuryr_cni import listwatch
from kuryr_cni import osvif
from kuryr_cni.vifsource import kuryrport
from tests.unit import osvif_fixtures as fx
from tests.unit.test_listwatch import Sink

NODE = 'node-1'
UID = 'uid-web-0'


class Running:
    """The two list+watches of the kuryrport source in threads, feeding one merged sink."""

    def __init__(self, server, tombstone_ttl=600):
        self.sink = Sink()
        self.merged = kuryrport.PodVIFs(self.sink, tombstone_ttl=tombstone_ttl)
        self.api = apiclient.make_api_client(api_root=server.url)
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=listwatch.ListWatch(
                kuryrport.PodPresence(self.api, NODE), self.merged.pods, backoff_max=0.2).run,
                args=(self.stop,)),
            threading.Thread(target=listwatch.ListWatch(
                kuryrport.KuryrPorts(self.api, NODE), self.merged.ports, backoff_max=0.2).run,
                args=(self.stop,)),
        ]
        for thread in self.threads:
            thread.start()
        self.sink.wait_for(lambda s: s.synced, 'both feeds synced')

    def wait(self, key, predicate, what):
        self.sink.wait_for(lambda s: predicate(s.pods.get(key)), what)
        return self.sink.pods.get(key)

    def close(self):
        self.stop.set()
        for thread in self.threads:
            thread.join(10)
        self.api.close()


@pytest.fixture
def running(server):
    started = []

    def start(**kwargs):
        started.append(Running(server, **kwargs))
        return started[-1]
    yield start
    for run in started:
        run.close()


def _expected(status):
    return {name: v.to_dict() for name, v in osvif.parse_status_vifs(status).items()}


def test_kuryrport_vifs_become_the_pods_record(server, running):
    server.create_pod('default', 'web-0', NODE, uid=UID)
    run = running()
    record = run.wait('default/web-0', lambda r: r is not None, 'the pod')
    assert record == {'uid': UID, 'vifs': {}, 'error': None, 'deleting': False}

    status = fx.status_vifs(fx.vlan_vif(active=False))
    server.create_kuryrport('default', 'web-0', NODE, spec={'podUid': UID, 'podStatic': False},
                            status={'vifs': status})
    record = run.wait('default/web-0', lambda r: r['vifs'], 'the VIFs')
    assert record == {'uid': UID, 'vifs': _expected(status), 'error': None, 'deleting': False}
    assert not record['vifs']['eth0']['active']

    active = fx.status_vifs(fx.vlan_vif(active=True))
    server.update_kuryrport('default', 'web-0', status={'vifs': active})
    run.wait('default/web-0', lambda r: r['vifs']['eth0']['active'], 'activation')


def test_only_this_nodes_kuryrports_are_watched(server, running):
    server.create_kuryrport('default', 'mine', NODE, spec={'podUid': 'u1', 'podStatic': False},
                            status={'vifs': fx.status_vifs(fx.macvlan_vif())})
    server.create_kuryrport('default', 'theirs', 'node-2',
                            spec={'podUid': 'u2', 'podStatic': False},
                            status={'vifs': fx.status_vifs(fx.macvlan_vif())})
    run = running()
    run.wait('default/mine', lambda r: r is not None, 'our KuryrPort')
    assert 'default/theirs' not in run.sink.pods
    watches = [r for r in server.requests() if r.path == '/apis/openstack.org/v1/kuryrports']
    assert watches and all(r.query.get('labelSelector') == 'kuryr.openstack.org/nodeName=' + NODE
                           for r in watches)


def test_static_pod_records_no_uid(server, running):
    server.create_kuryrport('kube-system', 'etcd-node-1', NODE,
                            spec={'podUid': 'mirror-uid', 'podStatic': True},
                            status={'vifs': fx.status_vifs(fx.macvlan_vif())})
    run = running()
    record = run.wait('kube-system/etcd-node-1', lambda r: r is not None, 'the static pod')
    assert record['uid'] is None and record['vifs']


def test_malformed_kuryrport_is_an_error_record(server, running):
    broken = fx.vlan_vif()
    broken['versioned_object.name'] = 'VIFVHostUser'
    server.create_kuryrport('default', 'web-0', NODE, spec={'podUid': UID, 'podStatic': False},
                            status={'vifs': fx.status_vifs(broken)})
    server.create_kuryrport('default', 'web-1', NODE, spec={'podStatic': False})
    run = running()
    record = run.wait('default/web-0', lambda r: r is not None, 'the broken one')
    assert "is a 'VIFVHostUser'" in record['error'] and record['vifs'] == {}
    record = run.wait('default/web-1', lambda r: r is not None, 'the one without podUid')
    assert record['error'] == 'KuryrPort has no spec.podUid'


def test_pod_deleted_before_its_kuryrport_leaves_a_gone_record(server, running):
    server.create_pod('default', 'web-0', NODE, uid=UID)
    run = running()
    run.wait('default/web-0', lambda r: r is not None, 'the pod')
    server.delete_pod('default', 'web-0')
    record = run.wait('default/web-0', lambda r: r and r.get('gone'), 'the tombstone')
    assert record['uid'] == UID and record['vifs'] == {}

    server.create_pod('default', 'web-0', NODE, uid='uid-web-0-new')   # a new incarnation
    record = run.wait('default/web-0', lambda r: r and not r.get('gone'), 'the new pod')
    assert record['uid'] == 'uid-web-0-new'


def test_pod_deleted_with_its_kuryrport_present_keeps_the_port(server, running):
    server.create_pod('default', 'web-0', NODE, uid=UID)
    server.create_kuryrport('default', 'web-0', NODE, spec={'podUid': UID, 'podStatic': False},
                            status={'vifs': fx.status_vifs(fx.macvlan_vif())})
    run = running()
    run.wait('default/web-0', lambda r: r and r['vifs'], 'the VIFs')
    server.delete_pod('default', 'web-0')
    server.delete_kuryrport('default', 'web-0')
    # The two feeds race: the port may go first, leaving a tombstone of the pod;
    # either way nothing pluggable is left.
    record = run.wait('default/web-0', lambda r: r is None or r.get('gone'), 'no VIFs left')
    assert record is None or record['vifs'] == {}


# -- the merge alone ----------------------------------------------------------------

class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_tombstones_expire():
    sink, clock = Sink(), Clock()
    merged = kuryrport.PodVIFs(sink, tombstone_ttl=60, clock=clock)
    merged.pods.put_pod('default/web-0', {'uid': UID, 'vifs': {}, 'error': None,
                                          'deleting': False})
    merged.pods.drop_pod('default/web-0')
    assert sink.pods['default/web-0']['gone']
    clock.now += 61
    merged.ports.put_pod('default/other', {'uid': 'u', 'vifs': {}, 'error': None,
                                           'deleting': False})
    assert 'default/web-0' not in sink.pods


def test_relist_of_pods_turns_vanished_pods_into_tombstones():
    sink = Sink()
    merged = kuryrport.PodVIFs(sink)
    pod = {'uid': UID, 'vifs': {}, 'error': None, 'deleting': False}
    merged.pods.replace_pods({'default/web-0': pod, 'default/web-1': dict(pod, uid='u1')})
    merged.ports.replace_pods({'default/web-1': {'uid': 'u1', 'vifs': {'eth0': {}},
                                                 'error': None, 'deleting': False}})
    merged.pods.replace_pods({})
    assert sink.pods['default/web-0'] == {'uid': UID, 'vifs': {}, 'error': None,
                                          'deleting': False, 'gone': True}
    assert not sink.pods['default/web-1'].get('gone')     # its KuryrPort still speaks for it


def test_synced_only_when_both_feeds_are():
    sink = Sink()
    merged = kuryrport.PodVIFs(sink)
    merged.pods.mark_synced(True)
    assert sink.synced is False
    merged.ports.mark_synced(True)
    assert sink.synced is True
    merged.pods.mark_synced(False)
    assert sink.synced is False


def test_deleting_pod_marks_the_merged_record():
    sink = Sink()
    merged = kuryrport.PodVIFs(sink)
    merged.ports.put_pod('default/web-0', {'uid': UID, 'vifs': {'eth0': {}}, 'error': None,
                                           'deleting': False})
    merged.pods.put_pod('default/web-0', {'uid': UID, 'vifs': {}, 'error': None,
                                          'deleting': True})
    assert sink.pods['default/web-0']['deleting'] is True


def test_each_builder_reads_only_its_nodes_objects():
    api = apiclient.make_api_client(api_root='http://127.0.0.1:9')
    ports, pods = kuryrport.KuryrPorts(api, NODE), kuryrport.PodPresence(api, NODE)
    api.close()
    port = {'metadata': {'name': 'web-0', 'namespace': 'default', 'uid': 'u',
                         'labels': {kuryrport.NODE_LABEL: 'node-2'}},
            'spec': {'podUid': UID, 'podStatic': False}}
    assert ports.record(port) is None
    pod = {'metadata': {'name': 'web-0', 'namespace': 'default', 'uid': UID,
                        'annotations': {'kuryr.openstack.org/vifs': '{not json'},
                        'deletionTimestamp': '2024-01-01T00:00:00Z'},
           'spec': {'nodeName': NODE}}
    # Presence only: the annotation is not read (no error for an unusable one).
    assert pods.record(pod) == {'uid': UID, 'deleting': True}
    assert pods.record(dict(pod, spec={'nodeName': 'node-2'})) is None
