"""Kubernetes Events about ADD timeouts: posted through the official client, best effort."""

import socket
import threading
import time


from kuryr_cni import apiclient
from kuryr_cni import events
from kuryr_cni.cni import request as cni_request

POD = cni_request.PodRef('default', 'web-0', 'uid-web-0')


def poster_for(url, **kwargs):
    return events.EventPoster(lambda: apiclient.make_api_client(api_root=url), 'node-1',
                              **kwargs)


def test_no_vifs_event_lands_on_the_pod(server):
    poster = poster_for(server.url)
    poster.vif_timeout(POD, {}, 20)
    assert poster.drain(10)
    [event] = server.events()
    assert event['reason'] == 'CNITimeoutKuryrPortRegistry' and event['type'] == 'Warning'
    assert event['involvedObject'] == {'apiVersion': 'v1', 'kind': 'Pod',
                                       'namespace': 'default', 'name': 'web-0',
                                       'uid': 'uid-web-0'}
    assert event['metadata']['namespace'] == 'default'
    assert event['metadata']['name'].startswith('web-0.')
    assert event['source'] == {'component': 'kuryr-daemon', 'host': 'node-1'}
    assert 'Timed out after 20s waiting for the ports of default/web-0 to be published' \
        in event['message']
    assert event['count'] == 1 and event['firstTimestamp'] == event['lastTimestamp']
    posts = [r for r in server.requests() if r.method == 'POST']
    assert [r.path for r in posts] == ['/api/v1/namespaces/default/events']


def test_inactive_vifs_event_names_them(server):
    poster = poster_for(server.url)
    poster.vif_timeout(POD, {'eth0': {'active': True}, 'eth1': {'active': False}}, 5)
    assert poster.drain(10)
    [event] = server.events()
    assert event['reason'] == 'CNITimedOutWaitingForActiveVIFs'
    assert event['message'].endswith('to become ACTIVE (inactive: eth1)')


def test_pod_without_uid_is_still_named():
    body = events.event_body(cni_request.PodRef('ns', 'p'), 'R', 'm', 'Warning', 'n')
    assert 'uid' not in body['involvedObject']


def test_an_unreachable_api_never_blocks_or_raises():
    with socket.socket() as closed:     # a port nobody listens on
        closed.bind(('127.0.0.1', 0))
        url = 'http://127.0.0.1:%d' % closed.getsockname()[1]
        poster = poster_for(url, request_timeout=(0.5, 0.5))
        started = time.monotonic()
        poster.vif_timeout(POD, None, 1)
        assert time.monotonic() - started < 0.1
        assert poster.drain(10)         # tried, failed, logged, forgotten


def test_a_broken_client_configuration_costs_only_the_events():
    def broken():
        raise OSError('no kubeconfig')
    poster = events.EventPoster(broken, 'node-1')
    poster.vif_timeout(POD, None, 1)
    assert poster.drain(10)


def test_a_full_queue_drops_instead_of_waiting(caplog):
    gate = threading.Event()

    def stuck_api():
        gate.wait(10)
        raise OSError('API unreachable')

    poster = events.EventPoster(stuck_api, 'node-1', queue_size=2)
    started = time.monotonic()
    for _ in range(10):
        poster.vif_timeout(POD, None, 1)
    assert time.monotonic() - started < 0.5
    gate.set()
    assert poster.drain(10)
    dropped = [r for r in caplog.records if r.getMessage().startswith('Dropped the')]
    assert 7 <= len(dropped) <= 8      # one in flight, two queued, the rest dropped
