"""Privilege separation: the watcher and ops processes hold no root (issue 31).

Read from ``/proc`` of the real daemon's processes, by role; and what their
credentials allow shown by a probe that runs with the same credentials (made
by util-linux ``setpriv``, not by the daemon's own code), compared field by
field with the watcher's before it tries anything.
"""

import glob
import os
import pwd
import shutil
import signal
import subprocess
import sys

import pytest

from kuryr_cni.daemon import privileges
from tests import wait
from tests.functional import conftest
from tests.functional import helpers

pytestmark = pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON)

CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21
HEALTH_PORT = 8090
NOBODY = pwd.getpwnam('nobody')
# What the probe copies from the watcher and compares.
CREDENTIALS = ('Uid', 'Gid', 'Groups', 'NoNewPrivs') + privileges.CAP_FIELDS + ('CapBnd',)


def _role_pids(node, role):
    return sorted(pid for pid, title in node.processes().items()
                  if title == 'kuryr-cni-daemon: ' + role)


def _threads(pid):
    """``/proc`` status fields of every thread of ``pid``."""
    return [privileges.status(path) for path in glob.glob('/proc/%d/task/*/status' % pid)]


def _dropped(pid):
    """Problems of any thread of ``pid`` still holding privilege (beyond its bounding set)."""
    problems = []
    for fields in _threads(pid):
        problems += privileges.dropped_problems(fields, NOBODY.pw_uid, NOBODY.pw_gid)
    return problems


def test_the_watcher_and_ops_hold_no_privilege_and_only_root_processes_do(daemon):
    """On 2c4a2fa the watcher and ops ran as uid 0 with CapEff 1fffeffffff."""
    for role in ('watcher', 'ops'):
        pid, = _role_pids(daemon, role)
        main = privileges.status('/proc/%d/status' % pid)
        assert _dropped(pid) == [], (role, main)
        # Their main thread, which every thread of the service was started from,
        # has no bounding set either (the test runs with CAP_SETPCAP).
        assert int(main['CapBnd'], 16) == 0, (role, main['CapBnd'])
        assert main['Uid'].split() == [str(NOBODY.pw_uid)] * 4
        # Not dumpable (the kernel's doing when the uid changed): /proc/<pid>/fd
        # is root's, so no other process of that uid can use its descriptors.
        assert os.stat('/proc/%d/fd' % pid).st_uid == 0
        # It logs on, to the file opened as root, in a directory closed to it.
        assert 'The %s process runs as nobody (uid %d, gid %d) without capabilities' % (
            role, NOBODY.pw_uid, NOBODY.pw_gid) in daemon.log_tail(200)
    for role in ('cni-worker', 'registry'):
        for pid in _role_pids(daemon, role):
            fields = privileges.status('/proc/%d/status' % pid)
            effective = int(fields['CapEff'], 16)
            assert fields['Uid'].split()[1] == '0', (role, fields['Uid'])
            assert effective & (1 << CAP_NET_ADMIN) and effective & (1 << CAP_SYS_ADMIN)
            # The daemon executes nothing: no thread of it may gain privileges by execve.
            assert {t['NoNewPrivs'] for t in _threads(pid)} == {'1'}


@pytest.mark.skipif(not shutil.which('setpriv'), reason='setpriv (util-linux) not installed')
def test_with_the_watchers_credentials_the_state_dir_and_links_are_out_of_reach(daemon):
    watcher, = _role_pids(daemon, 'watcher')
    theirs = privileges.status('/proc/%d/status' % watcher)
    setpriv = ['setpriv', '--reuid=%d' % NOBODY.pw_uid, '--regid=%d' % NOBODY.pw_gid,
               '--clear-groups', '--inh-caps=-all', '--ambient-caps=-all',
               '--bounding-set=-all', '--no-new-privs']

    def probe(*command, as_watcher=True):
        # In the daemon's network namespace, from inside the state dir: a file
        # made there is refused by the state dir's own mode, whatever is above it.
        return subprocess.run(['ip', 'netns', 'exec', daemon.ns,
                               *(setpriv if as_watcher else ()), *command],
                              cwd=daemon.state_dir, capture_output=True, text=True,
                              timeout=30)

    ours = dict(line.split(':\t', 1) for line in probe(
        'cat', '/proc/self/status').stdout.splitlines() if ':\t' in line)
    assert {k: ours[k] for k in CREDENTIALS} == {k: theirs[k] for k in CREDENTIALS}

    write = probe('sh', '-c', 'echo x > planted')
    assert write.returncode != 0 and 'Permission denied' in write.stderr
    assert not os.path.exists(os.path.join(daemon.state_dir, 'planted'))
    link = probe('ip', 'link', 'add', 'kc-probe0', 'type', 'bridge')
    assert link.returncode != 0 and 'Operation not permitted' in link.stderr
    down = probe('ip', 'link', 'set', 'kuryr-br0', 'down')
    assert down.returncode != 0 and 'Operation not permitted' in down.stderr
    assert 'UP' in probe('ip', 'link', 'show', 'kuryr-br0').stdout
    # The same command as root works: the refusal is the credentials'.
    assert probe('ip', 'link', 'add', 'kc-probe0', 'type', 'bridge',
                 as_watcher=False).returncode == 0
    assert probe('ip', 'link', 'del', 'kc-probe0', as_watcher=False).returncode == 0


def test_their_metrics_and_probes_still_work(daemon):
    daemon.api.create_pod('default', 'p1', 'node-1')
    # The watcher counts the event in its own file, which the ops process reads.
    wait.until(lambda: helpers.metric(daemon, 'kuryr_cni_watch_events_total',
                                      type='ADDED') >= 1, timeout=20, what='ADDED counted')
    samples = helpers.scrape(daemon)
    # The ops process's own file: both its servers' caps.
    assert samples[('kuryr_cni_connections_limit', frozenset({('server', 'metrics')}))] == 256
    assert samples[('kuryr_cni_connections_limit', frozenset({('server', 'health')}))] == 256
    # Read through the DEL queue's descriptor it opened before dropping root.
    assert samples[('kuryr_cni_queued_dels', frozenset())] == 0
    assert samples[('kuryr_cni_ready', frozenset())] == 1
    assert daemon.http_get(HEALTH_PORT, '/ready')[0] == 200
    metric_dir = os.path.join(os.path.dirname(daemon.socket), 'metrics')
    for path in glob.glob(metric_dir + '/*.db'):
        info = os.stat(path)
        assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (0, NOBODY.pw_gid, 0o640)


def test_a_restarted_watcher_drops_again(daemon):
    old, = _role_pids(daemon, 'watcher')
    os.kill(old, signal.SIGKILL)

    def new_watcher():
        pids = [pid for pid in _role_pids(daemon, 'watcher') if pid != old]
        return pids[0] if pids else None

    pid = wait.until(new_watcher, timeout=30, what='a new watcher')
    wait.until(lambda: daemon.http_get(HEALTH_PORT, '/ready')[0] == 200, timeout=30,
               what='ready again')
    assert _dropped(pid) == []
    assert helpers.metric(daemon, 'kuryr_cni_worker_restarts_total', service='watcher') == 1


def _listening_inodes(pid):
    """Inodes of the daemon's listening sockets: the CNI socket and both ops ports."""
    inodes = set()
    with open('/proc/%d/net/unix' % pid) as f:
        inodes |= {line.split()[6] for line in f if line.rstrip().endswith('/daemon.sock')}
    for table in ('tcp', 'tcp6'):
        with open('/proc/%d/net/%s' % (pid, table)) as f:
            for line in list(f)[1:]:
                fields = line.split()
                if fields[3] == '0A' and int(fields[1].rsplit(':', 1)[1], 16) in (
                        HEALTH_PORT, helpers.PROMETHEUS_PORT):
                    inodes.add(fields[9])
    return inodes


def _sockets_held(pid):
    held = set()
    for fd in os.listdir('/proc/%d/fd' % pid):
        target = os.readlink('/proc/%d/fd/%s' % (pid, fd))
        if target.startswith('socket:['):
            held.add(target[len('socket:['):-1])
    return held


def test_they_hold_only_the_listening_sockets_they_serve(daemon):
    """Before: the watcher held the CNI socket, and could accept the shim's requests."""
    worker = _role_pids(daemon, 'cni-worker')[0]
    listening = _listening_inodes(worker)
    assert len(listening) == 3 and listening <= _sockets_held(worker)
    watcher, = _role_pids(daemon, 'watcher')
    ops, = _role_pids(daemon, 'ops')
    assert _sockets_held(watcher) & listening == set()
    assert len(_sockets_held(ops) & listening) == 2     # /alive, /ready and /metrics
    assert daemon.http_get(HEALTH_PORT, '/ready')[0] == 200


@pytest.mark.parametrize('cap', ['setuid', 'setgid', 'chown', 'kill'])
def test_a_daemon_without_a_capability_the_drop_needs_is_refused_in_one_line(cap):
    """Without CAP_CHOWN the start died with a traceback under the shipped unit (the vm
    tier found it: root may not chown(2) the run dir's shared directories to a group it
    is not in); without CAP_KILL every stop failed to signal the dropped processes (the vm
    tier again). Each capability the drop needs is checked before anything is made."""
    code = 'from kuryr_cni.daemon import privileges; privileges.check_can_drop()'
    out = subprocess.run(['setpriv', '--bounding-set=-' + cap, sys.executable, '-c', code],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert 'PrivilegeError' in out.stderr and 'lacks CAP_%s' % cap.upper() in out.stderr, (
        out.stderr)
    ok = subprocess.run([sys.executable, '-c', code], capture_output=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
