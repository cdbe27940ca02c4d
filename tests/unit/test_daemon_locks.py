"""The daemon's start-up locks (issue 31 holes 7 and 11), with faults injected in ``flock``.

A lock that cannot be taken is a refusal to start: one line, exit status 2,
never a traceback that a supervisor restarts into again and again.
"""

import errno
import fcntl
import os

import pytest

from kuryr_cni.daemon import listener
from kuryr_cni.daemon import main


@pytest.fixture
def conf_file(tmp_path):
    path = tmp_path / 'kuryr-cni.conf'
    path.write_text('[cni_daemon]\nsocket = %s/run/daemon.sock\nstate_dir = %s/state\n'
                    % (tmp_path, tmp_path))
    return str(path)


@pytest.fixture
def stopped_after_the_locks(monkeypatch):
    """The start ends right after the locks (before metrics, the registry, any socket)."""
    def stop(directory):
        raise listener.UnsafeSetup('stopped after the locks')
    monkeypatch.setattr(main.metrics, 'setup', stop)


def refusals(text):
    return [line for line in text.splitlines() if 'Refusing to start' in line]


def nfs4_flock(real=fcntl.flock):
    """flock as NFSv4 answers it: an exclusive lock on a read-only descriptor is EBADF."""
    def flock(fd, operation):
        if operation & fcntl.LOCK_EX and \
                fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        return real(fd, operation)
    return flock


def test_the_locks_are_taken_on_nfs4(monkeypatch, conf_file, stopped_after_the_locks, capfd):
    monkeypatch.setattr(main.fcntl, 'flock', nfs4_flock())

    assert main.main(['--config-file', conf_file]) == 2

    captured = capfd.readouterr()
    output = captured.out + captured.err
    assert refusals(output) and refusals(output)[0].endswith('stopped after the locks'), output


@pytest.mark.parametrize('error', [errno.ENOLCK, errno.EBADF, errno.EIO])
def test_any_error_taking_a_lock_is_one_line_and_exit_2(monkeypatch, conf_file, tmp_path,
                                                        capfd, error):
    def flock(fd, operation):
        raise OSError(error, os.strerror(error))
    monkeypatch.setattr(main.fcntl, 'flock', flock)

    assert main.main(['--config-file', conf_file]) == 2

    captured = capfd.readouterr()
    output = captured.out + captured.err
    assert 'Traceback' not in output
    assert len(refusals(output)) == 1, output
    expected = ('Refusing to start: cannot lock the run dir: %s/run/daemon.lock: %s'
                % (tmp_path, os.strerror(error)))
    assert refusals(output)[0].endswith(expected), output
    assert not os.path.exists(tmp_path / 'run' / 'metrics')


@pytest.mark.parametrize('nfs4, access', [(False, os.O_RDONLY), (True, os.O_RDWR)],
                         ids=['local', 'nfs4'])
def test_the_lock_is_read_only_where_the_file_system_allows(
        monkeypatch, tmp_path, nfs4, access):
    """Read-only keeps a local disk remountable read-only under the daemon (the state
    fault tests do it); NFSv4 needs a descriptor open for writing."""
    if nfs4:
        monkeypatch.setattr(main.fcntl, 'flock', nfs4_flock())
    fd = main._lock_dir(str(tmp_path), 'state dir')
    try:
        assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == access
    finally:
        os.close(fd)
