"""tests/conftest.py: under CI=true a skip for a missing prerequisite fails.

Runs pytest for real, in a subprocess, on a small test file in a temporary
directory, with the suite's root conftest as a plugin.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

TESTS = '''
import pytest

def test_runs():
    pass

@pytest.mark.skipif(True, reason='needs root and iproute2 (ip) to create network namespaces')
def test_needs_root():
    pass

def test_needs_a_tool():
    pytest.skip('shellcheck is not installed (apt-get install shellcheck)')

def test_needs_a_kernel_feature():
    pytest.skip('this kernel cannot create vlan links (Error: Unknown device type.)')

def test_runs_in_the_vm_tier():
    pytest.skip('runs in the vm tier (tests/vm): '
                'this kernel cannot create vlan links (Error: Unknown device type.)')

@pytest.mark.xfail(reason='known bug', strict=True)
def test_known_bug():
    assert False
'''


def _outcomes(tmp_path, ci):
    (tmp_path / 'test_sample.py').write_text(TESTS)
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE='1')
    env.pop('CI', None)
    if ci is not None:
        env['CI'] = ci
    proc = subprocess.run([sys.executable, '-m', 'pytest', '-p', 'tests.conftest', '-p',
                           'no:cacheprovider', '-rA', '-q', 'test_sample.py'],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    outcomes = {}
    for line in proc.stdout.splitlines():
        word, _, rest = line.partition(' ')
        if word in ('PASSED', 'FAILED', 'ERROR', 'XFAIL'):
            name = rest.split('::')[-1].split()[0] if '::' in rest else rest
            outcomes[name] = word
    return proc, outcomes


def test_under_ci_only_kernel_skips_the_vm_tier_runs_stay(tmp_path):
    proc, outcomes = _outcomes(tmp_path, 'true')
    assert proc.returncode == 1, proc.stdout
    assert outcomes['test_runs'] == 'PASSED'
    # A skip mark acts at setup, where pytest calls a failure an error.
    assert outcomes['test_needs_root'] == 'ERROR'
    assert outcomes['test_needs_a_tool'] == 'FAILED'
    # A kernel feature no tier makes up for is a hole in CI like any other.
    assert outcomes['test_needs_a_kernel_feature'] == 'FAILED'
    assert outcomes['test_known_bug'] == 'XFAIL'
    assert 'needs root and iproute2' in proc.stdout and 'shellcheck is not installed' in proc.stdout
    assert '2 failed, 1 passed, 1 skipped, 1 xfailed, 1 error' in proc.stdout
    assert 'SKIPPED [1] test_sample.py:18: runs in the vm tier (tests/vm)' in proc.stdout


@pytest.mark.parametrize('ci', [None, 'false'])
def test_elsewhere_every_skip_stays_a_skip(tmp_path, ci):
    proc, _ = _outcomes(tmp_path, ci)
    assert proc.returncode == 0, proc.stdout
    assert '1 passed, 4 skipped, 1 xfailed' in proc.stdout
