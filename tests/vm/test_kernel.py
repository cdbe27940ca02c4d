"""The functional tests the host's kernel cannot run, run in a guest whose kernel can.

The development and CI machines' kernel has no 802.1Q, so every vlan test of
tests/functional skips there, with a reason starting "runs in the vm tier"
(``tests.conftest.VM_TIER``; under CI=true that is the only kernel skip
allowed). Here the same files run in the ``kernel`` guest (user-mode Linux
6.1 with 8021q), from the checkout shared read-only, by pytest from a
virtualenv of the guest's own Debian Python, under CI=true: the run must pass
with nothing skipped. The rtnl channel's tests and the macvlan half of the
nested tests run along, so every kernel driver the nested path uses, and the
batched channel, see the guest's older kernel too. The ``ovs`` VIF kind of
tests/functional/test_vif_kinds.py is left to the host, which has Open
vSwitch; the guest image has none.
"""

import ast
import pathlib
import re

from tests.vm import conftest as vm
from tests.vm import guests as vm_guests

REPO = pathlib.Path(vm_guests.REPO)
# Every file of tests/functional that asks whether the kernel can make a link, and more.
FILES = ('tests/functional/test_nested.py', 'tests/functional/test_vif_kinds.py',
         'tests/functional/test_rtnl.py')
DESELECT = 'not ovs'
RUN_TIMEOUT = 1500      # seconds: fork+exec is 20 to 40 times slower in the guest
VENV_TIMEOUT = 600
_SUMMARY = re.compile(r'^=* ?(.*\d+ \w+.*) in [0-9.]+s', re.M)


def _calls_kernel_lacks(path):
    tree = ast.parse(path.read_text())
    return any(isinstance(node, ast.Attribute) and node.attr == 'kernel_lacks'
               for node in ast.walk(tree))


def test_every_file_with_a_kernel_skip_runs_here():
    """A new test file that skips for a kernel feature must be added to FILES."""
    skipping = {str(path.relative_to(REPO))
                for path in sorted((REPO / 'tests' / 'functional').glob('test_*.py'))
                if _calls_kernel_lacks(path)}
    assert skipping and skipping <= set(FILES), sorted(skipping - set(FILES))


def summary_counts(output):
    """{'passed': 31, 'skipped': 2, ...} from pytest's last summary line."""
    lines = _SUMMARY.findall(output)
    assert lines, 'no pytest summary in:\n' + output[-3000:]
    return {word: int(n) for n, word in re.findall(r'(\d+) (\w+)', lines[-1])}


def test_vlan_and_rtnl_tests_pass_on_the_guest_kernel(guests):
    guests.run(vm.KERNEL, vm_guests.venv_command(), timeout=VENV_TIMEOUT).check(
        'the virtualenv from the wheel folder')
    kernel = guests.run(vm.KERNEL, 'uname -r').check('uname')
    result = guests.run(vm.KERNEL, (
        'cd {repo} && CI=true PYTHONPATH={repo} '
        '{venv}/bin/python -m pytest -p no:cacheprovider -q -rfEs --durations=5 '
        '-k {deselect!r} {files}').format(
            repo=REPO, venv=vm_guests.VENV, deselect=DESELECT, files=' '.join(FILES)),
        timeout=RUN_TIMEOUT)
    counts = summary_counts(result.output)
    print('guest kernel %s: %s' % (kernel.strip(), counts))
    assert result.returncode == 0, result.output[-6000:]
    assert counts.get('passed', 0) >= 60, counts
    assert set(counts) == {'passed', 'deselected'}, result.output[-6000:]
