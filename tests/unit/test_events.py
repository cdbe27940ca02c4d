"""Kubernetes Events about ADD timeouts: posted through the official client, best effort."""

import logging
import os
import socket
import subprocess
import sys
import threading
import time

from kuryr_cni import apiclient
from kuryr_cni import events
from kuryr_cni.cni import request as cni_request
from tools.testbed import apiserver

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
    assert event['message'] == ('Timed out after 20s waiting for the Neutron ports of '
                                'default/web-0 to be published in its KuryrPort. Check '
                                'kuryr-controller logs.')
    assert event['count'] == 1 and event['firstTimestamp'] == event['lastTimestamp']
    posts = [r for r in server.requests() if r.method == 'POST']
    assert [r.path for r in posts] == ['/api/v1/namespaces/default/events']


def test_inactive_vifs_event_names_them(server):
    poster = poster_for(server.url)
    poster.vif_timeout(POD, {'eth0': {'active': True, 'port_id': 'p0'},
                             'eth1': {'active': False, 'port_id': 'p1'}}, 5)
    assert poster.drain(10)
    [event] = server.events()
    assert event['reason'] == 'CNITimedOutWaitingForActiveVIFs'
    assert event['message'] == ('Timed out after 5s waiting for the Neutron ports of '
                                'default/web-0 to become ACTIVE after binding '
                                '(inactive: eth1 port p1).')


def test_waiting_for_active_is_a_normal_event_naming_the_inactive_ports(server):
    poster = poster_for(server.url)
    poster.waiting_for_active(POD, {'eth0': {'active': False, 'port_id': 'p0'}})
    assert poster.drain(10)
    [event] = server.events()
    assert (event['reason'], event['type']) == ('CNIWaitingForActiveVIFs', 'Normal')
    assert event['message'] == ('Waiting for the Neutron ports of default/web-0 to become '
                                'ACTIVE after binding (inactive: eth0 port p0).')


def test_the_annotation_source_speaks_of_its_annotation_not_of_kuryr_controller(server):
    poster = poster_for(server.url, source='annotation')
    poster.vif_timeout(POD, {}, 3)
    poster.waiting_for_active(POD, {'eth0': {'active': False, 'port_id': 'p0'}})
    poster.vif_timeout(POD, {'eth0': {'active': False, 'port_id': 'p0'}}, 4)
    assert poster.drain(10)
    published, waiting, inactive = server.events()
    assert published['reason'] == 'CNITimedOutWaitingForVIFAnnotation'
    assert published['message'] == ('Timed out after 3s waiting for the VIFs of default/web-0 '
                                    'to be published in its kuryr.openstack.org/vifs '
                                    'annotation.')
    assert waiting['reason'] == 'CNIWaitingForActiveVIFs'
    assert inactive['reason'] == 'CNITimedOutWaitingForActiveVIFs'
    assert inactive['message'] == ('Timed out after 4s waiting for the VIFs of default/web-0 to '
                                   'be marked active in its kuryr.openstack.org/vifs annotation '
                                   '(inactive: eth0 port p0).')
    for event in (published, waiting, inactive):
        assert 'KuryrPort' not in event['message'] and 'kuryr-controller' not in event['message']
        assert 'Neutron' not in event['message']


def test_pod_without_uid_is_still_named():
    body = events.event_body(cni_request.PodRef('ns', 'p'), 'R', 'm', 'Warning', 'n')
    assert 'uid' not in body['involvedObject']


def test_events_follow_one_another_on_one_connection(server, caplog):
    # The answer must be read off the connection: the next POST on it would read
    # the old body as its status line, and fail.
    poster = poster_for(server.url)
    for name in ('web-0', 'web-1', 'web-2'):
        poster.vif_timeout(cni_request.PodRef('default', name, 'uid-' + name), {}, 1)
        assert poster.drain(10)
    assert [e['involvedObject']['name'] for e in server.events()] == ['web-0', 'web-1', 'web-2']
    assert not [r for r in caplog.records if r.getMessage().startswith('Could not post')]


def test_an_unreachable_api_never_raises():
    with socket.socket() as closed:     # a port nobody listens on
        closed.bind(('127.0.0.1', 0))
        url = 'http://127.0.0.1:%d' % closed.getsockname()[1]
        poster = poster_for(url, request_timeout=(0.5, 0.5))
        poster.vif_timeout(POD, None, 1)
        assert poster.drain(10)         # tried, failed, logged, forgotten


def test_queueing_never_waits_for_the_api():
    gate = threading.Event()

    def stuck_api():
        gate.wait(10)
        raise OSError('API unreachable')

    poster = events.EventPoster(stuck_api, 'node-1')
    poster.vif_timeout(POD, None, 1)    # returns while the poster is stuck on the gate
    assert not poster.drain(0)
    gate.set()
    assert poster.drain(10)


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
    for _ in range(10):                 # all return while the poster is stuck on the gate
        poster.vif_timeout(POD, None, 1)
    gate.set()
    assert poster.drain(10)
    dropped = [r for r in caplog.records if r.getMessage().startswith('Dropped the')]
    assert 7 <= len(dropped) <= 8      # one in flight, two queued, the rest dropped


def test_a_failed_post_never_logs_the_token(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    secret = 'tok-3f9a1c'
    token = tmp_path / 'token'
    token.write_text(secret[:4] + '\n' + secret[4:] + '\n')     # urllib3 refuses the header
    with apiserver.APIServer(token=secret) as srv:
        poster = events.EventPoster(
            lambda: apiclient.make_api_client(api_root=srv.url, token_file=str(token)),
            'node-1')
        poster.vif_timeout(POD, {}, 1)
        assert poster.drain(10)
        token.write_text(secret[::-1])                              # a wrong one: 401
        os.utime(token, ns=(time.time_ns() + 10**9,) * 2)
        poster.vif_timeout(POD, {}, 1)
        assert poster.drain(10)
        assert srv.events() == []
    failures = [r.getMessage() for r in caplog.records if 'Could not post' in r.getMessage()]
    assert len(failures) == 2
    assert 'could not be sent: ValueError' in failures[0]
    assert 'HTTP 401 Unauthorized' in failures[1]
    for part in (secret, secret[:4], secret[4:], secret[::-1]):
        assert part not in caplog.text


def test_the_daemon_imports_none_of_the_clients_api_classes_or_models():
    """The generated API classes and their models are ~21 MiB in every process of the
    daemon, for requests kuryr_cni.apirequest builds itself (benchmark.rst, "Where the
    memory goes"): after every import the daemon makes, none is loaded."""
    code = ('import sys, kuryr_cni.daemon.main as main; main.import_services(); '
            'print(sorted(m for m in sys.modules if m.startswith(%r) or m.startswith(%r)))')
    prefixes = ('kubernetes.client.api.', 'kubernetes.client.models.')
    out = subprocess.run([sys.executable, '-c', code % prefixes], capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.split('\n')[0] == '[]', out.stdout + out.stderr
