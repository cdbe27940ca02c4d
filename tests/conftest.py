"""Fixtures for every test tier: the built CNI shim."""

import pytest

from tools.testbed import shim


@pytest.fixture(scope='session')
def shim_binary():
    """``shim/kuryr-cni`` as tools/build-shim builds it (built now when missing or stale).

    Without a Go toolchain this fails the tests that need it, saying why.
    """
    return shim.built()
