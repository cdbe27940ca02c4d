"""Fixtures shared by unit tests: the API stand-in, a real registry Manager."""

import threading

import pytest

from kuryr_cni import registry as registry_mod
from tools.testbed import apiserver


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


@pytest.fixture
def registry():
    """A real registry Manager process (never a dict: cross-process bugs must show)."""
    manager, reg = registry_mod.Registry.start(title='kuryr-cni-daemon: registry (test)')
    yield reg
    manager.shutdown()


@pytest.fixture
def kernel():
    """The kernel port's recording stand-in (tests/unit/recording_kernel.py)."""
    from tests.unit import recording_kernel
    return recording_kernel.RecordingKernel()


@pytest.fixture
def ownership(registry, kernel, tmp_path):
    """The real ownership rules over a real registry, store and pod locks, and ``kernel``."""
    from kuryr_cni import ownership as ownership_mod
    from kuryr_cni import podlock
    from kuryr_cni import state
    return ownership_mod.Ownership(
        registry=registry, store=state.BindingStore(str(tmp_path / 'state')),
        locks=podlock.PodLocks(state.ensure_dir(str(tmp_path / 'state' / 'locks'))),
        kernel=kernel, vif_timeout=2)
