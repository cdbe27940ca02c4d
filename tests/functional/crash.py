"""Finding and killing the daemon's processes, and watching what they leave.

Used by the fault and storm tests. Everything here observes the kernel
(``/proc``) or the daemon's own interfaces (its socket, its files); nothing
reaches into the daemon's memory.
"""

import fcntl
import json
import os
import signal

from kuryr_cni import ctl
from kuryr_cni import state
from tools.testbed import host as testhost
from tools.testbed import runtime as testruntime

from tests import wait

WORKER_TITLE = 'kuryr-cni-daemon: cni-worker'
WATCHER_TITLE = 'kuryr-cni-daemon: watcher'
REGISTRY_TITLE = 'kuryr-cni-daemon: registry'
HEALTH_PORT = 8090


def titled(node, title):
    return sorted(pid for pid, t in node.processes().items() if t == title)


def wait_workers(node, count=4, gone=(), timeout=30):
    """Wait until ``count`` CNI workers run, none of them in ``gone``; return their pids.

    cotyledon names a new process after its role only once it runs the service.
    """
    return wait.until(lambda: (lambda pids: pids if len(pids) == count and not set(pids) & set(gone)
                               else None)(titled(node, WORKER_TITLE)),
                      timeout, '%d CNI workers' % count)


def _socket_inodes(pid):
    inodes = set()
    try:
        names = os.listdir('/proc/%d/fd' % pid)
    except FileNotFoundError:
        return inodes
    for fd in names:
        try:
            target = os.readlink('/proc/%d/fd/%s' % (pid, fd))
        except OSError:
            continue
        if target.startswith('socket:['):
            inodes.add(int(target[len('socket:['):-1]))
    return inodes


def _accepted_cni_connections(node):
    """Inodes of the accepted (daemon-side) ends of connections to the CNI socket.

    The kernel creates the accepted end of a unix connection in the network
    namespace of the connecting client, here the tests' own, and shows it with
    the listening socket's path in that namespace's /proc/net/unix.
    """
    found = set()
    with open('/proc/self/net/unix') as f:
        next(f)
        for line in f:
            fields = line.split()
            if len(fields) >= 8 and fields[7] == node.socket and fields[5] == '03':
                found.add(int(fields[6]))
    return found


def serving_workers(node):
    """{worker pid: open CNI connections} for every CNI worker."""
    accepted = _accepted_cni_connections(node)
    return {pid: len(_socket_inodes(pid) & accepted) for pid in titled(node, WORKER_TITLE)}


def worker_serving(node, timeout=10):
    """The pid of the one CNI worker holding a client connection (one request in flight)."""
    def one():
        busy = [pid for pid, n in serving_workers(node).items() if n]
        return busy[0] if len(busy) == 1 else None
    return wait.until(one, timeout, 'exactly one CNI worker serving a request')


def lock_holders(path):
    """Pids holding a flock on the file at ``path``, from /proc/locks."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return []
    wanted = '%02x:%02x:%d' % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    holders = []
    with open('/proc/locks') as f:
        for line in f:
            fields = line.split()
            if '->' in fields:       # a waiter, not a holder
                continue
            if fields[1] == 'FLOCK' and fields[5] == wanted:
                holders.append(int(fields[4]))
    return holders


def can_lock(path):
    """Whether a flock on ``path`` can be taken now (nobody holds it)."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def kill(pid):
    os.kill(pid, signal.SIGKILL)


def daemon_get(node, path):
    """GET ``path`` of the daemon's read-only API over its unix socket."""
    return ctl.fetch(node.socket, path)


def registry_pods(node):
    status, payload = daemon_get(node, '/v1/pods')
    assert status == 200, payload
    return {binding['pod']: binding for binding in payload}


def queue_entries(node):
    directory = os.path.join(node.state_dir, 'del-queue')
    try:
        return sorted(os.listdir(directory))
    except FileNotFoundError:
        return []


def lock_path(node, pod_key):
    return os.path.join(node.state_dir, 'locks', state.file_stem(pod_key) + '.lock')


def binding_path(node, pod_key):
    return os.path.join(node.state_dir, 'bindings', state.file_stem(pod_key) + '.json')


def health(node, probe):
    status, body = node.http_get(HEALTH_PORT, '/' + probe)
    return status, json.loads(body)


def make_pod(node, index, name=None, active=True, uid=None, container_id=None):
    """Create pod ``name`` (default ``pod-<index>``) in the API and a sandbox for it."""
    name = name or 'pod-%d' % index
    uid = uid or 'uid-%s' % name
    node.api.create_pod('default', name, testhost.NODE, uid=uid,
                        annotations={'kuryr.openstack.org/vifs':
                                     json.dumps(node.vifs(index, active=active))})
    return testruntime.Sandbox(container_id or 'cid-%s' % name, node.pod_netns(), name,
                               pod_uid=uid)


def activate(node, sandbox, index):
    node.api.set_vifs(sandbox.pod_namespace, sandbox.pod_name, node.vifs(index, active=True))


def wait_seen(node, count, timeout=20):
    """Wait until the daemon's watcher knows ``count`` pods."""
    return wait.until(lambda: daemon_get(node, '/v1/status')[1].get('pods') == count,
                      timeout, 'the watcher to know %d pods' % count)
