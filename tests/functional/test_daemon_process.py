"""The daemon as a process tree: titles, socket safety, signals, no orphans."""

import os
import signal
import stat
import subprocess

import pytest

from tools.testbed import host as testhost
from tests.functional import conftest
from tests.functional import crash
from tests.functional import helpers

pytestmark = pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON)


def _titles(node):
    return sorted(title for title in node.processes().values()
                  if title.startswith('kuryr-cni-daemon:'))


def test_process_titles_name_every_role(daemon):
    titles = _titles(daemon)
    assert titles.count('kuryr-cni-daemon: cni-worker') == 4
    assert titles.count('kuryr-cni-daemon: watcher') == 1
    assert titles.count('kuryr-cni-daemon: ops') == 1
    assert titles.count('kuryr-cni-daemon: registry') == 1
    assert any(t.startswith('kuryr-cni-daemon: master process') for t in titles)


def test_socket_is_root_only(daemon):
    sock = os.stat(daemon.socket)
    directory = os.stat(os.path.dirname(daemon.socket))
    assert stat.S_ISSOCK(sock.st_mode) and stat.S_IMODE(sock.st_mode) == 0o600
    assert stat.S_IMODE(directory.st_mode) == 0o700
    assert sock.st_uid == directory.st_uid == 0


@pytest.mark.parametrize('sig, status', [(signal.SIGTERM, 0), (signal.SIGINT, 1)])
def test_signal_leaves_no_process_behind(daemon, sig, status):
    pids = daemon.daemon_pids()
    assert len(pids) == 8      # parent, Manager, watcher, 4 workers, ops
    watched = {pid: os.pidfd_open(pid) for pid in pids}
    assert daemon.stop_daemon(sig) == status
    assert helpers.wait_gone(watched, timeout=15) == []


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGINT])
def test_the_registry_socket_is_in_the_run_directory(node, tmp_path, sig):
    """Not in a pymp-* directory under TMPDIR, which SIGINT's fast exit left behind."""
    node.start_daemon(env={'TMPDIR': str(tmp_path)})
    registry_sock = os.path.join(os.path.dirname(node.socket), 'registry', 'registry.sock')
    assert stat.S_ISSOCK(os.stat(registry_sock).st_mode)
    watched = {pid: os.pidfd_open(pid) for pid in node.daemon_pids()}
    node.stop_daemon(sig)
    assert helpers.wait_gone(watched, timeout=15) == []
    assert os.listdir(tmp_path) == []
    if sig == signal.SIGTERM:
        assert not os.path.exists(registry_sock)    # the Manager's own clean-up
    node.start_daemon()     # replaces a socket the killed Manager left
    assert helpers.scrape(node)


def test_a_second_daemon_is_refused_before_it_touches_the_first(daemon):
    metrics_before = helpers.scrape(daemon)
    registry_sock = os.path.join(os.path.dirname(daemon.socket), 'registry', 'registry.sock')
    inode = os.stat(registry_sock).st_ino
    second = subprocess.run(
        ['ip', 'netns', 'exec', daemon.ns, *testhost.daemon_command(),
         '--config-file', os.path.join(daemon.workdir, 'kuryr-cni.conf')],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    assert second.returncode == 2
    assert 'another daemon is already serving' in daemon.log_tail()
    assert os.stat(registry_sock).st_ino == inode
    assert helpers.scrape(daemon).keys() == metrics_before.keys()
    assert daemon.daemon.poll() is None


def test_refuses_a_world_writable_run_directory(node):
    run_dir = os.path.dirname(node.socket)
    os.makedirs(run_dir)
    os.chmod(run_dir, 0o777)
    proc = node.start_daemon(wait=False)
    assert proc.wait(30) == 2
    assert 'writable by group or others' in node.log_tail()


def test_a_second_daemon_on_the_same_state_dir_is_refused_whatever_its_socket(daemon):
    """Issue 20, item 4: the start check probed only the socket."""
    first = os.path.join(daemon.workdir, 'kuryr-cni.conf')
    second = os.path.join(daemon.workdir, 'second.conf')
    other_run_dir = os.path.join(daemon.workdir, 'run2')
    with open(first) as f:
        text = f.read().replace(daemon.socket, os.path.join(other_run_dir, 'daemon.sock'))
    with open(second, 'w') as f:
        # Ports of its own too: nothing but the state dir is shared.
        f.write(text.replace('daemon.log', 'second.log')
                + '\n[health]\nport = 18090\n[prometheus]\nport = 19655\n')
    metrics_before = helpers.scrape(daemon)
    proc = subprocess.run(
        ['ip', 'netns', 'exec', daemon.ns, *testhost.daemon_command(), '--config-file', second],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    assert proc.returncode == 2
    with open(os.path.join(daemon.workdir, 'second.log')) as f:
        lines = f.read().splitlines()
    refusals = [line for line in lines if 'Refusing to start' in line]
    assert len(refusals) == 1 and refusals[0].endswith(
        'Refusing to start: another daemon uses the state dir %s (it holds %s/daemon.lock)'
        % (daemon.state_dir, daemon.state_dir)), lines
    assert not os.path.exists(os.path.join(other_run_dir, 'daemon.sock'))
    assert helpers.scrape(daemon).keys() == metrics_before.keys()
    assert daemon.daemon.poll() is None
    assert crash.daemon_get(daemon, '/v1/status')[0] == 200       # the first serves on


def test_a_second_daemon_sharing_the_run_dir_is_refused_and_touches_nothing(daemon):
    """Issue 31 hole 11: a second daemon whose socket (and state dir, ports) differ but
    whose run dir is the first's wiped the first's metrics files and replaced its
    registry socket before anything refused it."""
    run_dir = os.path.dirname(daemon.socket)
    first = os.path.join(daemon.workdir, 'kuryr-cni.conf')
    second = os.path.join(daemon.workdir, 'second.conf')
    with open(first) as f:
        text = f.read().replace(daemon.socket, os.path.join(run_dir, 'other.sock')).replace(
            daemon.state_dir, os.path.join(daemon.workdir, 'state2'))
    with open(second, 'w') as f:
        f.write(text.replace('daemon.log', 'second.log')
                + '\n[health]\nport = 18091\n[prometheus]\nport = 19656\n')
    registry_sock = os.path.join(run_dir, 'registry', 'registry.sock')
    inode = os.stat(registry_sock).st_ino
    metrics_dir = os.path.join(run_dir, 'metrics')
    metrics_files = {name: os.stat(os.path.join(metrics_dir, name)).st_ino
                     for name in os.listdir(metrics_dir)}
    assert metrics_files
    proc = subprocess.Popen(
        ['ip', 'netns', 'exec', daemon.ns, *testhost.daemon_command(), '--config-file', second],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        status = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:     # it started: stop it and its children
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    assert status == 2
    with open(os.path.join(daemon.workdir, 'second.log')) as f:
        lines = f.read().splitlines()
    refusals = [line for line in lines if 'Refusing to start' in line]
    assert len(refusals) == 1 and refusals[0].endswith(
        'Refusing to start: another daemon uses the run dir %s (it holds %s/daemon.lock)'
        % (run_dir, run_dir)), lines
    assert os.stat(registry_sock).st_ino == inode
    assert {name: os.stat(os.path.join(metrics_dir, name)).st_ino
            for name in os.listdir(metrics_dir)} == metrics_files
    assert not os.path.exists(os.path.join(run_dir, 'other.sock'))
    assert not os.path.exists(os.path.join(daemon.workdir, 'state2'))
    assert daemon.daemon.poll() is None
    assert crash.daemon_get(daemon, '/v1/status')[0] == 200


# Extension modules that betray a library in a process's address space: the
# Kubernetes client brings pydantic's, pyroute2 brings psutil's, and
# kubernetes-validate (test-requirements.txt) brings jsonschema's rpds.
KUBERNETES_CLIENT = '_pydantic_core'
PYROUTE2 = '_psutil_linux'
KUBERNETES_VALIDATE = 'rpds'


def _mapped(pid):
    """Base names of the shared objects mapped into process ``pid``."""
    with open('/proc/%d/maps' % pid) as f:
        return {line.split()[-1].rsplit('/', 1)[-1] for line in f if '.so' in line}


def _mapping(names, library):
    return any(name.startswith(library) for name in names)


def test_the_registry_holds_none_of_the_services_libraries(daemon):
    """The Manager is forked before the services' modules are imported
    (doc/source/benchmark.rst, "Where the memory goes"); the services have
    them, and the daemon leaves kubernetes-validate, which it never uses, alone."""
    roles = {}
    for pid, title in daemon.processes().items():
        roles.setdefault(title.partition(': ')[2].split()[0], []).append(pid)
    registry = _mapped(roles['registry'][0])
    assert not _mapping(registry, KUBERNETES_CLIENT)
    assert not _mapping(registry, PYROUTE2)
    for pid in roles['watcher'] + roles['cni-worker']:
        services = _mapped(pid)
        assert _mapping(services, KUBERNETES_CLIENT) and _mapping(services, PYROUTE2)
        assert not _mapping(services, KUBERNETES_VALIDATE)
