"""Fixtures of the vm tier: small real Linux nodes, booted once for the session.

The tier needs root, ``/dev/net/tun`` and a built image (``tools/vm build``;
``tools/test`` runs it). Without them it skips with the reason, except in CI
(``CI=true``), where a missing build fails every test.

The session boots its two guests at once (:class:`tests.vm.guests.Guests`:
one ``tools/vm`` directory, one network namespace): ``kernel``, where the
functional tests that the host's kernel cannot run are run from the same
files (:mod:`tests.vm.kernel_suite`), and ``systemd``, where the daemon is
installed as ``doc/source/install.rst`` says and runs under the shipped unit.
The checkout is shared read-only with both at its own path; the shim is built
on the host first (a static executable: the guests have no Go).

Each guest is one CPU: the kernel guest's run (the longest part) starts in
the background as soon as the guests are up, and the tests that wait for it
are moved after the others, so the systemd guest's work overlaps it.
"""

import concurrent.futures
import inspect

import pytest

from tests import conftest
from tests.vm import guests as vm_guests
from tests.vm import kernel_suite
from tests.vm import nested
from tools.testbed import shim

KERNEL = 'kernel'
SYSTEMD = 'systemd'


def pytest_terminal_summary(terminalreporter):
    if nested.TIMINGS:
        terminalreporter.section('vm tier: nested mode timings')
        for what, seconds in nested.TIMINGS:
            terminalreporter.write_line('%-70s %8.2f' % (what, seconds))


def pytest_collection_modifyitems(items):
    """The tests that wait for the kernel guest's run go last (a stable sort)."""
    items.sort(key=waits_for_the_kernel_run)


def waits_for_the_kernel_run(item):
    function = getattr(item, 'function', None)     # its own arguments, not its fixtures'
    return function is not None and 'kernel_run' in inspect.signature(function).parameters


@pytest.fixture(scope='session')
def guests(tmp_path_factory):
    conftest.require_tier('vm', vm_guests.missing())
    shim.built()
    booted = vm_guests.Guests(str(tmp_path_factory.mktemp('vm')), [KERNEL, SYSTEMD])
    try:
        print('booted in %.1f s: %s' % (booted.start_seconds, booted.guests))
        yield booted
    finally:
        booted.close()


@pytest.fixture(scope='session')
def kernel_run(guests):
    """The future :class:`tests.vm.guests.Result` of the kernel guest's pytest run."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        yield pool.submit(kernel_suite.run, guests, KERNEL)
