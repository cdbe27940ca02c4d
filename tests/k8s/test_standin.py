"""The API stand-in (tools/testbed/apiserver.py) answers as kube-apiserver 1.20.2 does.

The same requests go to both, raw; their answers are compared: status codes,
Status objects (reason, message, details) and the shapes of what the unit and
functional tiers rely on. Where kube-apiserver's message names a moving
version, the fields compared say so.
"""

import concurrent.futures
import http.client
import json

import pytest

from tests import wait
from tools.testbed import apiserver

NOT_FOUND = ('GET', '/api/v1/namespaces/default/pods/nope')
CASES = {
    'a missing pod': (NOT_FOUND, None),
    'a missing KuryrPort': (('GET', '/apis/openstack.org/v1/namespaces/default/kuryrports/x'),
                            None),
    'an unknown resource': (('GET', '/api/v1/foos'), None),
    'a field nobody may select on': (('GET', '/api/v1/pods?fieldSelector=spec.foo%3Dbar'),
                                     None),
    'a field KuryrPorts lack': (('GET', '/apis/openstack.org/v1/kuryrports'
                                        '?fieldSelector=spec.nodeName%3Dn'), None),
    'an unparsable label selector': (('GET', '/api/v1/pods?labelSelector=%3D%3D'),
                                     ('code', 'reason')),
    'a list at a garbage version': (('GET', '/api/v1/pods?resourceVersion=abc'), None),
    'a watch at a garbage version': (('GET', '/api/v1/pods?watch=1&resourceVersion=abc'),
                                     None),
    'a list at a future version': (('GET', '/api/v1/pods?resourceVersion=99999999'),
                                   ('code', 'reason', 'details')),
    'a garbage timeout': (('GET', '/api/v1/pods?watch=1&timeoutSeconds=abc'), None),
    'a method the collection lacks': (('PUT', '/api/v1/pods'), None),
    'an Event for another namespace': (('POST', '/api/v1/namespaces/default/events',
                                        {'apiVersion': 'v1', 'kind': 'Event',
                                         'metadata': {'name': 'x', 'namespace': 'other'}}),
                                       None),
}


@pytest.fixture(scope='module')
def standin(cluster):
    with apiserver.APIServer(token=cluster.token('admin')) as server:
        yield server


def ask_standin(server, method, path, body=None, token=None):
    conn = http.client.HTTPConnection(*server.address, timeout=10)
    try:
        headers = {'Authorization': 'Bearer ' + token} if token else {}
        conn.request(method, path, json.dumps(body) if body is not None else None, headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def compared(status, body, fields):
    status_object = json.loads(body)
    if fields:
        status_object = {k: status_object.get(k) for k in fields}
        causes = (status_object.get('details') or {}).get('causes')
        if causes is not None:      # the cause, not its version numbers
            status_object['details'] = {'causes': causes,
                                        'retryAfterSeconds': status_object['details'].get(
                                            'retryAfterSeconds')}
    return status, status_object


@pytest.mark.parametrize('case', sorted(CASES))
def test_the_same_answer(cluster, standin, case):
    (method, path, *body), fields = CASES[case]
    body = body[0] if body else None
    real = cluster.raw(method, path, body=body)
    ours = ask_standin(standin, method, path, body, cluster.token('admin'))
    assert compared(*ours, fields) == compared(*real, fields)


def test_the_same_refusal_of_a_wrong_token(cluster, standin):
    real = cluster.raw('GET', '/api/v1/pods', token='wrong')
    ours = ask_standin(standin, 'GET', '/api/v1/pods', token='wrong')
    assert ours[0] == real[0] == 401
    assert json.loads(ours[1]) == json.loads(real[1])


def test_the_same_bookmark(cluster, standin):
    """Bookmarks from two seconds before the watch's end, shaped as an empty pod, and only
    when the version moved past the watch's start (here: another node's pod).

    kube-apiserver sends one, sometimes a second a second later (its timer ticks
    every second, with jitter); the stand-in one. kube-apiserver sends none to
    a watch that has already passed the version (an event replayed at its
    start counts), and drops a watch from its bookmark timer for good when a
    tick finds its watch cache has dispatched nothing since it started: so a
    first pod is in the watch cache before the watch opens, and the pod that
    moves the version is created only once the watch is being served.
    """
    path = ('/api/v1/pods?watch=1&allowWatchBookmarks=true&timeoutSeconds=4'
            '&fieldSelector=spec.nodeName%3Dbookmark-node&resourceVersion=')
    quiet = ask_standin(standin, 'GET', path + standin.resource_version, token=cluster.token())
    assert quiet == (200, b'')
    cluster.create_pod('default', 'bookmark-warm-up', 'another-node')
    wait.until(lambda: _in_watch_cache(cluster, 'bookmark-warm-up'), 30,
               'the first pod in kube-apiserver\'s watch cache')
    watches = cluster.open_pod_watches()
    real = cluster.submit(cluster.raw, 'GET', path + cluster.resource_version())
    # Counted only once the watcher is registered (the gauge wraps serving it).
    wait.until(lambda: cluster.open_pod_watches() > watches, 30, 'the watch to be served')
    cluster.create_pod('default', 'bookmarked-1', 'another-node')
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        ours = pool.submit(ask_standin, standin, 'GET', path + standin.resource_version,
                           token=cluster.token())
        standin.create_pod('default', 'bookmarked-1', 'another-node')
        ours = ours.result(30)
    real = real.result(30)
    real_events = [json.loads(line) for line in real[1].splitlines()]
    our_events = [json.loads(line) for line in ours[1].splitlines()]
    assert [e['type'] for e in our_events] == ['BOOKMARK']
    assert [e['type'] for e in real_events] in (['BOOKMARK'], ['BOOKMARK'] * 2)
    for event in real_events + our_events:
        event['object']['metadata']['resourceVersion'] = 'N'
    assert our_events == real_events[:1]


def _in_watch_cache(cluster, name):
    """Whether a list served by the watch cache (``resourceVersion=0``) holds pod ``name``."""
    status, body = cluster.raw('GET', '/api/v1/pods?resourceVersion=0'
                                      '&fieldSelector=metadata.name%%3D%s' % name)
    return status == 200 and json.loads(body)['items']
