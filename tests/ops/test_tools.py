"""The commands for real counterparts (tools/openstack, tools/kube-apiserver), as tools.

What needs no build and no root: the scripts are clean bash, say how they
are used, and ``stop`` is safe on a directory that never ran anything (so a
fixture may call it whatever failed before).
"""

import pathlib
import subprocess

import pytest

from tests.ops import shellcheck

REPO = pathlib.Path(__file__).resolve().parents[2]

TOOLS = [REPO / 'tools' / 'openstack', REPO / 'tools' / 'kube-apiserver']


@pytest.mark.parametrize('tool', TOOLS, ids=lambda p: p.name)
def test_shellcheck(tool):
    shellcheck.assert_clean(tool, '--shell=bash', '--severity=style')


@pytest.mark.parametrize('tool', TOOLS, ids=lambda p: p.name)
def test_usage(tool):
    proc = subprocess.run([str(tool)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    for verb in ('build', 'start DIR', 'stop DIR'):
        assert '%s %s' % (tool.name, verb) in proc.stderr, verb


def test_openstack_stop_of_nothing_is_a_noop_twice(tmp_path):
    for _ in range(2):
        proc = subprocess.run([str(TOOLS[0]), 'stop', str(tmp_path / 'never-started')],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / 'never-started').exists()
