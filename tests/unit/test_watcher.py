"""The pod watcher against the Kubernetes API stand-in, through the official client."""

import collections
import json
import logging
import os
import pickle
import threading
import time

import pytest

from kuryr_cni import apiclient
from kuryr_cni import vif as vifmod
from kuryr_cni import watcher
from tools.testbed import apiserver

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

    def replace_pods(self, records):
        with self.cond:
            self.pods = pickle.loads(pickle.dumps(records))
            self.replaces += 1
            self.cond.notify_all()

    def put_pod(self, key, record):
        with self.cond:
            self.pods[key] = pickle.loads(pickle.dumps(record))
            self.cond.notify_all()

    def drop_pod(self, key):
        with self.cond:
            self.pods.pop(key, None)
            self.cond.notify_all()

    def mark_synced(self, synced):
        with self.cond:
            self.synced = synced
            self.synced_history.append(synced)
            self.cond.notify_all()

    def wait_for(self, predicate, what):
        with self.cond:
            assert self.cond.wait_for(lambda: predicate(self), WAIT), 'timed out: ' + what


class Harness:
    """A watcher running in a thread, with its sink and callback counts."""

    def __init__(self, server, **kwargs):
        self.server = server
        self.sink = Sink()
        self.restarts = []
        self.event_types = collections.Counter()
        self.api = apiclient.make_api_client(api_root=server.url)
        kwargs.setdefault('watch_timeout', 300)
        kwargs.setdefault('backoff_max', 0.2)
        self.watcher = watcher.PodWatcher(self.api, NODE, self.sink,
                                          on_restart=self._restarted, on_event=self._event,
                                          **kwargs)
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.watcher.run, args=(self.stop_event,))

    def _restarted(self, reason):
        with self.sink.cond:
            self.restarts.append(reason)
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
    assert listed.query['fieldSelector'] == 'spec.nodeName=' + NODE
    watched = h.wait_for_watch(lambda r: True, 'the watch')
    assert watched.query['resourceVersion'] == server.resource_version
    assert watched.query['allowWatchBookmarks'] == 'true'
    assert h.restarts == []


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


def test_410_after_compaction_relists(run):
    # Bookmarks off: the watcher's version falls behind while other nodes' pods change.
    with apiserver.APIServer(bookmark_interval=60) as srv:
        srv.create_pod('default', 'a', NODE, uid='uid-a')
        h = run(srv, watch_timeout=1)
        srv.create_pod('default', 'elsewhere', 'node-2')
        srv.compact()
        h.sink.wait_for(lambda s: s.replaces == 2, 'the relist')
        h.sink.wait_for(lambda s: h.restarts == ['expired'], 'on_restart')
        assert len(h.lists()) == 2
        assert set(h.sink.pods) == {'default/a'}
        h.close()


def test_http_410_relists_too(run):
    with apiserver.APIServer(bookmark_interval=60, expired_as='http') as srv:
        h = run(srv, watch_timeout=1)
        srv.create_pod('default', 'elsewhere', 'node-2')
        srv.compact()
        h.sink.wait_for(lambda s: s.replaces == 2, 'the relist')
        assert h.restarts == ['expired']
        h.close()


def test_outage_then_catch_up_from_the_last_version(server, run):
    server.create_pod('default', 'a', NODE, uid='uid-a')
    server.create_pod('default', 'b', NODE, uid='uid-b')
    h = run()

    h.wait_streaming()
    server.stop()
    server.delete_pod('default', 'a')
    server.set_vifs('default', 'b', vifs(10))
    server.create_pod('default', 'c', NODE, uid='uid-c')
    server.start()

    h.sink.wait_for(lambda s: set(s.pods) == {'default/b', 'default/c'}
                    and s.pods['default/b']['vifs'] == expected_vifs(10), 'catch up')
    h.sink.wait_for(lambda s: h.restarts == ['error'], 'on_restart')
    assert len(h.lists()) == 1          # resumed, the log still held the changes
    assert h.sink.synced_history == [True]


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


def test_a_long_outage_marks_the_sink_unsynced_until_a_relist(server, run):
    server.create_pod('default', 'a', NODE, uid='uid-a')
    h = run(unsynced_after=0.3)
    h.wait_streaming()
    server.stop()
    h.sink.wait_for(lambda s: s.synced is False, 'unsynced')
    assert set(h.sink.pods) == {'default/a'}     # stale, but kept
    server.start()
    h.sink.wait_for(lambda s: s.synced is True, 'synced again')
    assert h.sink.synced_history == [True, False, True]
    assert len(h.lists()) == 2


def test_stop_event_cuts_a_quiet_watch(run):
    with apiserver.APIServer(bookmark_interval=60) as srv:
        h = run(srv, watch_timeout=300)
        srv.create_pod('default', 'a', NODE, uid='uid-a')
        h.sink.wait_for(lambda s: 'default/a' in s.pods, 'the stream to be open')
        started = time.monotonic()
        h.stop_event.set()
        h.thread.join(WAIT)
        assert not h.thread.is_alive()
        assert time.monotonic() - started < 2
        h.close()


class _Retrying(logging.Handler):
    def __init__(self):
        super().__init__()
        self.seen = threading.Event()

    def emit(self, record):
        if 'retrying' in record.getMessage():
            self.seen.set()


def test_stop_during_backoff_returns_promptly(server, run):
    h = run(backoff_max=60, backoff_initial=30)
    retrying = _Retrying()
    logging.getLogger(watcher.__name__).addHandler(retrying)
    try:
        h.wait_streaming()
        server.stop()
        assert retrying.seen.wait(WAIT)      # it failed and is now in a 15 to 30 s backoff
    finally:
        logging.getLogger(watcher.__name__).removeHandler(retrying)
    started = time.monotonic()
    h.watcher.stop()
    h.thread.join(WAIT)
    assert not h.thread.is_alive()
    assert time.monotonic() - started < 2


def test_backoff_grows_with_jitter_and_is_capped():
    api = apiclient.make_api_client(api_root='http://127.0.0.1:9')
    w = watcher.PodWatcher(api, NODE, Sink(), backoff_max=8, backoff_initial=1)
    api.close()
    for failures, ceiling in ((1, 1), (2, 2), (3, 4), (4, 8), (5, 8), (500, 8)):
        w._failures = failures
        delays = {w._backoff_delay() for _ in range(50)}
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(delays) > 1


def test_bearer_token_is_read_from_its_file_and_rotated(server, tmp_path):
    token = tmp_path / 'token'
    token.write_text('first\n')
    api = apiclient.make_api_client(api_root=server.url + '/', token_file=str(token))
    sink = Sink()
    w = watcher.PodWatcher(api, NODE, sink, watch_timeout=1)
    stop = threading.Event()
    thread = threading.Thread(target=w.run, args=(stop,))
    thread.start()
    try:
        sink.wait_for(lambda s: s.synced, 'sync')
        token.write_text('second\n')
        os.utime(token, ns=(time.time_ns() + 10**9,) * 2)
        assert server.wait_for_request(
            lambda r: r.headers.get('authorization') == 'Bearer second', WAIT)
    finally:
        stop.set()
        thread.join(WAIT)
        api.close()
    assert server.requests()[0].headers['authorization'] == 'Bearer first'
