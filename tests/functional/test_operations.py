"""The daemon as operators run it: systemd notify, health probes, metrics, kuryr-cni-ctl.

Everything is observed from outside, the way systemd, kubelet, Prometheus and
an operator see it: datagrams on the NOTIFY_SOCKET the test host listens on,
HTTP answers of /alive, /ready and /metrics inside the host namespace, and the
output and exit status of the real ``kuryr-cni-ctl``.
"""

import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from prometheus_client import parser

from kuryr_cni import metrics as metrics_mod
from kuryr_cni import version
from tools.testbed import host as testhost
from tools.testbed import runtime as testruntime

from tests import wait
from tests.functional import conftest
from tests.functional import helpers

pytestmark = pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON)

HEALTH_PORT = 8090
POD = 'web-0'
POD_KEY = 'default/' + POD
INDEX = 5
# Stuck after 3 s without a beat; the watchdog asks for a ping every 0.5 s.
HEARTBEAT = '\n[health]\nheartbeat_timeout = 3\n'
WATCHDOG_ENV = {'WATCHDOG_USEC': '1000000'}
READY = 'STATUS=Ready: 4 workers serving, watcher synced'


# --- observing the daemon -------------------------------------------------------

def read_notify(node, seconds):
    """Every notify line the daemon sends during the next ``seconds``."""
    lines = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        for message in node.notifications(timeout=min(left, 0.5)):
            lines.extend(message.split('\n'))
    return lines


def wait_notify(node, predicate, timeout):
    """Read notify lines until one satisfies ``predicate``; returns all lines read."""
    lines = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for message in node.notifications(timeout=0.5):
            lines.extend(message.split('\n'))
            if any(predicate(line) for line in message.split('\n')):
                return lines
    raise AssertionError('no matching notification in %ss; got %s; log: %s'
                         % (timeout, lines, node.log_tail()))


def probe(node, path):
    status, body = node.http_get(HEALTH_PORT, path)
    return status, json.loads(body)


def role_pids(node, role):
    return sorted(pid for pid, title in node.processes().items()
                  if title == 'kuryr-cni-daemon: ' + role)


def send(pids, sig):
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def scrape_with_requests(node, path='/metrics'):
    """GET through the ``requests`` library, run inside the host namespace."""
    code = textwrap.dedent('''
        import json, sys, requests
        r = requests.get(sys.argv[1], timeout=10)
        json.dump({"status": r.status_code, "type": r.headers["Content-Type"],
                   "text": r.text}, sys.stdout)
    ''')
    proc = subprocess.run(['ip', 'netns', 'exec', node.ns, sys.executable, '-c', code,
                           'http://127.0.0.1:%d%s' % (helpers.PROMETHEUS_PORT, path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def families(text):
    return {family.name: family for family in parser.text_string_to_metric_families(text)}


# --- the cluster side -------------------------------------------------------------

def create_pod(node, active=True):
    return node.api.create_pod('default', POD, testhost.NODE, uid='uid-web-0',
                               annotations={'kuryr.openstack.org/vifs':
                                            json.dumps(node.vifs(INDEX, active=active))})


def sandbox(node, letter):
    return testruntime.Sandbox('sandbox-%s' % letter, node.pod_netns(), POD,
                               pod_uid='uid-web-0')


# --- systemd notify -------------------------------------------------------------------

def test_ready_only_once_the_watcher_has_synced(node):
    node.api.stop()
    node.start_daemon(wait=False)
    # Serving, but the pod list cannot be had: alive, not ready, and no READY=1.
    lines = wait_notify(
        node, lambda line: line == 'STATUS=Starting: watcher not synced with the API server', 30)
    wait.until(lambda: probe(node, '/alive')[0] == 200, 20, '/alive')
    first_status, first = probe(node, '/ready')
    second_status, second = probe(node, '/ready')
    assert first_status == second_status == 503
    assert first['problems'] == ['watcher not synced with the API server']
    assert second['consecutive_failures'] == first['consecutive_failures'] + 1 >= 2
    lines += read_notify(node, 1.0)
    assert 'READY=1' not in lines

    node.api.start()
    lines = wait_notify(node, lambda line: line == 'READY=1', 60)
    assert READY in lines
    status, facts = probe(node, '/ready')
    assert status == 200
    assert facts['consecutive_failures'] == 0     # reset by the success
    assert facts['problems'] == [] and facts['workers'] == 4 and facts['watcher_synced']


@pytest.fixture
def watched(node):
    """A daemon under a 1 s systemd watchdog, stuck after 3 s without heartbeat."""
    node.start_daemon(extra=HEARTBEAT, env=WATCHDOG_ENV)
    stopped = []
    yield node, stopped
    send(stopped, signal.SIGCONT)    # let teardown stop it gracefully, even after a failure


def test_watchdog_pings_only_while_workers_and_watcher_turn(watched):
    node, stopped = watched
    assert read_notify(node, 1.5).count('WATCHDOG=1') >= 2
    workers = role_pids(node, 'cni-worker')
    assert len(workers) == 4

    # One worker that still serves is enough.
    stopped.extend(workers[:3])
    send(workers[:3], signal.SIGSTOP)
    lines = wait_notify(node, lambda line: line.startswith('STATUS=Ready: 1 workers'), 15)
    assert 'WATCHDOG=1' in lines + read_notify(node, 1.0)

    # The whole pool stuck (alive by pid, but no accept loop turns): pings stop.
    stopped.append(workers[3])
    os.kill(workers[3], signal.SIGSTOP)
    wait_notify(node, lambda line: line == 'STATUS=Unhealthy: no CNI worker serving', 15)
    assert 'WATCHDOG=1' not in read_notify(node, 2.0)
    status, facts = probe(node, '/alive')
    assert status == 503 and facts['problems'] == ['no CNI worker serving']
    assert probe(node, '/ready')[0] == 503

    send(stopped, signal.SIGCONT)
    stopped.clear()
    lines = wait_notify(node, lambda line: line == READY, 15)
    assert 'WATCHDOG=1' in lines + read_notify(node, 1.0)
    assert probe(node, '/alive')[0] == 200

    # The watcher stuck: pings stop too.
    watcher, = role_pids(node, 'watcher')
    stopped.append(watcher)
    os.kill(watcher, signal.SIGSTOP)
    wait_notify(node, lambda line: line == 'STATUS=Unhealthy: watcher stuck or dead', 15)
    assert 'WATCHDOG=1' not in read_notify(node, 2.0)
    assert probe(node, '/alive')[1]['problems'] == ['watcher stuck or dead']
    os.kill(watcher, signal.SIGCONT)
    stopped.clear()
    wait_notify(node, lambda line: line == 'WATCHDOG=1', 15)


@pytest.mark.parametrize('vif_timeout', [30])
def test_sigterm_drains_in_flight_requests_while_not_ready(daemon, runtime):
    node = daemon
    create_pod(node, active=False)
    b = sandbox(node, 'B')
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        add = pool.submit(runtime.add, b)
        wait.until(lambda: helpers.metric(node, 'kuryr_cni_requests_in_flight') == 1, 20,
                   'the ADD in flight')
        os.kill(node.daemon.pid, signal.SIGTERM)
        lines = wait_notify(node, lambda line: line == 'STOPPING=1', 15)
        assert 'STATUS=Shutting down' in lines
        status, facts = probe(node, '/ready')
        assert status == 503 and 'shutting down' in facts['problems']
        assert probe(node, '/alive')[0] == 200      # draining is not dead
        # The watcher keeps feeding the ADD waiting for its VIF.
        node.api.set_vifs('default', POD, node.vifs(INDEX, active=True))
        outcome = add.result(timeout=60)
    assert outcome.ok, outcome
    assert node.daemon.wait(60) == 0
    assert node.addresses(b.netns, 'eth0') == {'10.10.0.5/24'}


# --- metrics ------------------------------------------------------------------------------

def _expected_families():
    """Family name as the parser gives it -> (type, label names of its samples)."""
    expected = {}
    for spec in metrics_mod.SPECS:
        name = spec.name[:-len('_total')] if spec.kind == 'counter' else spec.name
        expected[name] = (spec.kind, set(spec.labels))
    for spec in metrics_mod.SCRAPED:
        expected[spec.name] = ('gauge', set(spec.labels))
    return expected


def _plant_stale_metrics(directory):
    """A multiprocess file a previous run could have left: 42 ADDs."""
    os.makedirs(directory, mode=0o700)
    code = ('import prometheus_client as p; '
            'p.Counter("kuryr_cni_requests_total", "x", ["command", "result"])'
            '.labels("ADD", "success").inc(42)')
    subprocess.run([sys.executable, '-c', code], check=True, timeout=60,
                   env=dict(os.environ, PROMETHEUS_MULTIPROC_DIR=directory))
    return set(os.listdir(directory))


def test_metrics_directory_is_wiped_at_start(node):
    metrics_dir = os.path.join(os.path.dirname(node.socket), 'metrics')
    os.makedirs(os.path.dirname(metrics_dir), mode=0o700)
    stale = _plant_stale_metrics(metrics_dir)
    assert stale
    node.start_daemon()
    assert not stale & set(os.listdir(metrics_dir))
    assert helpers.metric(node, 'kuryr_cni_requests_total', command='ADD',
                          result='success') == 0


def test_metric_set_follows_prometheus_conventions(daemon):
    answer = scrape_with_requests(daemon)
    assert answer['status'] == 200
    assert answer['type'].startswith('text/plain; version=')
    found = families(answer['text'])
    expected = _expected_families()
    # The watch age appears once the watcher reports its activity to the
    # registry (StatusTable.note_watch_activity), which it may not do yet.
    if 'kuryr_cni_watch_activity_age_seconds' not in found:
        del expected['kuryr_cni_watch_activity_age_seconds']
    assert {name: f.type for name, f in found.items()} == {
        name: kind for name, (kind, _) in expected.items()}
    for name, family in found.items():
        kind, labels = expected[name]
        assert name.startswith('kuryr_cni_')
        assert family.documentation[:1].isupper() and family.documentation.endswith('.')
        for sample in family.samples:
            assert set(sample.labels) - {'le'} == labels, sample
            assert all(label.islower() and not label.startswith('_') for label in sample.labels)
        suffixes = {sample.name[len(name):] for sample in family.samples}
        if kind == 'counter':
            assert suffixes == {'_total'}, name
        elif kind == 'histogram':
            assert name.endswith('_seconds')
            assert suffixes == {'_bucket', '_sum', '_count'}, name
            assert all('le' in s.labels for s in family.samples if s.name.endswith('_bucket'))
        else:
            assert suffixes == {''} and not name.endswith('_total'), name
    # Known label values are there from the start, at 0.
    samples = helpers.scrape(daemon)
    for reason in ('container_id_mismatch', 'pod_uid_mismatch'):
        assert samples[('kuryr_cni_stale_del_rejected_total',
                        frozenset({('reason', reason)}))] == 0
    assert samples[('kuryr_cni_worker_restarts_total',
                    frozenset({('service', 'cni-worker')}))] == 0
    assert samples[('kuryr_cni_ready', frozenset())] == 1
    assert samples[('kuryr_cni_build_info', frozenset({('version', version.VERSION)}))] == 1
    assert samples[('kuryr_cni_queued_dels', frozenset())] == 0


def _counts(samples, name, label):
    return {dict(labels)[label]: value for (sample, labels), value in samples.items()
            if sample == name and value}


def test_metric_values_after_a_known_sequence(daemon, runtime):
    node = daemon
    create_pod(node)
    a, b = sandbox(node, 'A'), sandbox(node, 'B')
    assert runtime.add(a).ok
    assert runtime.check(a).ok
    assert runtime.add(b).ok                               # evicts A's devices
    assert helpers.metric(node, 'kuryr_cni_attachments') == 1
    assert runtime.delete(a).ok                            # stale: B owns the pod
    assert runtime.delete(b).ok
    assert runtime.delete(b).ok                            # nothing left: a no-op
    assert runtime.status().ok
    nameless = testruntime.Sandbox('sandbox-C', node.pod_netns(), '')
    assert runtime.add(nameless).error_code == 4
    node.api.delete_pod('default', POD)
    wait.until(lambda: helpers.metric(node, 'kuryr_cni_watch_events_total',
                                      type='DELETED') == 1, 20, 'the DELETED event')

    samples = helpers.scrape(node)
    requests = {(dict(labels)['command'], dict(labels)['result']): value
                for (name, labels), value in samples.items()
                if name == 'kuryr_cni_requests_total' and value}
    assert requests == {('ADD', 'success'): 2, ('ADD', 'error'): 1, ('CHECK', 'success'): 1,
                        ('DEL', 'stale'): 1, ('DEL', 'success'): 1, ('DEL', 'noop'): 1,
                        ('STATUS', 'success'): 1}
    # kuryr-kubernetes' histogram, label for label: {command, error="True"|"False"}.
    duration = 'kuryr_cni_request_duration_seconds'
    assert {frozenset(dict(labels)) for (sample, labels) in samples
            if sample.startswith(duration + '_') and sample != duration + '_bucket'} == {
        frozenset({'command', 'error'})}
    assert {frozenset(dict(labels)) for (sample, labels) in samples
            if sample == duration + '_bucket'} == {frozenset({'command', 'error', 'le'})}
    assert {(dict(labels)['command'], dict(labels)['error']): value
            for (sample, labels), value in samples.items()
            if sample == duration + '_count' and value} == {
        ('ADD', 'False'): 2, ('ADD', 'True'): 1, ('CHECK', 'False'): 1, ('DEL', 'False'): 3,
        ('STATUS', 'False'): 1}
    assert helpers.stale_dels(node) == {'container_id_mismatch': 1, 'pod_uid_mismatch': 0}
    assert samples[('kuryr_cni_sandbox_evictions_total', frozenset())] == 1
    assert samples[('kuryr_cni_vif_wait_seconds_count', frozenset())] == 2
    assert samples[('kuryr_cni_attachments', frozenset())] == 0
    assert samples[('kuryr_cni_requests_in_flight', frozenset())] == 0
    events = _counts(samples, 'kuryr_cni_watch_events_total', 'type')
    assert events.pop('BOOKMARK', 0) >= 0       # the stand-in's, at its own pace
    assert events == {'ADDED': 1, 'DELETED': 1}
    assert _counts(samples, 'kuryr_cni_watch_restarts_total', 'reason') == {}
    assert _counts(samples, 'kuryr_cni_worker_restarts_total', 'service') == {}


def test_a_killed_worker_is_marked_dead_and_replaced(node, runtime):
    node.start_daemon(workers=1, vif_timeout=30)
    assert runtime.status().ok
    create_pod(node, active=False)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        add = pool.submit(runtime.add, sandbox(node, 'A'))
        wait.until(lambda: helpers.metric(node, 'kuryr_cni_requests_in_flight') == 1, 20,
                   'the ADD in flight')
        worker, = role_pids(node, 'cni-worker')
        os.kill(worker, signal.SIGKILL)
        assert not add.result(timeout=60).ok
    wait.until(lambda: helpers.metric(node, 'kuryr_cni_worker_restarts_total',
                                      service='cni-worker') == 1, 20, 'the restart counted')
    # The dead worker's live gauge is gone; its counters still count.
    assert helpers.metric(node, 'kuryr_cni_requests_in_flight') == 0
    assert helpers.metric(node, 'kuryr_cni_requests_total', command='STATUS',
                          result='success') == 1
    wait.until(lambda: role_pids(node, 'cni-worker'), 20, 'a new worker')
    assert role_pids(node, 'cni-worker') != [worker]
    assert runtime.status().ok
    assert helpers.metric(node, 'kuryr_cni_requests_total', command='STATUS',
                          result='success') == 2
    assert probe(node, '/alive')[0] == 200


# --- kuryr-cni-ctl ---------------------------------------------------------------------------

def ctl(node, *args, socket_path=None):
    script = os.path.join(os.path.dirname(sys.executable), 'kuryr-cni-ctl')
    command = [script] if os.path.exists(script) else [sys.executable, '-m', 'kuryr_cni.ctl']
    return subprocess.run([*command, '--socket', socket_path or node.socket, *args],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def replaced(daemon, runtime):
    """Pod web-0 whose sandbox A was replaced by B, and A's late DEL rejected."""
    create_pod(daemon)
    a, b = sandbox(daemon, 'A'), sandbox(daemon, 'B')
    assert runtime.add(a).ok and runtime.add(b).ok
    assert runtime.delete(a).ok
    return daemon, a, b


def test_ctl_status(replaced):
    node, _, _ = replaced
    out = ctl(node, 'status')
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(':', 1) for line in out.stdout.splitlines())
    assert {key: value.strip() for key, value in lines.items()} == {
        'version': version.VERSION, 'ready': 'True', 'alive': 'True', 'workers': '4',
        'watcher_synced': 'True', 'shutting_down': 'False', 'pods': '1', 'bindings': '1',
        'queued_dels_failing': '0'}
    facts = json.loads(ctl(node, 'status', '--json').stdout)
    assert facts['version'] == version.VERSION
    assert (facts['workers'], facts['watcher_synced'], facts['ready']) == (4, True, True)
    queued = ctl(node, 'queued-dels')
    assert (queued.returncode, queued.stdout.split()[:3]) == (0, ['ENTRY', 'POD', 'SANDBOX'])
    assert json.loads(ctl(node, 'queued-dels', '--json').stdout) == {'failing': 0,
                                                                     'entries': []}


def test_ctl_list_and_show(replaced):
    node, a, b = replaced
    out = ctl(node, 'list')
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()
    assert header.split() == ['POD', 'OWNER', 'ATTACHMENTS', 'EVICTING']
    assert [row.split() for row in rows] == [[POD_KEY, b.container_id, 'kuryr/eth0', '0']]
    listed, = json.loads(ctl(node, 'list', '--json').stdout)
    assert listed['pod'] == POD_KEY and listed['owner'] == b.container_id

    shown = ctl(node, 'show', POD)            # the default namespace is implied
    assert shown.returncode == 0, shown.stderr
    assert 'owner:  %s' % b.container_id in shown.stdout.splitlines()
    assert 'sandbox %s (owner) netns %s' % (b.container_id, b.netns) in shown.stdout
    assert a.container_id not in shown.stdout
    binding = json.loads(ctl(node, 'show', POD_KEY, '--json').stdout)
    assert binding == listed
    assert list(binding['sandboxes']) == [b.container_id]


def test_ctl_stale_dels(replaced):
    node, a, b = replaced
    out = ctl(node, 'stale-dels')
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()
    assert header.split() == ['TIME', 'POD', 'REJECTED', 'OWNER', 'REASON']
    assert row.split()[1:] == [POD_KEY, a.container_id, b.container_id,
                               'container_id_mismatch']
    entry, = json.loads(ctl(node, 'stale-dels', '--json').stdout)
    assert (entry['container_id'], entry['owner'], entry['reason']) == (
        a.container_id, b.container_id, 'container_id_mismatch')


def test_ctl_exit_codes(daemon, tmp_path):
    missing = ctl(daemon, 'show', 'default/nope')
    assert missing.returncode == 1
    assert 'no binding for pod default/nope' in missing.stderr and not missing.stdout
    down = ctl(daemon, 'status', socket_path=str(tmp_path / 'absent.sock'))
    assert down.returncode == 2
    assert 'cannot reach the daemon' in down.stderr and not down.stdout
