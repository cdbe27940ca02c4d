"""The daemon as a process tree: titles, socket safety, signals, no orphans."""

import os
import signal
import stat

import pytest

from tests.functional import conftest
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


def test_refuses_a_world_writable_run_directory(node):
    run_dir = os.path.dirname(node.socket)
    os.makedirs(run_dir)
    os.chmod(run_dir, 0o777)
    proc = node.start_daemon(wait=False)
    assert proc.wait(30) == 2
    assert 'writable by group or others' in node.log_tail()
