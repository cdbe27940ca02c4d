"""Nobody in, nothing wedged: the daemon's servers against hostile and clumsy clients.

Issue 13: item 1 (no TCP listener; only root on the unix socket), item 2 (a
connection flood on the ops ports neither grows nor wedges the ops process)
and item 7 (slow clients on the CNI socket neither starve real requests nor
go unnoticed by readiness). Each test names its item. The clients are real
processes: an unprivileged one forked from the test, and floods from a
process of their own inside the test host's namespace
(:mod:`tests.functional.flood`); the daemon is observed from outside, through
its sockets, its metrics and ``/proc``.
"""

import json
import os
import socket
import time

import pytest

from tools.testbed import host as testhost
from tools.testbed import runtime as testruntime

from tests import wait
from tests.functional import conftest
from tests.functional import crash
from tests.functional import flood
from tests.functional import helpers

pytestmark = pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON)

OPS_TITLE = 'kuryr-cni-daemon: ops'
HEALTH_PORT = 8090
NOBODY = 65534
PROBE_TIMEOUT = 1.0     # kubelet's default timeoutSeconds for a probe


def dropped(node, server, reason):
    return helpers.metric(node, 'kuryr_cni_connections_dropped_total', server=server,
                          reason=reason)


def assert_plugged(node, sandbox, index):
    """``sandbox`` has its eth0 with its address, and the binding still names it."""
    address = '%s.%d/24' % (testhost.SUBNET_PREFIX, index)
    assert node.addresses(sandbox.netns, 'eth0') == {address}
    binding = crash.registry_pods(node)['default/' + sandbox.pod_name]
    assert binding['owner'] == sandbox.container_id


# --- item 1: nobody but root -------------------------------------------------------------

def test_item1_the_daemon_listens_on_no_tcp_port_but_the_ops_ones(node):
    # kuryr-kubernetes' kuryr.conf names its TCP listener: ignored, saying so.
    node.start_daemon(extra='\n[cni_daemon]\nbind_address = 127.0.0.1:5036\n')
    assert ('[cni_daemon] bind_address is ignored: the shim reaches the daemon over the '
            'unix socket [cni_daemon] socket, never TCP') in node.log_tail()
    ports = {port for pid in node.daemon_pids() for port in _listening_tcp_ports(pid)}
    assert ports == {HEALTH_PORT, helpers.PROMETHEUS_PORT}


def _listening_tcp_ports(pid):
    """Ports of the TCP sockets ``pid`` holds in the LISTEN state."""
    inodes = crash._socket_inodes(pid)
    ports = set()
    for table in ('tcp', 'tcp6'):
        with open('/proc/%d/net/%s' % (pid, table)) as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[3] == '0A' and int(fields[9]) in inodes:
                    ports.add(int(fields[1].rpartition(':')[2], 16))
    return ports


def test_item1_a_peer_that_is_not_root_is_refused_counted_and_changes_nothing(daemon, runtime):
    node = daemon
    pod = crash.make_pod(node, 21)
    assert runtime.add(pod).ok
    # Someone loosened the modes: nobody may now reach and connect to the socket.
    run_dir = os.path.dirname(node.socket)
    modes = {path: os.stat(path).st_mode for path in (node.workdir, run_dir, node.socket)}
    os.chmod(node.workdir, 0o711)
    os.chmod(run_dir, 0o711)
    os.chmod(node.socket, 0o666)
    try:
        body = json.dumps({'CNI_COMMAND': 'DEL', 'CNI_CONTAINERID': pod.container_id,
                           'CNI_NETNS': pod.netns, 'CNI_IFNAME': 'eth0',
                           'CNI_ARGS': pod.cni_args(), 'CNI_PATH': '/opt/cni/bin',
                           'config': runtime.netconf}).encode()
        answers = [_as_nobody(node.socket, b'POST /delNetwork HTTP/1.1\r\nHost: k\r\n'
                                           b'Content-Length: %d\r\n\r\n' % len(body) + body),
                   _as_nobody(node.socket, b'GET /v1/pods HTTP/1.1\r\nHost: k\r\n\r\n')]
    finally:
        for path, mode in modes.items():
            os.chmod(path, mode)
    assert answers == [b'', b'']        # closed without an answer
    assert dropped(node, 'cni', 'peer_uid') == 2
    assert_plugged(node, pod, 21)
    assert helpers.metric(node, 'kuryr_cni_requests_total', command='DEL',
                          result='success') == 0
    assert 'peer uid %d' % NOBODY in node.log_tail(200)


def _as_nobody(path, request):
    """What a process of uid nobody receives for ``request`` on the unix socket ``path``."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:        # the child: only async-signal-safe-ish calls, then _exit
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            received = b''
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(path)
                try:
                    sock.sendall(request)
                    while chunk := sock.recv(65536):
                        received += chunk
                except (BrokenPipeError, ConnectionResetError):
                    pass
            os.write(write_end, b'ok:' + received)
        except BaseException as exc:
            os.write(write_end, b'error:' + repr(exc).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, 'rb') as f:
        outcome = f.read()
    os.waitpid(pid, 0)
    kind, _, data = outcome.partition(b':')
    assert kind == b'ok', data
    return data


# --- item 2: the ops ports ---------------------------------------------------------------

def test_item2_a_connection_flood_neither_grows_nor_wedges_the_ops_process(daemon):
    node = daemon
    [ops] = crash.titled(node, OPS_TITLE)
    _probe_alive(node)
    helpers.scrape(node)
    threads, fds = _threads(ops), _fds(ops)
    targets = ['127.0.0.1:%d' % HEALTH_PORT, '127.0.0.1:%d' % helpers.PROMETHEUS_PORT]
    with flood.Flood(node, targets, count=3000, reconnect=True) as attack:
        assert attack.opened['connected'] > 2000, attack.opened
        for _ in range(10):
            _probe_alive(node)
            assert _threads(ops) == threads
            # At most the two caps' worth of connections, and the request
            # threads' registry connections (each opens one when first used).
            assert sum(_fds(ops).values()) <= sum(fds.values()) + 2 * 256 + 4
        assert attack.stop() > 0
    # Gone with the attacker: its connections, and any work for them.
    wait.until(lambda: _fds(ops)['ops_port'] == fds['ops_port'], 10,
               'the flood connections closed')
    assert _threads(ops) == threads
    assert _fds(ops)['other'] <= fds['other'] + 4
    assert _cpu_seconds(ops, window=2.0) < 0.05
    _probe_alive(node)
    assert dropped(node, 'health', 'evicted') > 0
    assert dropped(node, 'metrics', 'evicted') > 0


def _probe_alive(node):
    """GET /alive as kubelet would: an answer, 200, within its probe timeout."""
    started = time.monotonic()
    status, _ = node.http_get(HEALTH_PORT, '/alive', timeout=PROBE_TIMEOUT)
    assert status == 200
    assert time.monotonic() - started < PROBE_TIMEOUT


def _threads(pid):
    return len(os.listdir('/proc/%d/task' % pid))


def _fds(pid):
    """The descriptors of ``pid``: TCP sockets of the ops ports, and the others."""
    ops_ports = {HEALTH_PORT, helpers.PROMETHEUS_PORT}
    port_sockets = set()
    with open('/proc/%d/net/tcp' % pid) as f:
        next(f)
        for line in f:
            fields = line.split()
            if int(fields[1].rpartition(':')[2], 16) in ops_ports:
                port_sockets.add(int(fields[9]))
    counts = {'ops_port': 0, 'other': 0}
    for fd in os.listdir('/proc/%d/fd' % pid):
        try:
            target = os.readlink('/proc/%d/fd/%s' % (pid, fd))
        except OSError:
            continue
        inode = int(target[8:-1]) if target.startswith('socket:[') else None
        counts['ops_port' if inode in port_sockets else 'other'] += 1
    return counts


def _cpu_seconds(pid, window):
    """CPU time ``pid`` used during the next ``window`` seconds (a measurement, not a wait)."""
    def used():
        with open('/proc/%d/stat' % pid) as f:
            fields = f.read().rpartition(')')[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')
    before = used()
    time.sleep(window)
    return used() - before


# --- item 7: the CNI socket ----------------------------------------------------------------

def test_item7_trickling_clients_do_not_hold_up_a_real_add(daemon, tmp_path):
    node = daemon
    pod = crash.make_pod(node, 22)
    crash.wait_seen(node, 1)
    # The shim's own deadline, far above an ADD's ~0.1 s, far below what
    # waiting behind the slow clients' deadlines would take.
    runtime = testruntime.Runtime(node.socket, node.state_dir, str(tmp_path / 'cache'),
                                  shim=node.install_shim(), timeout=10)
    with flood.Flood(node, [node.socket], count=300, reconnect=True) as attack:
        assert attack.opened == {'connected': 300, 'failed': 0}
        wait.until(lambda: _accepted(node) >= 128, 20, 'the slow clients accepted')
        outcome = runtime.add(pod)
        assert outcome.ok, outcome
        # Held by the workers (one past its 128 drops some, which come back).
        assert _connections(node)[0] >= 250
        assert crash.health(node, 'ready')[0] == 200
    assert_plugged(node, pod, 22)


def _accepted(node):
    """Connections the daemon has accepted on its unix socket (in its namespace's table)."""
    with open('/proc/%d/net/unix' % node.daemon.pid) as f:
        next(f)
        return sum(1 for line in f
                   if line.split()[5:6] == ['03'] and line.split()[7:8] == [node.socket])


def test_item7_a_socket_full_of_slow_clients_fails_readiness_then_recovers(node, runtime):
    # One worker with room for 20 connections, and time enough to hold them all.
    node.start_daemon(workers=1, extra='\n[cni_daemon]\nworker_connections = 20\n'
                                       'client_head_timeout = 60\nclient_timeout = 60\n')
    pod = crash.make_pod(node, 23)
    crash.wait_seen(node, 1)
    assert runtime.status().ok
    with flood.Flood(node, [node.socket], count=40, reconnect=False) as attack:
        assert attack.opened == {'connected': 40, 'failed': 0}
        status, facts = wait.until(lambda: _not_ready(node), 20, '/ready to fail')
        assert facts['problems'] == ['CNI socket saturated'] and facts['alive']
        # Every one accepted: the 20 oldest made room for the 20 newest.
        wait.until(lambda: dropped(node, 'cni', 'evicted') == 20, 20, '20 evictions')
        assert _connections(node) == (20, 20)
        assert helpers.metric(node, 'kuryr_cni_ready') == 0
        # But STATUS succeeds: a real request still gets in, the oldest slow client
        # making room, so the runtime need not stop starting pods.
        assert runtime.status().ok
        outcome = runtime.add(pod)
        assert outcome.ok, outcome
        assert dropped(node, 'cni', 'evicted') == 21
    wait.until(lambda: crash.health(node, 'ready')[0] == 200, 20, '/ready to pass')
    assert _connections(node) == (0, 20)
    assert runtime.status().ok
    assert_plugged(node, pod, 23)


def _not_ready(node):
    status, facts = crash.health(node, 'ready')
    return (status, facts) if status == 503 else None


def _connections(node):
    return (helpers.metric(node, 'kuryr_cni_connections_open', server='cni'),
            helpers.metric(node, 'kuryr_cni_connections_limit', server='cni'))
