"""Fixtures shared by the unit tests that talk to the Kubernetes API stand-in."""

import threading

import pytest

from kuryr_cni.testbed import apiserver


@pytest.fixture
def server():
    """The API stand-in on an ephemeral loopback port, bookmarks every 0.2 s."""
    srv = apiserver.APIServer('127.0.0.1', 0, bookmark_interval=0.2)
    yield srv
    srv.close()


@pytest.fixture
def no_leftover_threads():
    """Fail a test that leaves a thread running (watchers, watch streams)."""
    before = set(threading.enumerate())
    yield
    for thread in set(threading.enumerate()) - before:
        thread.join(2)
        assert not thread.is_alive(), 'test left thread %s running' % thread.name
