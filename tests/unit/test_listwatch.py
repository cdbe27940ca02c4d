"""The list+watch with the pod annotation source, against the API stand-in, through the
official client."""

import collections
import json
import logging
import os
import pickle
import shutil
import socket
import threading
import time

import certifi
from kubernetes import client
from kubernetes.config import incluster_config
from oslo_log import log as oslo_logging
import pytest

from kuryr_cni import apiclient
from kuryr_cni import listwatch
from kuryr_cni import metrics
from kuryr_cni import vif as vifmod
from kuryr_cni.vifsource import annotation
from kuryr_cni.vifsource import kuryrport
from tools.testbed import apiserver

from tests import wait

pytestmark = pytest.mark.usefixtures('no_leftover_threads')

NODE = 'node-1'
WAIT = 10        # seconds; outcomes arrive much sooner, this only bounds a failing test


def vifs(index, active=True):
    return {'eth0': {'kind': 'bridge', 'port_id': 'port-%d' % index,
                     'mac': 'fa:16:3e:00:00:%02x' % index, 'mtu': 1450, 'bridge': 'kuryr-br0',
                     'ips': ['10.10.0.%d/24' % index], 'gateway': '10.10.0.1', 'active': active}}


def expected_vifs(index, active=True):
    parsed = vifmod.parse_annotation(json.dumps(vifs(index, active)))
    return {name: v.to_dict() for name, v in parsed.items()}


class Sink:
    """The registry's sink interface, in memory.

    Records go through pickle, as they would through a multiprocessing.Manager,
    so anything but small plain values fails here as it would there.
    """

    def __init__(self):
        self.cond = threading.Condition()
        self.pods = {}
        self.synced = None
        self.synced_history = []
        self.replaces = 0
        self.puts = 0
        self.timeline = None        # a list to record mark_synced calls in, in order

    def replace_pods(self, records):
        with self.cond:
            self.pods = pickle.loads(pickle.dumps(records))
            self.replaces += 1
            self.cond.notify_all()

    def put_pod(self, key, record):
        with self.cond:
            self.pods[key] = pickle.loads(pickle.dumps(record))
            self.puts += 1
            self.cond.notify_all()

    def drop_pod(self, key):
        with self.cond:
            self.pods.pop(key, None)
            self.cond.notify_all()

    def mark_synced(self, synced):
        with self.cond:
            self.synced = synced
            self.synced_history.append(synced)
            if self.timeline is not None:
                self.timeline.append(('synced', synced))
            self.cond.notify_all()

    def wait_for(self, predicate, what):
        with self.cond:
            assert self.cond.wait_for(lambda: predicate(self), WAIT), 'timed out: ' + what


class RecordingStop(threading.Event):
    """The stop event, which also records each backoff wait in the harness's timeline."""

    def __init__(self, timeline, cond):
        super().__init__()
        self.timeline, self.cond = timeline, cond

    def wait(self, timeout=None):
        if timeout is not None and threading.current_thread().name != 'watch-stopper':
            with self.cond:
                self.timeline.append(('wait', timeout))
                self.cond.notify_all()
        return super().wait(timeout)


class Harness:
    """A list+watch running in a thread, with its sink, callback counts and a timeline of
    its restarts and backoff waits."""

    def __init__(self, server, token_file=None, source=annotation.PodAnnotations, **kwargs):
        self.server = server
        self.sink = Sink()
        self.restarts = []
        self.timeline = []
        self.activity = 0
        self.event_types = collections.Counter()
        self.api = apiclient.make_api_client(api_root=server.url, token_file=token_file)
        kwargs.setdefault('watch_timeout', 300)
        kwargs.setdefault('backoff_max', 0.2)
        self.skipped = collections.Counter()
        kwargs.setdefault('on_skip', self._skip)
        self.watcher = listwatch.ListWatch(source(self.api, NODE), self.sink,
                                           on_restart=self._restarted, on_event=self._event,
                                           on_activity=self._active, **kwargs)
        self.stop_event = RecordingStop(self.timeline, self.sink.cond)
        self.thread = threading.Thread(target=self.watcher.run, args=(self.stop_event,))

    def _restarted(self, reason):
        with self.sink.cond:
            self.restarts.append(reason)
            self.timeline.append(('restart', reason))
            self.sink.cond.notify_all()

    def _active(self):
        with self.sink.cond:
            self.activity += 1
            self.sink.cond.notify_all()

    def _skip(self, reason):
        with self.sink.cond:
            self.skipped[reason] += 1
            self.sink.cond.notify_all()

    def _event(self, kind):
        with self.sink.cond:
            self.event_types[kind] += 1
            self.sink.cond.notify_all()

    def start(self):
        self.thread.start()
        self.sink.wait_for(lambda s: s.synced, 'initial sync')
        return self

    def close(self):
        self.stop_event.set()
        self.thread.join(WAIT)
        self.api.close()
        assert not self.thread.is_alive(), 'the watcher did not stop'

    def wait_streaming(self):
        """Wait for a bookmark: the watch stream is open (not merely requested)."""
        with self.sink.cond:
            seen = self.event_types['BOOKMARK']
        self.sink.wait_for(lambda s: self.event_types['BOOKMARK'] > seen, 'a bookmark')

    def lists(self):
        return [r for r in self.server.requests() if r.path == '/api/v1/pods' and not r.is_watch]

    def watches(self):
        return [r for r in self.server.requests() if r.path == '/api/v1/pods' and r.is_watch]

    def wait_for_watch(self, predicate, what):
        found = self.server.wait_for_request(
            lambda r: r.path == '/api/v1/pods' and r.is_watch and predicate(r), WAIT)
        assert found is not None, 'timed out: ' + what
        return found


@pytest.fixture
def harnesses():
    started = []
    yield started
    for harness in started:
        harness.close()


@pytest.fixture
def run(server, harnesses):
    def start(srv=None, **kwargs):
        harness = Harness(srv or server, **kwargs)
        harnesses.append(harness)
        return harness.start()
    return start


def test_initial_list_fills_the_sink_with_this_nodes_pods(server, run):
    server.create_pod('default', 'a', NODE, uid='uid-a',
                      annotations={vifmod.ANNOTATION: json.dumps(vifs(5))})
    server.create_pod('other', 'b', NODE, uid='uid-b')
    server.create_pod('default', 'elsewhere', 'node-2',
                      annotations={vifmod.ANNOTATION: json.dumps(vifs(6))})

    h = run()

    assert h.sink.pods == {
        'default/a': {'uid': 'uid-a', 'vifs': expected_vifs(5), 'error': None, 'deleting': False},
        'other/b': {'uid': 'uid-b', 'vifs': {}, 'error': None, 'deleting': False},
    }
    (listed,) = h.lists()
    assert listed.query['fieldSelector'].startswith('spec.nodeName=%s,' % NODE)
    assert listed.query['resourceVersion'] == '0'      # any version: the watch cache serves it
    watched = h.wait_for_watch(lambda r: True, 'the watch')
    assert watched.query['resourceVersion'] == server.resource_version
    assert watched.query['allowWatchBookmarks'] == 'true'
    assert h.restarts == []
    assert h.activity >= 1          # the list counts as watch activity


def test_added_modified_deleted_reach_the_sink(server, run):
    h = run()
    server.create_pod('default', 'a', NODE, uid='uid-a')
    h.sink.wait_for(lambda s: 'default/a' in s.pods, 'ADDED')
    server.set_vifs('default', 'a', vifs(7, active=False))
    server.set_vifs('default', 'a', vifs(7))
    h.sink.wait_for(lambda s: s.pods['default/a']['vifs'] == expected_vifs(7), 'MODIFIED')
    server.delete_pod('default', 'a', grace_period=30)
    h.sink.wait_for(lambda s: s.pods['default/a']['deleting'], 'deletionTimestamp')
    server.delete_pod('default', 'a')
    h.sink.wait_for(lambda s: 'default/a' not in s.pods, 'DELETED')

    assert h.event_types['ADDED'] == 1
    assert h.event_types['MODIFIED'] == 3
    assert h.event_types['DELETED'] == 1
    assert len(h.lists()) == 1
    assert h.activity == 1 + 5      # the list and each event


def test_an_event_that_changes_no_record_writes_nothing(server, run):
    server.create_pod('default', 'a', NODE, uid='uid-a',
                      annotations={vifmod.ANNOTATION: json.dumps(vifs(4, active=False))})
    h = run()
    h.wait_streaming()
    for phase in ('Pending', 'Running'):        # kubelet's status updates
        server.update_pod('default', 'a', phase=phase)
    server.set_vifs('default', 'a', vifs(4))
    h.sink.wait_for(lambda s: s.pods['default/a']['vifs'] == expected_vifs(4), 'the change')

    assert h.event_types['MODIFIED'] == 3
    assert h.sink.puts == 1         # the VIF's change alone


def test_bad_annotation_gives_an_error_record_and_the_loop_goes_on(server, run, caplog):
    caplog.set_level(logging.WARNING)
    h = run()
    server.create_pod('default', 'a', NODE, uid='uid-a',
                      annotations={vifmod.ANNOTATION: '{not json'})
    broken = vifs(8)
    broken['eth0']['kind'] = 'teleport'
    server.create_pod('default', 'b', NODE, uid='uid-b',
                      annotations={vifmod.ANNOTATION: json.dumps(broken)})
    h.sink.wait_for(lambda s: 'default/b' in s.pods, 'both pods')

    a, b = h.sink.pods['default/a'], h.sink.pods['default/b']
    assert (a['vifs'], b['vifs']) == ({}, {})
    assert 'not JSON' in a['error']
    assert 'teleport' in b['error']
    assert len([r for r in caplog.records if 'default/a' in r.getMessage()]) == 1

    server.set_vifs('default', 'a', vifs(9))
    h.sink.wait_for(lambda s: s.pods['default/a']['error'] is None, 'the fix')
    assert h.sink.pods['default/a']['vifs'] == expected_vifs(9)


def test_unusable_api_objects_are_skipped(server, run):
    server.create('pods', {'metadata': {'namespace': 'default', 'name': 'no-uid', 'uid': ''},
                           'spec': {'nodeName': NODE}})
    server.create_pod('default', 'a', NODE, uid='uid-a')
    h = run()
    assert set(h.sink.pods) == {'default/a'}
    server.create('pods', {'metadata': {'namespace': 'default', 'name': 'no-uid-2', 'uid': ''},
                           'spec': {'nodeName': NODE}})
    server.create_pod('default', 'b', NODE, uid='uid-b')
    h.sink.wait_for(lambda s: 'default/b' in s.pods, 'the pod after the bad one')
    assert set(h.sink.pods) == {'default/a', 'default/b'}


def test_a_normal_watch_end_resumes_without_relisting(server, run):
    h = run(watch_timeout=1)
    server.create_pod('default', 'a', NODE, uid='uid-a')
    h.sink.wait_for(lambda s: 'default/a' in s.pods, 'ADDED')
    # Events for other nodes move the version on; only bookmarks tell the watcher.
    server.create_pod('default', 'elsewhere', 'node-2')
    latest = server.resource_version
    h.wait_for_watch(lambda r: r.query['resourceVersion'] == latest,
                     'a watch resumed from the bookmarked version')

    assert len(h.lists()) == 1
    assert h.sink.replaces == 1
    assert h.restarts == []
    assert h.event_types['BOOKMARK'] > 0
    versions = [int(w.query['resourceVersion']) for w in h.watches()]
    assert versions == sorted(versions)


def test_410_after_compaction_relists_from_the_watch_cache(run):
    # No periodic bookmarks: the version falls behind while other nodes' pods change.
    with apiserver.APIServer() as srv:
        srv.create_pod('default', 'a', NODE, uid='uid-a')
        h = run(srv, watch_timeout=10)
        watched = h.wait_for_watch(lambda r: True, 'the watch').query['resourceVersion']
        srv.create_pod('default', 'elsewhere', 'node-2')
        srv.restart()           # a restarted kube-apiserver has no history: 410 on resume
        h.sink.wait_for(lambda s: s.replaces == 2, 'the relist')
        # ('error' first, unless the restart caught the watch before its answer, and
        # urllib3's one retry sent it again.)
        h.sink.wait_for(lambda s: h.restarts[-1:] == ['expired'], 'on_restart')
        first, relist = h.lists()
        # Not older than what it had seen: never back in time, and served from the cache.
        assert relist.query['resourceVersion'] == watched
        assert set(h.sink.pods) == {'default/a'}
        h.close()


def test_http_410_relists_too(run):
    with apiserver.APIServer(expired_as='http') as srv:
        h = run(srv, watch_timeout=10)
        h.wait_for_watch(lambda r: True, 'the watch')
        srv.create_pod('default', 'elsewhere', 'node-2')
        srv.restart()
        h.sink.wait_for(lambda s: s.replaces == 2, 'the relist')
        # on_restart comes once the relist was answered, maybe after its replace.
        h.sink.wait_for(lambda s: h.restarts, 'on_restart')
        assert h.restarts == ['expired']        # the resume was refused, never answered
        h.close()


def test_a_list_refused_as_too_new_lists_the_latest(server, harnesses):
    # An etcd restored from a backup is behind the version the watcher asks for.
    h = Harness(server)
    harnesses.append(h)
    h.watcher._list_rv = '999999'         # as after a 410 at that version
    h.start()
    refused, latest = h.lists()
    assert refused.query['resourceVersion'] == '999999'
    assert 'resourceVersion' not in latest.query      # the latest, from etcd
    assert h.restarts == ['expired']


def test_outage_then_catch_up_from_the_last_version(server, run):
    server.create_pod('default', 'a', NODE, uid='uid-a')
    server.create_pod('default', 'b', NODE, uid='uid-b')
    h = run()

    h.wait_streaming()
    server.stop()           # an outage of this server; the cluster's history stays whole
    server.delete_pod('default', 'a')
    server.set_vifs('default', 'b', vifs(10))
    server.create_pod('default', 'c', NODE, uid='uid-c')
    server.start()

    h.sink.wait_for(lambda s: set(s.pods) == {'default/b', 'default/c'}
                    and s.pods['default/b']['vifs'] == expected_vifs(10), 'catch up')
    h.sink.wait_for(lambda s: h.restarts == ['error'], 'on_restart')
    assert len(h.lists()) == 1          # resumed, the log still held the changes
    h.sink.wait_for(lambda s: s.synced_history == [True, False, True], 'synced again')


def test_outage_then_compaction_relists(server, run):
    server.create_pod('default', 'a', NODE, uid='uid-a')
    h = run()
    h.wait_streaming()
    server.stop()
    server.delete_pod('default', 'a')
    server.create_pod('default', 'c', NODE, uid='uid-c')
    server.compact()
    server.start()
    h.sink.wait_for(lambda s: s.replaces == 2, 'the relist')
    assert set(h.sink.pods) == {'default/c'}
    h.sink.wait_for(lambda s: h.restarts == ['error', 'expired'], 'on_restart %s' % h.restarts)


def test_unsynced_from_the_first_failure_until_the_watch_resumes(server, run):
    server.create_pod('default', 'a', NODE, uid='uid-a')
    h = run(backoff_initial=0.2)
    h.wait_streaming()
    with h.sink.cond:
        h.sink.timeline = h.timeline
        h.timeline.clear()
    server.stop()
    h.sink.wait_for(lambda s: ('synced', False) in h.timeline, 'unsynced')
    assert set(h.sink.pods) == {'default/a'}     # stale, but kept
    server.start()
    h.sink.wait_for(lambda s: s.synced, 'synced again')
    # Unsynced at the first failure, before any backoff; synced again by the resumed watch.
    assert h.timeline[:2] == [('synced', False), ('wait', h.timeline[1][1])]
    assert h.timeline[-2:] == [('restart', 'error'), ('synced', True)]
    assert len(h.lists()) == 1


def test_the_backoff_starts_over_once_the_api_answers(server, run):
    server.create_pod('default', 'a', NODE, uid='uid-a')
    h = run(backoff_initial=0.01, backoff_max=30)
    h.wait_streaming()
    server.stop()
    h.sink.wait_for(lambda s: len(h.timeline) >= 6, 'six failures')
    with h.sink.cond:
        grown = max(timeout for kind, timeout in h.timeline if kind == 'wait')
    server.create_pod('default', 'b', NODE, uid='uid-b')   # the history moves on meanwhile
    server.restart()        # and a restarted server has none: the resume gets 410

    h.sink.wait_for(lambda s: h.restarts == ['error', 'expired'], 'the resume, then the relist')
    with h.sink.cond:
        after = h.timeline[h.timeline.index(('restart', 'error')):]
    # The 410 came on a connection just answered: relisted at once, no backoff between.
    assert after == [('restart', 'error'), ('restart', 'expired')]
    assert set(h.sink.pods) == {'default/a', 'default/b'}

    server.stop()
    h.sink.wait_for(lambda s: h.timeline[-1][0] == 'wait', 'the next failure')
    with h.sink.cond:
        first_wait = h.timeline[-1][1]
    assert first_wait <= 0.01 < grown       # from the start again, not where it had grown to
    server.start()


def test_an_error_answer_after_an_outage_starts_the_backoff_over(server_with_token, run,
                                                                 tmp_path):
    token = tmp_path / 'token'
    token.write_text('s3cret\n')
    h = run(server_with_token, token_file=str(token), backoff_initial=0.01, backoff_max=30)
    server_with_token.stop()
    h.sink.wait_for(lambda s: len(h.timeline) >= 6, 'six failures while unreachable')
    token.write_text('revoked\n')          # back, but refusing: 401 (1.20 says 403 a while)
    os.utime(token, ns=(time.time_ns() + 10**9,) * 2)
    with h.sink.cond:
        outage = len(h.timeline)
    server_with_token.start()
    h.sink.wait_for(lambda s: len(h.timeline) >= outage + 4, 'refusals')
    with h.sink.cond:
        grown = h.timeline[outage - 1][1]
        waits = [t for _, t in h.timeline[outage:]]
    # Started over at the first refusal (grown waits before it at most) ...
    assert grown > 0.01 and min(waits) <= 0.01
    assert waits[-1] > 0.01             # ... and growing again with the refusals that follow
    assert h.thread.is_alive()


@pytest.fixture
def server_with_token():
    srv = apiserver.APIServer(token='s3cret')
    yield srv
    srv.close()


def test_stop_event_cuts_a_quiet_watch(run):
    with apiserver.APIServer() as srv:
        h = run(srv, watch_timeout=300)
        srv.create_pod('default', 'a', NODE, uid='uid-a')
        h.sink.wait_for(lambda s: 'default/a' in s.pods, 'the stream to be open')
        h.stop_event.set()
        h.thread.join(WAIT)     # a watch of 300 s: only the cut ends it within WAIT
        assert not h.thread.is_alive()
        h.close()


def test_stop_during_backoff_returns_promptly(server, run):
    h = run(backoff_max=60, backoff_initial=30)
    h.wait_streaming()
    server.stop()
    h.sink.wait_for(lambda s: h.timeline and h.timeline[-1][0] == 'wait',
                    'the first backoff, 15 to 30 s')
    h.watcher.stop()
    h.thread.join(WAIT)
    assert not h.thread.is_alive()


def test_an_awaited_object_cuts_the_backoff_short(server, run):
    """A CNI request waiting for a pod not seen: the watcher does not sit out a 15-30 s
    backoff once the server is back."""
    awaited = threading.Event()
    h = run(backoff_initial=30, backoff_max=60, awaited=awaited.is_set)
    h.wait_streaming()
    server.stop()
    h.sink.wait_for(lambda s: s.synced is False, 'the failure')
    server.create_pod('default', 'new', NODE, uid='uid-new')
    server.start()
    awaited.set()
    h.sink.wait_for(lambda s: 'default/new' in s.pods, 'the new pod, well before 15 s')
    assert h.restarts == ['error']


def test_early_retries_are_spaced_and_the_spacing_grows(server, run, caplog):
    """While the server stays down, a request still waiting gets early retries at most
    one per EARLY_FIRST s, the spacing doubling: a fleet of nodes cannot stampede."""
    caplog.set_level(logging.INFO)
    h = run(backoff_initial=30, backoff_max=60, awaited=lambda: True)
    h.wait_streaming()
    server.stop()

    def retried():
        return [r.created for r in caplog.records if 'retrying the API server' in r.getMessage()]
    wait.until(lambda: len(retried()) >= 3, WAIT, 'three early retries')
    first, second, third = retried()[:3]
    assert second - first >= listwatch.EARLY_FIRST
    assert third - second >= 2 * listwatch.EARLY_FIRST


def test_backoff_grows_with_jitter_and_is_capped():
    api = apiclient.make_api_client(api_root='http://127.0.0.1:9')
    w = listwatch.ListWatch(annotation.PodAnnotations(api, NODE), Sink(), backoff_max=8,
                            backoff_initial=1)
    api.close()
    for failures, ceiling in ((1, 1), (2, 2), (3, 4), (4, 8), (5, 8), (500, 8)):
        w._failures = failures
        delays = {w._backoff_delay() for _ in range(50)}
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(delays) > 1


# The bearer token ----------------------------------------------------------------------

def test_bearer_token_is_read_from_its_file_and_rotated(server, run, tmp_path):
    token = tmp_path / 'token'
    token.write_text('first\n')
    h = run(token_file=str(token), watch_timeout=1)
    token.write_text('second\n')
    os.utime(token, ns=(time.time_ns() + 10**9,) * 2)
    assert server.wait_for_request(
        lambda r: r.headers.get('authorization') == 'Bearer second', WAIT)
    assert server.requests()[0].headers['authorization'] == 'Bearer first'
    h.close()


def test_a_kubeconfig_token_file_ending_in_a_newline_is_sent_stripped(tmp_path):
    (tmp_path / 'token').write_text('s3cret\n')
    with apiserver.APIServer(token='s3cret') as srv:
        kubeconfig = tmp_path / 'kubeconfig'
        kubeconfig.write_text(json.dumps({
            'apiVersion': 'v1', 'kind': 'Config', 'current-context': 'c',
            'clusters': [{'name': 'k', 'cluster': {'server': srv.url}}],
            'users': [{'name': 'u', 'user': {'tokenFile': str(tmp_path / 'token')}}],
            'contexts': [{'name': 'c', 'context': {'cluster': 'k', 'user': 'u'}}]}))
        api = apiclient.make_api_client(kubeconfig=str(kubeconfig))
        try:
            pods = client.CoreV1Api(api).list_pod_for_all_namespaces(_request_timeout=5)
        finally:
            api.close()
        assert pods.items == []
        assert srv.requests()[0].headers['authorization'] == 'Bearer s3cret'


def test_the_in_cluster_token_is_stripped_and_rotated(tmp_path, monkeypatch):
    token, ca = tmp_path / 'token', tmp_path / 'ca.crt'
    token.write_text('s3cret\n')
    shutil.copy(certifi.where(), ca)     # any valid bundle: no request is made
    monkeypatch.setattr(incluster_config, 'SERVICE_TOKEN_FILENAME', str(token))
    monkeypatch.setattr(incluster_config, 'SERVICE_CERT_FILENAME', str(ca))
    monkeypatch.setenv('KUBERNETES_SERVICE_HOST', '192.0.2.1')
    monkeypatch.setenv('KUBERNETES_SERVICE_PORT', '443')
    api = apiclient.make_api_client()
    try:
        assert api.configuration.host == 'https://192.0.2.1:443'
        assert api.configuration.auth_settings()['BearerToken']['value'] == 'Bearer s3cret'
        token.write_text('rotated\n')
        os.utime(token, ns=(time.time_ns() + 10**9,) * 2)
        assert api.configuration.auth_settings()['BearerToken']['value'] == 'Bearer rotated'
    finally:
        api.close()


class LogRecords(logging.Handler):
    """Every record of every logger, formatted with its traceback, and a wait for one."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.cond = threading.Condition()
        self.texts = []

    def emit(self, record):
        with self.cond:
            self.texts.append(logging.Formatter().format(record))
            self.cond.notify_all()

    def wait_for(self, substring):
        with self.cond:
            assert self.cond.wait_for(lambda: any(substring in t for t in self.texts), WAIT), \
                'no log line with %r' % substring

    def __enter__(self):
        root = logging.getLogger()
        self.root_level = root.level
        root.setLevel(logging.DEBUG)
        root.addHandler(self)
        return self

    def __exit__(self, *exc):
        root = logging.getLogger()
        root.removeHandler(self)
        root.setLevel(self.root_level)


def test_no_failure_path_logs_the_token(tmp_path, harnesses):
    secret = 'tok-3f9a1c'
    token = tmp_path / 'token'
    with LogRecords() as logs, apiserver.APIServer(token=secret) as srv:
        def watch_until(message, api_root=srv.url):
            h = Harness(srv, token_file=str(token), backoff_max=0.05)
            harnesses.append(h)
            h.api.configuration.host = api_root
            h.thread.start()
            logs.wait_for(message)
            assert h.thread.is_alive()          # logged, and still trying
            h.close()

        token.write_text(secret[::-1] + '\n')                 # a wrong token: 401
        watch_until('HTTP 401 Unauthorized: Unauthorized')
        token.write_text(secret[:4] + '\n' + secret[4:] + '\n')  # urllib3 refuses the header
        watch_until('could not be sent: ValueError')
        token.write_text(secret + '\n')                        # the right one: it works
        with socket.socket() as closed:                         # and nobody listens: refused
            closed.bind(('127.0.0.1', 0))
            watch_until('Connection refused', 'http://127.0.0.1:%d' % closed.getsockname()[1])
        h = Harness(srv, token_file=str(token))
        harnesses.append(h)
        h.start()
        h.wait_for_watch(lambda r: True, 'the watch')
        srv.create_pod('default', 'elsewhere', 'node-2')
        srv.restart()                                           # a broken stream, then 410
        h.sink.wait_for(lambda s: h.restarts[-1:] == ['expired'], 'the relist')
    text = '\n'.join(logs.texts)
    assert 'retrying' in text and 'relisting' in text
    for part in (secret, secret[:4], secret[4:], secret[::-1]):
        assert part not in text


# A server over the watcher's limits (issue 20) ---------------------------------------

@pytest.fixture
def hostile():
    """Factory of :class:`tests.functional.hostile_api.HostileAPI` servers on loopback."""
    from tests.functional import hostile_api
    made = []

    def make(behaviour):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(('127.0.0.1', 0))
        sock.listen(16)
        api = hostile_api.HostileAPI(sock, behaviour)
        api.go.set()
        made.append(api)
        return api
    yield make
    for api in made:
        api.close()


@pytest.mark.parametrize('behaviour, limit, options', [
    ('endless-list', 'list_bytes', {'list_max_bytes': 1024 * 1024}),
    ('many-pods', 'object_count', {'max_objects': 100}),
    ('huge-object', 'object_size', {}),
    ('trickling-list', 'list_time', {'list_timeout': 1}),
    ('endless-watch', 'watch_time', {'watch_timeout': 1}),
])
def test_a_server_over_a_limit_is_cut_reported_once_and_backed_off_from(
        hostile, caplog, behaviour, limit, options):
    api = hostile(behaviour)
    sink = Sink()
    reported = []

    def on_limit(exceeded, problem):
        with sink.cond:
            reported.append((exceeded, problem))
            sink.cond.notify_all()

    client_ = apiclient.make_api_client(api_root=api.url)
    watcher = listwatch.ListWatch(annotation.PodAnnotations(client_, NODE), sink,
                                  backoff_max=0.2, on_limit=on_limit, **options)
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,))
    with caplog.at_level(logging.WARNING, logger='kuryr_cni.listwatch'):
        thread.start()
        try:
            sink.wait_for(lambda s: len(reported) >= 2, 'two overruns')
        finally:
            stop.set()
            thread.join(WAIT)
            client_.close()
    assert not thread.is_alive()
    assert {exceeded for exceeded, _ in reported} == {limit}
    told = [r for r in caplog.records if 'exceeded a limit' in r.getMessage()]
    assert len(told) == 1
    assert not sink.synced


ITEMS = b','.join(json.dumps({'metadata': {'name': 'p%d' % i}}).encode() for i in range(3))


@pytest.mark.parametrize('body', [
    b'{"kind":"PodList","metadata":{"resourceVersion":"42"},"items":[' + ITEMS + b']}',
    # A custom resource list, as kube-apiserver writes it: keys in alphabetical order.
    b'{"apiVersion":"openstack.org/v1","items":[' + ITEMS + b'],"kind":"KuryrPortList",'
    b'"metadata":{"continue":"","resourceVersion":"42"}}\n',
])
def test_a_list_is_decoded_as_it_arrives_and_its_version_read_from_its_head_or_tail(body):

    class Response:
        def __init__(self):
            self.data, self.reads = body, 0

        def read(self, size):
            self.reads += 1
            size = min(size, 7)                                # a few bytes at a time
            chunk, self.data = self.data[:size], self.data[size:]
            return chunk

    listing = listwatch._Listing(Response(), 1024, 'pods')
    names = [obj['metadata']['name'] for obj in listing.objects()]
    assert names == ['p0', 'p1', 'p2'] and listing.resource_version == '42'
    with pytest.raises(listwatch.Overrun) as caught:
        list(listwatch._Listing(Response(), 100, 'pods').objects())
    assert caught.value.limit == 'list_bytes'


def test_tokens_are_blanked_out_of_what_is_logged(caplog):
    apiclient._remember_secret('s3cr3t-token-value')
    log = apiclient.redacting(oslo_logging.getLogger('kuryr_cni.test_redaction'))
    with caplog.at_level(logging.INFO, logger='kuryr_cni.test_redaction'):
        log.info('server said: %s', 'Authorization: Bearer s3cr3t-token-value')
    assert caplog.records[0].getMessage() == 'server said: Authorization: Bearer <redacted>'
    assert apiclient.clip('x s3cr3t-token-value') == 'x <redacted>'


# One tenant's pod cannot wedge the node's watch (issue 31, hole 1) ----------------------

POISON_COMMAS = 270 * 1000     # one env value of commas: the probe


def pod_json(name, rv, *, env_value='', annotations=None, phase='Running'):
    """A pod of the node as the API server writes it, with one env value."""
    return {'kind': 'Pod', 'apiVersion': 'v1',
            'metadata': {'name': name, 'namespace': 'default', 'uid': 'uid-' + name,
                         'resourceVersion': str(rv), 'annotations': annotations or {}},
            'spec': {'nodeName': NODE, 'containers': [
                {'name': 'main', 'image': 'pause', 'env': [{'name': 'X', 'value': env_value}]}]},
            'status': {'phase': phase}}


class Stream:
    """A watch response's ``stream`` over the given bytes, a few KiB at a time."""

    def __init__(self, data, piece=4096):
        self.data, self.piece = data, piece

    def stream(self, amt):
        for start in range(0, len(self.data), min(amt, self.piece)):
            yield self.data[start:start + min(amt, self.piece)]


class Body:
    """A list response's ``read`` over the given bytes."""

    def __init__(self, data):
        self.data = data

    def read(self, size):
        chunk, self.data = self.data[:size], self.data[size:]
        return chunk


def list_body(*pods):
    return json.dumps({'kind': 'PodList', 'apiVersion': 'v1',
                       'metadata': {'resourceVersion': '99'}, 'items': list(pods)}).encode()


def test_commas_inside_a_string_are_one_value_not_an_overrun():
    poison = pod_json('poison', 5, env_value=',' * POISON_COMMAS)
    line = json.dumps({'type': 'ADDED', 'object': poison}).encode() + b'\n'

    (event,) = list(listwatch._events(Stream(line)))
    assert event['object']['spec']['containers'][0]['env'][0]['value'] == ',' * POISON_COMMAS
    assert not getattr(event, 'why', None)
    listing = listwatch._Listing(Body(list_body(poison, pod_json('b', 6))), 1 << 26, 'pods')
    assert [p['metadata']['name'] for p in listing.objects()] == ['poison', 'b']
    assert listing.resource_version == '99'


def test_a_poison_pod_does_not_stop_the_pod_presence_feed(server, run):
    h = run(source=kuryrport.PodPresence)
    server.create('pods', pod_json('poison', 0, env_value=',' * POISON_COMMAS))
    server.create_pod('default', 'after', NODE, uid='uid-after')
    h.sink.wait_for(lambda s: 'default/after' in s.pods, 'the pod after the poison one')
    assert h.sink.pods['default/poison'] == {'uid': 'uid-poison', 'deleting': False}
    assert h.restarts == []


# An object over the bounds, counting its structure: 300k annotations in its metadata.
TOO_MANY = listwatch.MAX_OBJECT_VALUES + 1000


def oversize_pod(name, rv=0):
    return pod_json(name, rv, annotations={'k%d' % i: '' for i in range(TOO_MANY)})


def test_an_object_over_the_bounds_is_read_for_its_identity_and_skipped():
    deep = pod_json('deep', 7)
    nested = {}
    for _ in range(listwatch.MAX_DEPTH + 10):
        nested = {'x': nested}
    deep['metadata']['annotations'] = nested
    body = list_body(pod_json('a', 5), oversize_pod('big', 6), deep, pod_json('b', 8))
    keep = listwatch.IDENTITY + annotation.PodAnnotations.keep
    listing = listwatch._Listing(Body(body), 1 << 26, 'pods', keep)
    objects = list(listing.objects())

    assert [o['metadata']['name'] for o in objects] == ['a', 'big', 'deep', 'b']
    assert [bool(getattr(o, 'why', None)) for o in objects] == [False, True, True, False]
    big = objects[1]
    assert big == {'metadata': {'name': 'big', 'namespace': 'default', 'uid': 'uid-big',
                                'resourceVersion': '6'}, 'spec': {'nodeName': NODE}}
    assert 'JSON values' in big.why and 'nested deeper' in objects[2].why
    assert listing.resource_version == '99'

    line = json.dumps({'type': 'MODIFIED', 'object': oversize_pod('big', 9)}).encode()
    events = list(listwatch._events(Stream(line + b'\n' + line.replace(b'"9"', b'"10"'))))
    assert [(e['type'], e['object']['metadata']['resourceVersion']) for e in events] == [
        ('MODIFIED', '9'), ('MODIFIED', '10')]
    assert all(e.why for e in events)


def test_an_oversize_pod_gets_an_error_record_and_the_feed_moves_past_it(server, run, caplog):
    caplog.set_level(logging.WARNING, logger='kuryr_cni.listwatch')
    server.create('pods', oversize_pod('listed'))
    h = run()
    assert 'too large' in h.sink.pods['default/listed']['error']
    poison = server.create('pods', oversize_pod('watched'))
    server.create_pod('default', 'after', NODE, uid='uid-after')
    h.sink.wait_for(lambda s: 'default/after' in s.pods, 'the pod after the poison one')

    record = h.sink.pods['default/watched']
    assert record['vifs'] == {} and 'too large' in record['error']
    assert record['uid'] == poison['metadata']['uid']
    assert h.skipped['too_large'] == 2 and h.restarts == []
    assert len(h.lists()) == 1          # never relisted, never resumed before it
    told = [r for r in caplog.records if 'default/watched' in r.getMessage()]
    assert len(told) == 1
    server.delete_pod('default', 'watched')
    h.sink.wait_for(lambda s: 'default/watched' not in s.pods, 'its deletion')


def test_terminal_pods_are_not_listed(server, run):
    for index in range(30):       # Failed and Succeeded pods keep their node
        server.create('pods', pod_json('done-%d' % index, 0,
                                       phase=('Failed', 'Succeeded')[index % 2]))
    server.create('pods', pod_json('running', 0))
    h = run(max_objects=10)
    assert set(h.sink.pods) == {'default/running'}
    (listed,) = h.lists()
    assert listed.query['fieldSelector'] == (
        'spec.nodeName=%s,status.phase!=Succeeded,status.phase!=Failed' % NODE)
    server.update_pod('default', 'running', phase='Failed')
    h.sink.wait_for(lambda s: not s.pods, 'the pod gone once Failed')


@pytest.mark.parametrize('source', [annotation.PodAnnotations, kuryrport.PodPresence])
def test_pods_are_read_for_their_metadata_only(server, run, source):
    big_env = 'x' * (1400 * 1024)           # what a 1.4 MiB pod holds
    for index in range(5):
        server.create('pods', pod_json('big-%d' % index, 0, env_value=big_env))
    h = run(source=source, list_max_bytes=4 * 1024 * 1024)
    assert len(h.sink.pods) == 5
    server.create('pods', pod_json('big-5', 0, env_value=big_env))
    h.sink.wait_for(lambda s: len(s.pods) == 6, 'the sixth')
    (listed,) = h.lists()
    assert listed.headers['accept'].startswith(
        'application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1')
    watched = h.wait_for_watch(lambda r: True, 'the watch')
    assert watched.headers['accept'].startswith(
        'application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1')


# The watch event type is a metric label (issue 31, hole 4) ------------------------------

def test_unknown_event_types_are_counted_as_other():
    api = apiclient.make_api_client(api_root='http://127.0.0.1:9')
    seen = collections.Counter()
    w = listwatch.ListWatch(annotation.PodAnnotations(api, NODE), Sink(),
                            on_event=lambda kind: seen.update([kind]))
    api.close()
    for index in range(500):
        w._handle({'type': 'TYPE-%d' % index, 'object': {}})
    w._handle({'type': 'BOOKMARK', 'object': {'metadata': {'resourceVersion': '3'}}})
    assert set(seen) <= set(listwatch.EVENT_TYPES) | {'other'}
    assert seen['other'] == 500
    # ... which are the metric's label values, created at start.
    assert metrics.WATCH_EVENT_TYPES == listwatch.EVENT_TYPES + ('other',)
    assert metrics.WATCH_SKIPS == listwatch.SKIPS


def test_what_no_real_server_sends_cuts_the_answer(monkeypatch):
    monkeypatch.setattr(listwatch, 'MAX_OBJECT_VALUES', 1000)
    monkeypatch.setattr(listwatch, 'MAX_SKIPPED_BYTES', 256 * 1024)
    head = b'{"type":"ADDED","object":{"metadata":{"name":"x"},"a":['
    # An object read for its identity alone, going on past what any real server sends ...
    endless = Stream(head + b'{},' * (listwatch.MAX_SKIPPED_BYTES // 3 + 50000))
    with pytest.raises(listwatch.Overrun) as caught:
        list(listwatch._events(endless))
    assert caught.value.limit == 'object_size' and 'one object is larger' in str(caught.value)
    # ... one string the parser would hold whole ...
    string = Stream(b'{"type":"ADDED","object":{"a":"' + b'x' * (10 * 1024 * 1024))
    with pytest.raises(listwatch.Overrun) as caught:
        list(listwatch._events(string))
    assert 'one JSON string is larger' in str(caught.value)
    # ... and a list nested without end around its items.
    with pytest.raises(listwatch._Unavailable, match='nests deeper'):
        list(listwatch._Listing(Body(b'{"x":' + b'[' * 100000), 1 << 26, 'pods').objects())
