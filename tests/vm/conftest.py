"""Fixtures of the vm tier: small real Linux nodes, booted once for the session.

The tier needs root, ``/dev/net/tun`` and a built image (``tools/vm build``;
``tools/test`` runs it). Without them it skips with the reason, except in CI
(``CI=true``), where a missing build fails every test.

The session boots its guests at once (:class:`tests.vm.guests.Guests`: one
``tools/vm`` directory, one network namespace): ``kernel``, where the
functional tests that the host's kernel cannot run are run from the same
files, and ``systemd``, where the daemon is installed as
``doc/source/install.rst`` says and runs under the shipped unit. The checkout
is shared read-only with both at its own path; the shim is built on the host
first (a static executable: the guests have no Go).
"""

import pytest

from tests import conftest
from tests.vm import guests as vm_guests
from tools.testbed import shim

KERNEL = 'kernel'
SYSTEMD = 'systemd'


@pytest.fixture(scope='session')
def guests(tmp_path_factory):
    conftest.require_tier('vm', vm_guests.missing())
    shim.built()
    booted = vm_guests.Guests(str(tmp_path_factory.mktemp('vm')), [KERNEL, SYSTEMD])
    try:
        yield booted
    finally:
        booted.close()
