"""The Kubernetes API stand-in, driven by the official ``kubernetes`` client."""

import concurrent.futures
import http.client
import json
import socket
import threading

from kubernetes import client
from kubernetes import watch
import pytest
import urllib3

from tools.testbed import apiserver

pytestmark = pytest.mark.usefixtures('no_leftover_threads')

NODE = 'node-1'


@pytest.fixture
def api(server):
    api_client = client.ApiClient(client.Configuration(host=server.url))
    yield api_client
    api_client.close()


@pytest.fixture
def core(api):
    return client.CoreV1Api(api)


def collect(stream, count, w):
    """Take ``count`` events from a Watch stream, then stop it."""
    events = []
    for event in stream:
        events.append(event)
        if len(events) == count:
            w.stop()
    return events


def raw_watch_lines(core, **kwargs):
    response = core.list_pod_for_all_namespaces(watch=True, _preload_content=False, **kwargs)
    try:
        return [json.loads(line) for line in response.read().splitlines() if line]
    finally:
        response.release_conn()


def test_list_honours_field_and_label_selectors(server, core):
    server.create_pod('default', 'a', NODE, labels={'app': 'web'})
    server.create_pod('other', 'b', NODE)
    server.create_pod('default', 'c', 'node-2', labels={'app': 'web'})

    mine = core.list_pod_for_all_namespaces(field_selector='spec.nodeName=' + NODE)
    assert sorted(p.metadata.name for p in mine.items) == ['a', 'b']
    assert mine.metadata.resource_version == server.resource_version
    assert all(p.spec.node_name == NODE for p in mine.items)

    web = core.list_namespaced_pod('default', label_selector='app=web')
    assert sorted(p.metadata.name for p in web.items) == ['a', 'c']
    not_web = core.list_pod_for_all_namespaces(label_selector='app!=web')
    assert [p.metadata.name for p in not_web.items] == ['b']


def test_objects_look_like_real_pods(server, core):
    created = server.create_pod('default', 'a', NODE, annotations={'k': 'v'}, uid='uid-a')
    pod = core.read_namespaced_pod('a', 'default')
    assert pod.metadata.uid == 'uid-a'
    assert pod.metadata.annotations == {'k': 'v'}
    assert pod.metadata.resource_version == created['metadata']['resourceVersion']
    assert pod.metadata.creation_timestamp is not None
    assert pod.status.phase == 'Pending'


def test_watch_replays_changes_after_a_resource_version(server, core):
    server.create_pod('default', 'a', NODE)
    since = server.resource_version
    server.update_pod('default', 'a', annotations={'x': '1'})
    server.create_pod('default', 'b', NODE)
    server.create_pod('default', 'elsewhere', 'node-2')
    server.delete_pod('default', 'a')

    w = watch.Watch()
    events = collect(w.stream(core.list_pod_for_all_namespaces, resource_version=since,
                              field_selector='spec.nodeName=' + NODE), 3, w)

    assert [(e['type'], e['object'].metadata.name) for e in events] == [
        ('MODIFIED', 'a'), ('ADDED', 'b'), ('DELETED', 'a')]
    assert events[0]['object'].metadata.annotations == {'x': '1'}
    assert events[-1]['object'].metadata.resource_version == server.resource_version


def test_watch_without_resource_version_starts_with_current_objects(server, core):
    server.create_pod('default', 'a', NODE)
    server.create_pod('default', 'b', NODE)
    w = watch.Watch()
    stream = w.stream(core.list_pod_for_all_namespaces)
    first = [next(stream), next(stream)]
    # A change made after the watch started arrives as a live event.
    server.create_pod('default', 'c', NODE)
    live = next(stream)
    w.stop()
    stream.close()
    assert [(e['type'], e['object'].metadata.name) for e in first] == [
        ('ADDED', 'a'), ('ADDED', 'b')]
    assert (live['type'], live['object'].metadata.name) == ('ADDED', 'c')


def test_watch_from_compacted_version_gets_410_error_event(server, core):
    server.create_pod('default', 'a', NODE)
    old = server.resource_version
    server.create_pod('default', 'b', NODE)
    server.compact()

    lines = raw_watch_lines(core, resource_version=old, timeout_seconds=5)
    assert len(lines) == 1
    assert lines[0]['type'] == 'ERROR'
    assert lines[0]['object']['kind'] == 'Status'
    assert (lines[0]['object']['code'], lines[0]['object']['reason']) == (410, 'Expired')

    with pytest.raises(client.ApiException) as info:
        list(watch.Watch().stream(core.list_pod_for_all_namespaces, resource_version=old,
                                  timeout_seconds=5))
    assert info.value.status == 410

    # The current version is still fine.
    assert raw_watch_lines(core, resource_version=server.resource_version,
                           timeout_seconds=1) == []


def test_watch_from_compacted_version_can_get_http_410():
    with apiserver.APIServer(expired_as='http') as srv:
        api_client = client.ApiClient(client.Configuration(host=srv.url))
        srv.create_pod('default', 'a', NODE)
        srv.create_pod('default', 'b', NODE)
        srv.compact()
        with pytest.raises(client.ApiException) as info:
            client.CoreV1Api(api_client).list_pod_for_all_namespaces(
                watch=True, resource_version='2', _preload_content=False)
        api_client.close()
    assert info.value.status == 410
    assert json.loads(info.value.body)['reason'] == 'Expired'


def test_bookmarks_carry_the_latest_resource_version(server, core):
    server.create_pod('default', 'a', NODE)
    server.create_pod('default', 'elsewhere', 'node-2')
    w = watch.Watch()
    stream = w.stream(core.list_pod_for_all_namespaces, resource_version=server.resource_version,
                      field_selector='spec.nodeName=' + NODE, allow_watch_bookmarks=True)
    event = next(stream)
    w.stop()
    stream.close()
    assert event['type'] == 'BOOKMARK'
    # kube-apiserver's bookmark: an empty object of the kind, carrying the version.
    assert event['raw_object'] == {'kind': 'Pod', 'apiVersion': 'v1',
                                   'metadata': {'resourceVersion': server.resource_version,
                                                'creationTimestamp': None},
                                   'spec': {'containers': None}, 'status': {}}
    assert w.resource_version == server.resource_version


def test_without_an_interval_the_one_bookmark_comes_before_the_timeout():
    # kube-apiserver 1.20 sends one, two seconds before the watch ends, when the
    # version has moved past the watch's start.
    with apiserver.APIServer() as srv:
        srv.create_pod('default', 'a', NODE)
        api_client = client.ApiClient(client.Configuration(host=srv.url))
        core = client.CoreV1Api(api_client)
        quiet = raw_watch_lines(core, timeout_seconds=3, resource_version=srv.resource_version,
                                allow_watch_bookmarks=True)
        response = core.list_pod_for_all_namespaces(
            watch=True, _preload_content=False, timeout_seconds=3,
            resource_version=srv.resource_version, allow_watch_bookmarks=True,
            field_selector='spec.nodeName=' + NODE)
        srv.create_pod('default', 'elsewhere', 'node-2')
        lines = [json.loads(line) for line in response.read().splitlines() if line]
        response.release_conn()
        api_client.close()
    assert quiet == []
    assert [(e['type'], e['object']['metadata']['resourceVersion']) for e in lines] == [
        ('BOOKMARK', srv.resource_version)]


def test_timeout_seconds_ends_the_stream_cleanly(server, core):
    response = core.list_pod_for_all_namespaces(watch=True, _preload_content=False,
                                                resource_version=server.resource_version,
                                                timeout_seconds=1)
    try:
        assert response.read() == b''     # the chunked body ends: no error, no bookmark
    finally:
        response.release_conn()


def test_object_leaving_a_selector_is_deleted_for_that_watch(server, core):
    server.create_pod('default', 'a', NODE, labels={'app': 'web'})
    since = server.resource_version
    server.update_pod('default', 'a', labels={'app': 'db'})
    w = watch.Watch()
    (event,) = collect(w.stream(core.list_namespaced_pod, 'default', label_selector='app=web',
                                resource_version=since), 1, w)
    assert (event['type'], event['object'].metadata.name) == ('DELETED', 'a')


def test_graceful_delete_sets_deletion_timestamp_first(server, core):
    server.create_pod('default', 'a', NODE)
    since = server.resource_version
    server.delete_pod('default', 'a', grace_period=30)
    assert core.read_namespaced_pod('a', 'default').metadata.deletion_timestamp is not None
    server.delete_pod('default', 'a')
    w = watch.Watch()
    events = collect(w.stream(core.list_pod_for_all_namespaces, resource_version=since), 2, w)
    assert [e['type'] for e in events] == ['MODIFIED', 'DELETED']
    assert server.get('default', 'a') is None


def test_kuryrports_list_and_watch_through_custom_objects_api(server, api):
    custom = client.CustomObjectsApi(api)
    server.create_kuryrport('default', 'a', NODE, spec={'podUid': 'uid-a', 'podStatic': False})
    server.create_kuryrport('default', 'b', 'node-2', spec={'podUid': 'uid-b', 'podStatic': False})
    selector = apiserver.NODE_LABEL + '=' + NODE

    listed = custom.list_cluster_custom_object('openstack.org', 'v1', 'kuryrports',
                                               label_selector=selector)
    assert listed['kind'] == 'KuryrPortList'
    assert [p['metadata']['name'] for p in listed['items']] == ['a']
    one = custom.get_namespaced_custom_object('openstack.org', 'v1', 'default', 'kuryrports', 'a')
    assert one['spec']['podUid'] == 'uid-a'

    since = listed['metadata']['resourceVersion']
    server.update_kuryrport('default', 'a', status={'vifs': {'eth0': {'default': True}}})
    server.update_kuryrport('default', 'b', status={'vifs': {}})
    server.delete_kuryrport('default', 'a')
    w = watch.Watch()
    events = collect(w.stream(custom.list_cluster_custom_object, 'openstack.org', 'v1',
                              'kuryrports', label_selector=selector, resource_version=since), 2, w)
    assert [e['type'] for e in events] == ['MODIFIED', 'DELETED']
    assert events[0]['object']['status'] == {'vifs': {'eth0': {'default': True}}}


def test_events_posted_by_clients_are_stored(server, core):
    body = client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name='a.'),
        involved_object=client.V1ObjectReference(kind='Pod', namespace='default', name='a'),
        reason='StaleDelRejected', message='DEL of an old sandbox ignored', type='Warning')
    created = core.create_namespaced_event('default', body)
    assert created.metadata.name.startswith('a.')
    assert created.metadata.uid
    (stored,) = server.events()
    assert stored['reason'] == 'StaleDelRejected'
    assert stored['involvedObject']['name'] == 'a'
    assert stored['metadata']['namespace'] == 'default'


def test_unknown_paths_and_objects_get_404_status(server, core):
    with pytest.raises(client.ApiException) as info:
        core.read_namespaced_pod('missing', 'default')
    assert info.value.status == 404
    status = json.loads(info.value.body)
    assert (status['kind'], status['reason'], status['code']) == ('Status', 'NotFound', 404)

    conn = http.client.HTTPConnection(*server.address, timeout=5)
    conn.request('GET', '/api/v1/nodes')
    response = conn.getresponse()
    assert response.status == 404
    assert json.loads(response.read())['kind'] == 'Status'
    conn.close()


def test_request_bodies_are_bounded(server):
    conn = http.client.HTTPConnection(*server.address, timeout=5)
    conn.putrequest('POST', '/api/v1/namespaces/default/events')
    conn.putheader('Content-Type', 'application/json')
    conn.putheader('Content-Length', str(apiserver.MAX_BODY + 1))
    conn.endheaders()
    response = conn.getresponse()
    assert response.status == 413
    assert json.loads(response.read())['code'] == 413
    conn.close()
    assert server.events() == []


def test_requests_are_recorded(server, core):
    core.list_pod_for_all_namespaces(field_selector='spec.nodeName=' + NODE)
    (request,) = server.requests()
    assert (request.method, request.path) == ('GET', '/api/v1/pods')
    assert request.query == {'fieldSelector': 'spec.nodeName=' + NODE}
    assert not request.is_watch


def test_stop_cuts_watches_and_refuses_until_start(server, core):
    server.create_pod('default', 'a', NODE)
    response = core.list_pod_for_all_namespaces(watch=True, _preload_content=False,
                                                resource_version=server.resource_version)
    stopper = threading.Thread(target=server.stop)    # the stream is open: cut it
    stopper.start()
    with pytest.raises(urllib3.exceptions.ProtocolError):
        response.read()
    response.release_conn()
    stopper.join()

    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(server.address, timeout=2).close()
    server.create_pod('default', 'b', NODE)      # the store stays usable while down

    server.start()
    pods = core.list_pod_for_all_namespaces(_request_timeout=(2, 5))
    assert sorted(p.metadata.name for p in pods.items) == ['a', 'b']
    server.stop()
    server.start()       # and again: an explicitly bound port survives repeated outages
    assert len(core.list_pod_for_all_namespaces(_request_timeout=(2, 5)).items) == 2


def test_serves_on_a_socket_given_to_it():
    sock = socket.socket()
    sock.bind(('127.0.0.1', 0))
    sock.listen(5)
    with apiserver.APIServer(sock=sock) as srv:
        assert srv.url == 'http://127.0.0.1:%d' % sock.getsockname()[1]
        srv.create_pod('default', 'a', NODE)
        api_client = client.ApiClient(client.Configuration(host=srv.url))
        srv.stop()
        srv.start()
        pods = client.CoreV1Api(api_client).list_pod_for_all_namespaces(_request_timeout=(2, 5))
        api_client.close()
    assert [p.metadata.name for p in pods.items] == ['a']


def test_a_burst_of_clients_is_served(server):
    server.create_pod('default', 'a', NODE)

    def fetch(_):
        conn = http.client.HTTPConnection(*server.address, timeout=10)
        try:
            conn.request('GET', '/api/v1/pods')
            return conn.getresponse().status
        finally:
            conn.close()

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        statuses = list(pool.map(fetch, range(200)))
    assert statuses == [200] * 200


def test_control_api_refuses_duplicates_and_unknown_pods(server):
    server.create_pod('default', 'a', NODE)
    with pytest.raises(apiserver.APIError) as info:
        server.create_pod('default', 'a', NODE)
    assert info.value.code == 409
    with pytest.raises(apiserver.APIError):
        server.update_pod('default', 'missing', annotations={'k': 'v'})


def test_set_vifs_writes_the_annotation_as_json(server):
    vifs = {'eth0': {'kind': 'bridge', 'port_id': 'p1'}}
    pod = server.set_vifs('default', server.create_pod('default', 'a', NODE)['metadata']['name'],
                          vifs)
    assert json.loads(pod['metadata']['annotations']['kuryr.openstack.org/vifs']) == vifs
    pod = server.set_vifs('default', 'a', None)
    assert 'kuryr.openstack.org/vifs' not in pod['metadata']['annotations']


# Agreement with kube-apiserver 1.20 (each checked against the real one in tests/k8s) --------

def raw(server, method, path, headers=None):
    """``(status, decoded JSON body)`` of one request, without the client's interpretation."""
    conn = http.client.HTTPConnection(*server.address, timeout=5)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_field_selectors_only_on_the_fields_the_resource_supports(server):
    assert raw(server, 'GET', '/api/v1/pods?fieldSelector=spec.foo%3Dbar') == (
        400, apiserver.status_object(400, 'BadRequest', 'field label not supported: spec.foo'))
    status, body = raw(server, 'GET', '/apis/openstack.org/v1/kuryrports'
                                      '?fieldSelector=spec.nodeName%3Dn')
    assert (status, body['message']) == (400, 'field label not supported: spec.nodeName')
    assert raw(server, 'GET', '/api/v1/pods?fieldSelector=status.phase%3DPending')[0] == 200


def test_set_based_label_selectors(server, core):
    server.create_pod('default', 'a', NODE, labels={'app': 'web', 'tier': 'front'})
    server.create_pod('default', 'b', NODE, labels={'app': 'db'})
    server.create_pod('default', 'c', NODE)

    def names(selector):
        return sorted(p.metadata.name for p in
                      core.list_pod_for_all_namespaces(label_selector=selector).items)

    assert names('app in (web, db)') == ['a', 'b']
    assert names('app notin (web)') == ['b', 'c']
    assert names('tier') == ['a']
    assert names('!tier,app') == ['b']
    assert names('app in (web,db),tier!=front') == ['b']
    assert raw(server, 'GET', '/api/v1/pods?labelSelector=%3D%3D')[0] == 400


def test_list_resource_version_semantics(server, core):
    server.create_pod('default', 'a', NODE)
    old = server.resource_version
    server.create_pod('default', 'b', NODE)
    for version in ('0', old, server.resource_version):      # "not older than": the latest
        listed = core.list_pod_for_all_namespaces(resource_version=version)
        assert len(listed.items) == 2 and listed.metadata.resource_version == \
            server.resource_version

    status, body = raw(server, 'GET', '/api/v1/pods?resourceVersion=999999')
    assert status == 504 and body['reason'] == 'Timeout'
    assert body['details']['causes'] == [{'reason': 'ResourceVersionTooLarge',
                                          'message': 'Too large resource version'}]
    for path in ('/api/v1/pods?resourceVersion=abc',
                 '/api/v1/pods?watch=1&resourceVersion=abc'):
        status, body = raw(server, 'GET', path)
        assert status == 500 and 'reason' not in body
        assert body['message'].startswith('resourceVersion: Invalid value: "abc"')


def test_a_restarted_server_has_forgotten_the_history(server, core):
    server.create_pod('default', 'a', NODE)
    before = server.resource_version
    server.create_pod('default', 'b', NODE)
    server.restart()
    [error] = raw_watch_lines(core, resource_version=before, timeout_seconds=5)
    assert error['type'] == 'ERROR' and error['object']['code'] == 410
    assert raw_watch_lines(core, resource_version=server.resource_version,
                           timeout_seconds=1) == []


def test_a_token_is_required_when_one_is_set():
    with apiserver.APIServer(token='s3cret') as srv:
        assert raw(srv, 'GET', '/api/v1/pods') == (
            401, apiserver.status_object(401, 'Unauthorized', 'Unauthorized'))
        assert raw(srv, 'GET', '/api/v1/pods', {'Authorization': 'Bearer wrong'})[0] == 401
        assert raw(srv, 'GET', '/api/v1/pods', {'Authorization': 'bearer s3cret'})[0] == 200


def test_error_statuses_carry_the_details_the_real_server_sends(server):
    assert raw(server, 'GET', '/api/v1/namespaces/default/pods/nope') == (
        404, apiserver.status_object(404, 'NotFound', 'pods "nope" not found',
                                     {'name': 'nope', 'kind': 'pods'}))
    status, body = raw(server, 'GET', '/apis/openstack.org/v1/namespaces/default/kuryrports/x')
    assert body['message'] == 'kuryrports.openstack.org "x" not found'
    assert body['details'] == {'name': 'x', 'group': 'openstack.org', 'kind': 'kuryrports'}
    assert raw(server, 'GET', '/api/v1/nodes')[1]['details'] == {}
    assert raw(server, 'PUT', '/api/v1/pods') == (
        405, apiserver.status_object(405, 'MethodNotAllowed', 'the server does not allow this '
                                     'method on the requested resource', {}))


METADATA_LIST = 'application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1'
METADATA = 'application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1'


def test_metadata_alone_when_asked_for_as_kube_apiserver_answers_it(server, core):
    pod = server.create_pod('default', 'a', NODE, labels={'app': 'web'})
    server.create_pod('default', 'b', 'node-2')
    selected = '/api/v1/pods?fieldSelector=spec.nodeName%3D' + NODE
    status, listed = raw(server, 'GET', selected, {'Accept': METADATA_LIST + ',application/json'})
    assert (status, listed) == (200, {
        'kind': 'PartialObjectMetadataList', 'apiVersion': 'meta.k8s.io/v1',
        'metadata': {'resourceVersion': server.resource_version},
        'items': [{'kind': 'PartialObjectMetadata', 'apiVersion': 'meta.k8s.io/v1',
                   'metadata': pod['metadata']}]})
    # A list asked for as one object is refused, whatever follows in the header.
    status, refused = raw(server, 'GET', selected, {'Accept': METADATA + ',application/json'})
    assert (status, refused['reason'], refused['message']) == (
        406, 'NotAcceptable', 'you requested PartialObjectMetadata, but the requested object '
                              'is a list (*core.PodList)')

    (event,) = raw_watch_lines(core, field_selector='spec.nodeName=' + NODE, timeout_seconds=1,
                               _headers={'Accept': METADATA})
    assert event == {'type': 'ADDED', 'object': {'kind': 'PartialObjectMetadata',
                                                 'apiVersion': 'meta.k8s.io/v1',
                                                 'metadata': pod['metadata']}}
    assert raw_watch_lines(core, field_selector='spec.nodeName=' + NODE, timeout_seconds=1,
                           _headers={'Accept': METADATA_LIST}) == []
