"""The vlan tests the host skips, passing in the guest (:mod:`tests.vm.kernel_suite`)."""

import ast
import pathlib

from tests.vm import conftest as vm
from tests.vm import guests as vm_guests
from tests.vm import kernel_suite

REPO = pathlib.Path(vm_guests.REPO)
# What the run holds at least: test_nested, test_vif_kinds (no ovs), test_rtnl, test_bridge.
AT_LEAST = 110


def _calls_kernel_lacks(path):
    tree = ast.parse(path.read_text())
    return any(isinstance(node, ast.Attribute) and node.attr == 'kernel_lacks'
               for node in ast.walk(tree))


def test_every_file_with_a_kernel_skip_runs_in_the_guest():
    """A test file that skips for a kernel feature must be in kernel_suite.FILES."""
    skipping = {str(path.relative_to(REPO))
                for path in sorted((REPO / 'tests' / 'functional').glob('test_*.py'))
                if _calls_kernel_lacks(path)}
    assert skipping and skipping <= set(kernel_suite.FILES), sorted(
        skipping - set(kernel_suite.FILES))


def test_the_host_kernels_skips_pass_on_the_guest_kernel(guests, kernel_run):
    result = kernel_run.result(timeout=kernel_suite.VENV_TIMEOUT + kernel_suite.RUN_TIMEOUT)
    counts = kernel_suite.summary_counts(result.output)
    kernel = guests.run(vm.KERNEL, 'uname -r').check('uname').strip()
    print('guest kernel %s: %s\n%s' % (kernel, counts, result.output[-1500:]))
    memory = {name: '%d MiB' % guests.memory_mib(name) for name in (vm.KERNEL, vm.SYSTEMD)}
    print('memory (resident guest RAM): %s' % memory)
    assert result.returncode == 0, result.output[-6000:]
    # Nothing skipped: under CI=true only a vm-tier kernel skip could, and this is the vm tier.
    assert set(counts) == {'passed', 'deselected'}, result.output[-6000:]
    assert counts['passed'] >= AT_LEAST, counts
