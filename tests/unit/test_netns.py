"""Namespace path checks and the netlink timeout, without root.

Nothing here enters another namespace or sends a netlink request: the
refusals happen before any, and the timeout test waits on a socket to which
nothing was sent. Accepting real namespaces is tested in
tests/functional/test_bridge.py (root).
"""

import os
import socket
import threading
import time

import pytest

from kuryr_cni import errors
from kuryr_cni import netns


@pytest.fixture
def regular_file(tmp_path):
    path = tmp_path / 'netns-file'
    path.write_text('not a namespace')
    return str(path)


def refusal(path, **kwargs):
    with pytest.raises(errors.InvalidEnvironment) as exc:
        netns.check_netns(path, **kwargs)
    assert exc.value.code == 4
    assert not netns.exists(path) or 'host' in exc.value.msg
    return exc.value


def test_refuses_a_regular_file(regular_file):
    assert 'not a network namespace' in refusal(regular_file).msg


def test_refuses_a_directory(tmp_path):
    assert 'directory' in refusal(str(tmp_path)).msg


def test_refuses_a_missing_path(tmp_path):
    exc = refusal(str(tmp_path / 'gone'))
    assert isinstance(exc, netns.NamespaceNotFound)
    assert 'does not exist' in exc.msg
    assert not (tmp_path / 'gone').exists()


def test_refuses_a_fifo_without_blocking(tmp_path):
    fifo = str(tmp_path / 'fifo')
    os.mkfifo(fifo)
    # Opened for reading, a FIFO without writer blocks for ever: reaching the
    # refusal at all is the proof it was never opened.
    assert 'FIFO' in refusal(fifo).msg


def test_refuses_a_device():
    assert 'character device' in refusal('/dev/null').msg


@pytest.mark.parametrize('kind, words', [('mnt', 'mount namespace'), ('pid', 'PID namespace'),
                                         ('uts', 'UTS namespace')])
def test_refuses_other_kinds_of_namespace(kind, words):
    path = '/proc/self/ns/' + kind
    if not os.path.exists(path):
        pytest.skip('this kernel has no %s namespaces (no %s)' % (kind, path))
    exc = refusal(path)
    assert words in exc.msg and 'not a network namespace' in exc.msg


@pytest.mark.parametrize('path', ['relative/netns', '', None, 42, '/run/netns/a\0b'])
def test_refuses_what_is_no_absolute_path(path):
    assert 'absolute path' in refusal(path).msg


def test_refuses_the_daemons_own_namespace(regular_file):
    assert 'host network namespace' in refusal('/proc/self/ns/net').msg
    # ...even when the host side is said to live elsewhere (as in tests):
    assert 'host network namespace' in refusal('/proc/self/ns/net', host=regular_file).msg


def test_refuses_the_named_host_namespace_through_another_path():
    path = '/proc/%d/ns/net' % os.getpid()
    assert 'host network namespace' in refusal(path, host='/proc/self/ns/net').msg


def test_the_own_namespace_exists():
    assert netns.exists('/proc/self/ns/net')


def test_iproute_refuses_a_missing_namespace_and_creates_none(tmp_path):
    path = str(tmp_path / 'missing')
    with pytest.raises(netns.NamespaceNotFound):
        with netns.iproute(path):
            pass
    assert not os.path.exists(path)


def test_iproute_refuses_a_file_that_is_no_namespace(regular_file):
    with pytest.raises(errors.InvalidEnvironment, match='not a network namespace'):
        with netns.iproute(regular_file):
            pass


def test_unanswered_netlink_request_times_out():
    start = time.monotonic()
    with pytest.raises(netns.NetlinkTimeout) as exc:
        with netns.iproute(timeout=0.2) as ipr:
            ipr.get()                  # waits for an answer to nothing
    assert time.monotonic() - start >= 0.2      # it waited its whole timeout, not less
    assert exc.value.code == 11 and exc.value.retry
    assert 'no answer within 0.2 s' in exc.value.msg


def test_socket_in_own_namespace():
    with netns.socket_in(None, socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        assert sock.family == socket.AF_UNIX


def test_socket_in_refuses_a_missing_namespace(tmp_path):
    with pytest.raises(netns.NamespaceNotFound):
        netns.socket_in(str(tmp_path / 'missing'), socket.AF_INET, socket.SOCK_STREAM)


# --- handles on the daemon's own namespace are kept per thread ----------------------

def test_a_thread_gets_its_own_namespace_handle_back_in_its_next_block():
    with netns.iproute() as first:
        pass
    with netns.iproute() as again:
        assert again is first
    elsewhere = []

    def open_in_another_thread():
        with netns.iproute() as ipr:
            elsewhere.append(ipr)

    thread = threading.Thread(target=open_in_another_thread)
    thread.start()
    thread.join(5)
    assert elsewhere and elsewhere[0] is not first


def test_a_block_that_raises_closes_its_handle():
    with pytest.raises(RuntimeError):
        with netns.iproute() as broken:
            raise RuntimeError('a timed-out request may still be answered later')
    with netns.iproute() as fresh:
        assert fresh is not broken


def test_nested_blocks_on_one_thread_get_distinct_handles():
    with netns.iproute() as outer, netns.iproute() as inner:
        assert inner is not outer
    with netns.iproute() as again:
        assert again in (outer, inner)


def test_a_forked_child_never_uses_its_parents_handle():
    with netns.iproute() as parents:
        pass
    pid = os.fork()
    if pid == 0:
        try:
            with netns.iproute() as childs:
                os._exit(0 if childs is not parents else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with netns.iproute() as again:
        assert again is parents
