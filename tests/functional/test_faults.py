"""Nothing lost: crashes, restarts, outages, hostile input (issue 4), one fault per test.

Real daemon, real shim, real kills. Where a request must be caught at a given
point to be killed there, the test makes it wait on something observable (a
VIF not active yet, a binding file that is a FIFO for a moment) rather than
racing it with a sleep.
"""

import concurrent.futures
import errno
import json
import os
import resource
import signal
import socket
import subprocess
import time
import uuid

import pytest

from kuryr_cni import netns
from kuryr_cni.binding import owner_tag
from tools.testbed import host as testhost
from tools.testbed import runtime as testruntime

from tests import wait
from tests.functional import conftest
from tests.functional import crash
from tests.functional import helpers

pytestmark = pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON)

NO_STALE = {'container_id_mismatch': 0, 'pod_uid_mismatch': 0}


def tagged_host_devices(node):
    return sorted(name for name, link in node.links().items()
                  if owner_tag.parse_alias(link.get('ifalias') or ''))


def dead_pid():
    with open('/proc/sys/kernel/pid_max') as f:
        return int(f.read()) + 1


# Persistence and restarts --------------------------------------------------------------


def test_restart_between_add_b_and_late_del_a_still_rejects_del_a(daemon, runtime):
    node = daemon
    a = crash.make_pod(node, 5, name='web', container_id='sandbox-a')
    b = testruntime.Sandbox('sandbox-b', node.pod_netns(), 'web', pod_uid=a.pod_uid)
    assert runtime.add(a).ok
    assert runtime.add(b).ok
    assert node.stop_daemon() == 0
    node.start_daemon()
    assert crash.registry_pods(node)['default/web']['owner'] == 'sandbox-b'
    assert runtime.delete(a).ok                 # the late DEL, to the restarted daemon
    assert runtime.delete(a, netns='').ok       # and the runtime's second one, without netns
    assert helpers.stale_dels(node) == {'container_id_mismatch': 2, 'pod_uid_mismatch': 0}
    helpers.assert_connected(node, b, 5)
    assert tagged_host_devices(node) == [owner_tag.host_ifname('sandbox-b', 'eth0')]


def test_del_while_the_daemon_is_down_is_queued_and_replayed_at_start(daemon, runtime):
    node = daemon
    a = crash.make_pod(node, 6)
    assert runtime.add(a).ok
    assert node.stop_daemon() == 0
    queue = os.path.join(node.state_dir, 'del-queue')
    # What a shim killed while queuing leaves, and an entry that never parses:
    # neither may stop the replay.
    dead_tmp = '.%d-%d.tmp' % (time.time_ns(), dead_pid())
    with open(os.path.join(queue, dead_tmp), 'wb') as f:
        f.write(b'{"CNI_COMMAND": "DE')
    an_hour_ago = time.time() - 3600
    os.utime(os.path.join(queue, dead_tmp), (an_hour_ago, an_hour_ago))
    with open(os.path.join(queue, '1-1.json'), 'wb') as f:
        f.write(b'{"CNI_COMMAND": ')

    assert runtime.delete(a).ok                 # the shim queues it and reports success
    entries = crash.queue_entries(node)
    assert len(entries) == 3 and dead_tmp in entries and '1-1.json' in entries
    assert owner_tag.host_ifname(a.container_id, 'eth0') in node.links()   # nobody acted yet

    node.start_daemon()                         # replays before its socket opens
    assert [n.partition('.corrupt-')[0] for n in crash.queue_entries(node)] == ['1-1.json']
    assert helpers.leftovers(node) == helpers.NOTHING
    assert set(node.links(a.netns)) == {'lo'}
    assert crash.registry_pods(node) == {}
    assert helpers.metric(node, 'kuryr_cni_queued_del_replayed_total') == 1
    assert helpers.stale_dels(node) == NO_STALE


def test_del_queued_while_the_daemon_runs_is_replayed(daemon, runtime, tmp_path):
    node = daemon
    a = crash.make_pod(node, 7)
    assert runtime.add(a).ok
    # A shim that cannot reach the running daemon (a DEL that timed out, or one
    # sent while the socket was being reopened) queues its DEL all the same.
    cut_off = testruntime.Runtime(str(tmp_path / 'unreachable' / 'd.sock'), node.state_dir,
                                  str(tmp_path / 'cut-off-cache'))
    assert cut_off.delete(a).ok
    assert len(crash.queue_entries(node)) == 1
    wait.until(lambda: crash.queue_entries(node) == [], 15, 'the queued DEL to be replayed')
    assert helpers.leftovers(node) == helpers.NOTHING
    assert set(node.links(a.netns)) == {'lo'}
    assert helpers.metric(node, 'kuryr_cni_queued_del_replayed_total') == 1
    assert runtime.delete(a).ok                 # the runtime's own DEL later: a no-op
    assert helpers.metric(node, 'kuryr_cni_requests_total', command='DEL', result='noop') == 1


def test_worker_killed_while_its_add_waits_is_replaced_and_the_retry_succeeds(daemon, runtime):
    node = daemon
    a = crash.make_pod(node, 9, active=False)
    crash.wait_workers(node)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        add = helpers.add_in_background(pool, node, runtime, a)   # now waiting for its VIF
        victim = crash.worker_serving(node)
        crash.kill(victim)
        outcome = add.result(timeout=30)
    assert outcome.error_code == 11, outcome     # the runtime is told to try again
    crash.wait_workers(node, gone=[victim])     # cotyledon started a replacement
    assert crash.can_lock(crash.lock_path(node, 'default/pod-9'))
    crash.activate(node, a, 9)
    assert runtime.add(a).ok                    # the runtime's retry
    helpers.assert_connected(node, a, 9)
    assert helpers.metric(node, 'kuryr_cni_worker_restarts_total', service='cni-worker') == 1
    assert runtime.delete(a).ok
    assert helpers.leftovers(node) == helpers.NOTHING


@pytest.mark.parametrize('command', ['ADD', 'DEL'])
def test_worker_killed_holding_the_pod_lock_wedges_nothing(daemon, runtime, command):
    node = daemon
    key = 'default/pod-10'
    a = crash.make_pod(node, 10)
    if command == 'DEL':
        assert runtime.add(a).ok
    path = crash.binding_path(node, key)
    saved = path + '.saved'
    if os.path.exists(path):
        os.rename(path, saved)
    # The worker's read of the binding, under the pod lock, blocks on a FIFO:
    # the request is caught inside its critical section.
    os.mkfifo(path, 0o600)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            request = pool.submit(runtime.add if command == 'ADD' else runtime.delete, a)
            holders = wait.until(lambda: crash.lock_holders(crash.lock_path(node, key)), 20,
                                 'a worker to hold the pod lock')
            assert holders == [crash.worker_serving(node)]
            # Put the real binding back first: the stuck worker keeps waiting on
            # the FIFO it opened, and nobody else ever sees that FIFO again.
            if os.path.exists(saved):
                os.rename(saved, path)
            else:
                os.unlink(path)
            crash.kill(holders[0])
            outcome = request.result(timeout=30)
    finally:
        if os.path.exists(saved):
            os.replace(saved, path)
    # Either is answered: the shim sends an ADD left unanswered again to the next
    # worker (shim/wait.go), and queues a DEL left unanswered (issue 13 item 8).
    assert outcome.ok, outcome
    # The kernel dropped the dead worker's lock (the replay of the queued DEL may
    # already hold it anew).
    assert holders[0] not in crash.lock_holders(crash.lock_path(node, key))
    crash.wait_workers(node, gone=holders)
    if command == 'ADD':
        assert runtime.add(a).ok
        helpers.assert_connected(node, a, 10)
    else:
        wait.until(lambda: crash.queue_entries(node) == [], 15,
                   'the queued DEL to be replayed')
        assert helpers.metric(node, 'kuryr_cni_queued_del_replayed_total') == 1
        assert runtime.delete(a).ok
        assert helpers.leftovers(node) == helpers.NOTHING
        assert set(node.links(a.netns)) == {'lo'}


@pytest.mark.parametrize('vif_timeout', [30])
def test_worker_killed_while_plugging_leaves_nothing_the_retry_cannot_fix(daemon, runtime):
    node = daemon
    key = 'default/pod-11'
    a = crash.make_pod(node, 11, active=False)
    host_end = owner_tag.host_ifname(a.container_id, 'eth0')
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        add = helpers.add_in_background(pool, node, runtime, a)
        victim = crash.worker_serving(node)
        crash.activate(node, a, 11)
        # The attachment is recorded as being plugged before any device is
        # made (DESIGN §3); kill the moment the veth pair appears, while the
        # worker is still configuring it.
        states = _first_attachment_states(node, key, timeout=20)
        with netns.iproute(node.path) as host:
            wait.until(lambda: host.link_lookup(ifname=host_end), 20, 'the veth pair',
                       interval=0)
            crash.kill(victim)
        outcome = add.result(timeout=30)
    half_made = host_end in node.links()
    assert outcome.ok or outcome.error_code == 11, outcome
    crash.wait_workers(node, gone=[victim])
    assert runtime.add(a).ok                    # the retry converges on one interface
    helpers.assert_connected(node, a, 11)
    assert tagged_host_devices(node) == [host_end]
    assert runtime.delete(a).ok
    assert helpers.leftovers(node) == helpers.NOTHING
    print('killed with the attachment %s; half-made device present: %s' % (states, half_made))


def _first_attachment_states(node, key, timeout):
    """The attachment states of the binding file's first version that has one.

    Reads the file in a busy loop: the plug lasts milliseconds, a polling
    interval would miss it.
    """
    path = crash.binding_path(node, key)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path, 'rb') as f:
                binding = json.loads(f.read())
        except (FileNotFoundError, ValueError):
            continue
        states = [attachment['state'] for sandbox in binding['sandboxes'].values()
                  for attachment in sandbox['attachments'].values()]
        if states:
            return states
    raise AssertionError('no attachment of %s recorded within %ss' % (key, timeout))


# Manager and watcher death ------------------------------------------------------------


def test_registry_manager_death_is_reported_and_the_restart_reloads_state(daemon, runtime):
    node = daemon
    a = crash.make_pod(node, 12, name='web', container_id='sandbox-a')
    assert runtime.add(a).ok
    parent = node.daemon.pid
    watched = {pid: os.pidfd_open(pid) for pid in node.daemon_pids()}
    [manager] = crash.titled(node, crash.REGISTRY_TITLE)
    # Freeze the parent so the probes can be seen answering before it reacts.
    os.kill(parent, signal.SIGSTOP)
    try:
        crash.kill(manager)
        status, facts = wait.until(
            lambda: (lambda s, f: (s, f) if s == 503 else None)(*crash.health(node, 'alive')),
            15, '/alive to fail')
        assert facts['registry'] is False and facts['ready'] is False
        assert crash.health(node, 'ready')[0] == 503
    finally:
        os.kill(parent, signal.SIGCONT)
    assert node.daemon.wait(30) == 3            # non-zero: the supervisor restarts it
    assert helpers.wait_gone(watched, timeout=15) == []
    # The whole log: under load, the workers' own accounts of the loss may follow it.
    assert 'registry Manager process %d died' % manager in node.log_tail(100000)
    assert node.ping(a.netns, testhost.GATEWAY)   # the pod never depended on the daemon

    node.start_daemon()                         # what Restart=on-failure does
    assert crash.registry_pods(node)['default/web']['owner'] == 'sandbox-a'
    b = testruntime.Sandbox('sandbox-b', node.pod_netns(), 'web', pod_uid=a.pod_uid)
    assert runtime.add(b).ok
    assert runtime.delete(a).ok
    assert helpers.stale_dels(node)['container_id_mismatch'] == 1
    helpers.assert_connected(node, b, 12)


def test_watcher_death_is_reported_and_its_successor_relists(daemon, runtime):
    node = daemon
    assert crash.health(node, 'ready')[0] == 200
    node.api.stop()             # so that the successor cannot sync at once: /ready must say so
    [watcher] = crash.titled(node, crash.WATCHER_TITLE)
    crash.kill(watcher)
    wait.until(lambda: _unready_unsynced(node), 15, '/ready to fail, watcher unsynced')
    wait.until(lambda: [p for p in crash.titled(node, crash.WATCHER_TITLE) if p != watcher],
               15, 'a new watcher')
    status, facts = crash.health(node, 'ready')     # the successor runs, cannot list yet
    assert status == 503 and facts['watcher_synced'] is False
    pod = crash.make_pod(node, 13)              # created while nobody could see it
    node.api.start()
    wait.until(lambda: crash.health(node, 'ready')[0] == 200, 40, '/ready to pass again')
    assert runtime.add(pod).ok
    helpers.assert_connected(node, pod, 13)
    assert helpers.metric(node, 'kuryr_cni_worker_restarts_total', service='watcher') == 1


def _unready_unsynced(node):
    status, facts = crash.health(node, 'ready')
    return status == 503 and facts['watcher_synced'] is False


@pytest.mark.parametrize('vif_timeout', [3])
def test_api_outage_known_pods_keep_working_new_ones_wait_then_resync(daemon, runtime):
    node = daemon
    known = crash.make_pod(node, 14)
    crash.wait_seen(node, 1)
    node.api.stop()
    assert runtime.add(known).ok
    helpers.assert_connected(node, known, 14)
    new = crash.make_pod(node, 15)              # the API has it; the daemon cannot learn it
    started = time.monotonic()
    outcome = runtime.add(new)
    waited = time.monotonic() - started
    assert outcome.error_code == 11, outcome
    assert 3 <= waited < 3 + 5                  # bounded by vif_timeout
    assert helpers.binding(node, 'default/pod-15') is None
    node.api.start()
    crash.wait_seen(node, 2, timeout=40)        # the watcher resynced
    assert runtime.add(new).ok
    helpers.assert_connected(node, new, 15)


# Bounds -------------------------------------------------------------------------------


def _raw_request(node, data):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(node.socket)
        sock.sendall(data)
        reply = b''
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b'\r\n\r\n')
    return int(head.split()[1]), json.loads(body)


def test_oversized_or_unframed_body_gets_a_cni_error(daemon):
    node = daemon
    status, error = _raw_request(node, b'POST /addNetwork HTTP/1.1\r\nHost: k\r\n'
                                       b'Content-Length: %d\r\n\r\n{' % (2 * 1024 * 1024))
    assert status == 413 and error['code'] == 4 and 'larger than' in error['msg']
    assert set(error) == {'cniVersion', 'code', 'msg', 'details'}
    status, error = _raw_request(node, b'POST /addNetwork HTTP/1.1\r\nHost: k\r\n\r\n')
    assert status == 411 and error['code'] == 4
    assert crash.daemon_get(node, '/v1/status')[0] == 200


@pytest.mark.parametrize('vif_timeout', [60])
def test_the_request_deadline_bounds_every_wait(node, runtime, vif_timeout):
    # request_timeout (here its minimum, 5 s) cuts the VIF wait short, so the
    # runtime (110 s in the shim, 120 s in kubelet) always gets an answer.
    node.start_daemon(vif_timeout=vif_timeout, extra='\n[cni_daemon]\nrequest_timeout = 5\n')
    pod = crash.make_pod(node, 19, active=False)
    started = time.monotonic()
    outcome = runtime.add(pod)
    waited = time.monotonic() - started
    assert outcome.error_code == 11, outcome
    assert 5 <= waited < 5 + 4, waited


# Security -----------------------------------------------------------------------------


def test_a_bad_netns_is_refused_before_anything_is_made(daemon, runtime, tmp_path):
    node = daemon
    crash.make_pod(node, 17)
    regular = tmp_path / 'not-a-netns'
    regular.write_text('')
    host_links = set(node.links())
    cases = {
        'a regular file': str(regular),
        'the host namespace': node.path,
        "the daemon's own, by /proc": '/proc/%d/ns/net' % node.daemon.pid,
        'a missing file': str(tmp_path / 'gone'),
    }
    for what, path in cases.items():
        sandbox = testruntime.Sandbox('cid-%s' % uuid.uuid4().hex[:8], path, 'pod-17',
                                      pod_uid='uid-pod-17')
        outcome = runtime.add(sandbox)
        assert outcome.error_code == 4, (what, outcome)
    # A DEL may name a netns that is gone, but never the host's.
    outcome = runtime.delete(testruntime.Sandbox('cid-x', node.path, 'pod-17'))
    assert outcome.error_code == 4, outcome
    assert set(node.links()) == host_links
    assert helpers.leftovers(node) == helpers.NOTHING


BAD_FIELDS = [
    {'mac': '01:00:5e:00:00:01'},               # multicast
    {'mac': 'fa:16:3e:zz:00:01'},
    {'bridge': 'br0;reboot'},
    {'bridge': 'b' * 16},                       # longer than IFNAMSIZ allows
    {'mtu': 10},
    {'ips': ['10.10.0.300/24']},
    {'ips': ['10.10.0.30']},                    # no prefix length
    {'gateway': '10.20.0.1'},                   # on none of the VIF's subnets
    {'routes': [{'dst': '0.0.0.0/0', 'gw': 'nope'}]},
    {'kind': 'tap'},
    {'port_id': '../../etc/passwd'},
    {'active': 'yes'},
]


def test_bad_annotation_fields_fail_with_code_7_and_make_nothing(daemon, runtime):
    node = daemon
    host_links = set(node.links())
    sandboxes = []
    for offset, bad in enumerate(BAD_FIELDS + ['{"eth0": ']):
        index = 20 + offset
        text = bad if isinstance(bad, str) else json.dumps(node.vifs(index, **bad))
        node.api.create_pod('default', 'bad-%d' % index, testhost.NODE, uid='uid-bad-%d' % index,
                            annotations={'kuryr.openstack.org/vifs': text})
        sandboxes.append((bad, testruntime.Sandbox('cid-bad-%d' % index, node.pod_netns(),
                                                   'bad-%d' % index, pod_uid='uid-bad-%d' % index)))
    for bad, sandbox in sandboxes:
        outcome = runtime.add(sandbox)
        assert outcome.error_code == 7, (bad, outcome)
        assert set(node.links(sandbox.netns)) == {'lo'}, bad
    assert set(node.links()) == host_links      # no device, no bridge made
    assert helpers.leftovers(node) == helpers.NOTHING


def test_refuses_a_run_directory_owned_by_another_user(node):
    run_dir = os.path.dirname(node.socket)
    os.makedirs(run_dir, mode=0o700)
    os.chown(run_dir, 65534, 65534)
    assert node.start_daemon(wait=False).wait(30) == 2
    assert 'belongs to uid 65534' in node.log_tail()


def test_refuses_a_world_writable_state_directory(node):
    os.makedirs(node.state_dir)
    os.chmod(node.state_dir, 0o777)
    assert node.start_daemon(wait=False).wait(30) == 2
    assert 'writable by group or others' in node.log_tail()


def test_logs_never_print_the_bearer_token(node, runtime, tmp_path):
    secret = 'kc-secret-%s' % uuid.uuid4().hex
    token_file = tmp_path / 'token'
    token_file.write_text(secret + '\n')
    os.chmod(token_file, 0o600)
    node.start_daemon(extra='\n[kubernetes]\ntoken_file = %s\n' % token_file)
    pod = crash.make_pod(node, 18)
    assert runtime.add(pod).ok
    assert any(r.headers.get('authorization') == 'Bearer ' + secret
               for r in node.api.requests())    # the token really was in use
    node.api.stop()                             # errors get logged too
    wait.until(lambda: 'Kubernetes API unavailable' in node.log_tail(200), 30,
               'the watcher to log the outage')
    node.api.start()
    assert node.stop_daemon() == 0
    for name in ('daemon.log', 'daemon.stderr'):
        with open(os.path.join(node.workdir, name), errors='replace') as f:
            assert secret not in f.read(), name
    assert subprocess.run(['grep', '-rl', secret, node.workdir], capture_output=True,
                          text=True).stdout.split() == []


# Issue 20: kills during a burst of ADDs ----------------------------------------------------


@pytest.mark.parametrize('victim', ['parent', 'registry'])
def test_sigkill_during_a_burst_of_adds_loses_nothing_and_the_restart_converges(
        daemon, runtime, victim):
    node = daemon
    indexes = range(30, 38)
    pods = {index: crash.make_pod(node, index) for index in indexes}
    crash.wait_seen(node, len(pods))
    watched = {pid: os.pidfd_open(pid) for pid in node.daemon_pids()}
    with concurrent.futures.ThreadPoolExecutor(len(pods)) as pool:
        futures = {index: pool.submit(runtime.add, pod) for index, pod in pods.items()}
        wait.until(lambda: any(helpers.binding(node, 'default/pod-%d' % i) for i in indexes),
                   20, 'the burst to be under way')
        killed_at = time.monotonic()
        crash.kill(node.daemon.pid if victim == 'parent'
                   else crash.titled(node, crash.REGISTRY_TITLE)[0])
        outcomes = {index: future.result(timeout=150) for index, future in futures.items()}
    # Children finish or fail what they hold, then go; the state dir's lock with them.
    assert helpers.wait_gone(watched, timeout=150) == []
    gone_after = time.monotonic() - killed_at
    answered = sorted(i for i, outcome in outcomes.items() if outcome.ok)
    assert all(outcome.ok or outcome.error_code == 11 for outcome in outcomes.values()), outcomes
    print('\nSIGKILL of the %s: %d of %d ADDs answered OK, the rest code 11; every process '
          'gone %.1f s after' % (victim, len(answered), len(pods), gone_after))
    node.start_daemon()
    for index, pod in pods.items():
        if not outcomes[index].ok:
            assert runtime.add(pod).ok              # the runtime's retry
    for index, pod in pods.items():
        helpers.assert_connected(node, pod, index)
        assert runtime.delete(pod).ok
    assert helpers.leftovers(node) == helpers.NOTHING


def _daemon_processes(node):
    return sorted(pid for pid, title in node.processes().items()
                  if title.startswith('kuryr-cni-daemon'))


def _open_fds(pid):
    return len(os.listdir('/proc/%d/fd' % pid))


def _nofile(pid):
    with open('/proc/%d/limits' % pid) as f:
        soft, hard = next(line for line in f if line.startswith('Max open files')).split()[3:5]
    return int(soft), int(hard)


def _set_nofile(pid, limits):
    """prlimit(2) on another uid's process, even reading it (hence :func:`_nofile`),
    needs CAP_SYS_RESOURCE, which a sandboxed root may lack: the watcher and ops run
    as an unprivileged user, so set theirs as that user, as prlimit(2) allows."""
    try:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
    except PermissionError:
        with open('/proc/%d/status' % pid) as f:
            ids = {line.split(':')[0]: line.split()[1] for line in f
                   if line.startswith(('Uid:', 'Gid:'))}
        subprocess.run(['setpriv', '--reuid', ids['Uid'], '--regid', ids['Gid'],
                        '--clear-groups', 'prlimit', '--pid', str(pid),
                        '--nofile=%d:%d' % limits], check=True, timeout=10)


def test_a_namespace_runner_out_of_descriptors_fails_at_once_and_the_next_one_works(
        monkeypatch):
    """The thread that enters namespaces, started while descriptors are exhausted:
    the call fails at once with the shortage (code 11 from the API), and the next
    one, with descriptors again, works. Found by the test below: a worker's runner
    died at its start and every later request of that worker timed out after 10 s,
    limits restored or not."""
    own = os.open('/proc/self/ns/net', os.O_RDONLY | os.O_CLOEXEC)
    real_open = os.open

    def exhausted(path, *args, **kwargs):
        if path == '/proc/thread-self/ns/net':
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_open(path, *args, **kwargs)
    try:
        netns._forget_runner()          # the next call starts a runner
        monkeypatch.setattr(os, 'open', exhausted)
        started = time.monotonic()
        with pytest.raises(OSError) as exc:
            netns.socket_in(own, socket.AF_UNIX, socket.SOCK_DGRAM)
        assert exc.value.errno == errno.EMFILE
        assert time.monotonic() - started < netns.NETLINK_TIMEOUT / 2
        monkeypatch.undo()
        with netns.socket_in(own, socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            assert sock.family == socket.AF_UNIX
    finally:
        os.close(own)


def test_fd_exhaustion_fails_adds_with_code_11_and_the_daemon_recovers(daemon, runtime):
    """Issue 20: a low RLIMIT_NOFILE on every daemon process, during a burst of ADDs."""
    node = daemon
    indexes = range(40, 52)
    pods = {index: crash.make_pod(node, index) for index in indexes}
    crash.wait_seen(node, len(pods))
    pids = _daemon_processes(node)
    before = {pid: _open_fds(pid) for pid in pids}
    limits = {pid: _nofile(pid) for pid in pids}
    # A few descriptors above what each holds now: the burst runs out of them.
    for pid in pids:
        _set_nofile(pid, (before[pid] + 12, limits[pid][1]))
    with concurrent.futures.ThreadPoolExecutor(len(pods)) as pool:
        outcomes = dict(zip(pods, pool.map(runtime.add, pods.values())))
    failed = sorted(i for i, outcome in outcomes.items() if not outcome.ok)
    assert [(o.error_code, o.output) for o in outcomes.values()
            if not o.ok and o.error_code != 11] == []
    assert _daemon_processes(node) == pids                  # nobody died of it
    for pid in pids:
        _set_nofile(pid, limits[pid])
    print('\nRLIMIT_NOFILE at open descriptors + 12: %d of %d ADDs failed with code 11, '
          'no process died' % (len(failed), len(pods)))
    assert crash.health(node, 'ready')[0] == 200
    for index in failed:
        assert runtime.add(pods[index]).ok                  # the runtime's retry
    for index, pod in pods.items():
        helpers.assert_connected(node, pod, index)
        assert runtime.delete(pod).ok
    assert helpers.leftovers(node) == helpers.NOTHING
    # Nothing leaked: another round of twelve ADDs and DELs leaves no process with
    # more than six more descriptors (request threads' first netlink sockets);
    # a leak of the failed round would be one per failure. The first round's
    # growth is what first use opens: netlink sockets, metric files.
    settled = {pid: _open_fds(pid) for pid in pids}
    for index, pod in pods.items():
        assert runtime.add(pod).ok
    for pod in pods.values():
        assert runtime.delete(pod).ok
    grown = {pid: _open_fds(pid) - settled[pid] for pid in pids}
    assert max(grown.values()) <= 6, grown
