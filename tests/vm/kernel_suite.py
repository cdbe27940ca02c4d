"""The functional tests the host's kernel cannot run, as run in the ``kernel`` guest.

The development and CI machines' kernel has no 802.1Q, so every vlan test of
tests/functional skips there, with a reason starting "runs in the vm tier"
(``tests.conftest.VM_TIER``; under CI=true that is the only kernel skip
allowed). :func:`run` runs the same files in a guest whose kernel has it
(user-mode Linux 6.1 with 8021q), from the checkout shared read-only, by
pytest from a virtualenv of the guest's own Debian Python, under CI=true.
The rtnl channel's tests, the bridge driver's and the macvlan half of the
nested tests run along, so every kernel driver without Open vSwitch, and the
batched channel, meets the guest's older kernel too. The ``ovs`` VIF kind of
tests/functional/test_vif_kinds.py is left to the host, which has Open
vSwitch; the guest image has none.
"""

import re

from tests.vm import guests as vm_guests

# Every file of tests/functional that asks whether the kernel can make a link, and more.
FILES = ('tests/functional/test_nested.py', 'tests/functional/test_vif_kinds.py',
         'tests/functional/test_rtnl.py', 'tests/functional/test_bridge.py',
         'tests/functional/test_adoption.py')
DESELECT = 'not ovs'
RUN_TIMEOUT = 1800      # seconds: fork+exec is 20 to 40 times slower in the guest
VENV_TIMEOUT = 600
# Bytecode of the read-only checkout goes here, so each daemon start does not compile it.
PYCACHE = '/var/cache/kuryr-cni-pyc'
_SUMMARY = re.compile(r'^=* ?(.*\d+ \w+.*) in [0-9.]+s', re.M)


def run(guests, name):
    """Make the guest's virtualenv, then run FILES there; the pytest run's Result."""
    guests.run(name, vm_guests.venv_command(), timeout=VENV_TIMEOUT).check(
        'the virtualenv from the wheel folder')
    return guests.run(name, (
        'cd {repo} && CI=true PYTHONPATH={repo} PYTHONPYCACHEPREFIX={pycache} '
        '{venv}/bin/python -m pytest -p no:cacheprovider -q -rfEs --durations=5 '
        '-k {deselect!r} {files}').format(
            repo=vm_guests.REPO, venv=vm_guests.VENV, deselect=DESELECT, pycache=PYCACHE,
            files=' '.join(FILES)), timeout=RUN_TIMEOUT)


def summary_counts(output):
    """{'passed': 31, 'skipped': 2, ...} from pytest's last summary line."""
    lines = _SUMMARY.findall(output)
    assert lines, 'no pytest summary in:\n' + output[-3000:]
    return {word: int(n) for n, word in re.findall(r'(\d+) (\w+)', lines[-1])}
