"""Rules and fixtures for the whole suite.

Under CI, a test that could not run is a failure.

A test skips, saying why, where a prerequisite is missing: root, a tool, a
package. On a developer's machine that is useful; in CI (``CI=true``, set
by ``.ci/run`` and by the Zuul jobs) it would let a job pass while testing
nothing, so there such a skip fails the test with its reason. The one
exception is a kernel without a feature (no 802.1Q module, say) for a test
that the vm tier runs on a guest kernel that has it (tests/vm, from the same
test file): its reason starts with :data:`VM_TIER`, and it stays a skip. A
kernel-feature skip that no other tier makes up for fails in CI like any
other.
"""

import contextlib
import getpass
import os
import tempfile

import pytest

from tools.testbed import shim

KERNEL_FEATURE = 'this kernel '     # how a kernel-feature skip reason starts
# How the reason of a kernel-feature skip starts when tests/vm runs the test in a guest.
VM_TIER = 'runs in the vm tier (tests/vm): '


def skip_reason(report):
    """The reason a skipped test report gives, without pytest's "Skipped: "."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix('Skipped: ')


def fails_under_ci(report):
    """Whether this report is a skip that CI must count as a failure."""
    return (os.environ.get('CI') == 'true' and report.skipped
            and not hasattr(report, 'wasxfail')
            and not skip_reason(report).startswith(VM_TIER))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if fails_under_ci(report):
        report.outcome = 'failed'
        report.longrepr = ('CI=true: skipping for a missing prerequisite is a failure here '
                           '(only kernel-feature skips the vm tier makes up for stay skips): %s'
                           % skip_reason(report))


def pytest_unconfigure(config):
    # pytest.ini keeps only a failing test's temporary directory; after a run that
    # kept none, pytest still leaves their parent, empty: remove it too.
    root = os.path.join(os.environ.get('PYTEST_DEBUG_TEMPROOT') or tempfile.gettempdir(),
                        'pytest-of-' + getpass.getuser())
    with contextlib.suppress(OSError):      # not there, or not empty
        os.rmdir(root)


def require_tier(tier, reason):
    """Skip a tier that cannot run here (``reason``, or None: it can); fail under CI.

    For a whole tier's session fixture: skipping it in CI would pass a job that
    tested nothing of it.
    """
    if reason and os.environ.get('CI') == 'true':
        pytest.fail('the %s tier cannot run in CI: %s' % (tier, reason), pytrace=False)
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope='session')
def shim_binary():
    """``shim/kuryr-cni`` as tools/build-shim builds it (built now when missing or stale).

    Without a Go toolchain this fails the tests that need it, saying why.
    """
    return shim.built()
