"""The stack is what tools/openstack-constraints.txt pins, and nothing else."""

import os
import re
import subprocess

from tests.openstack import stack as osstack


def _name(requirement):
    return re.sub(r'[-_.]+', '-', requirement.lower())


def test_every_installed_package_is_pinned(build):
    with open(osstack.CONSTRAINTS) as f:
        pins = {_name(name): version for name, version in
                (line.strip().split('==') for line in f if '==' in line and
                 not line.startswith('#'))}
    for venv in ('venv-neutron', 'venv-kuryr'):
        pip = os.path.join(build, venv, 'bin', 'pip')
        frozen = subprocess.run([pip, 'freeze', '--disable-pip-version-check'], check=True,
                                capture_output=True, text=True, timeout=120).stdout
        installed = {_name(name): version for name, version in
                     (line.split('==') for line in frozen.splitlines() if '==' in line)}
        assert installed, venv
        assert {name: pins.get(name) for name in installed} == installed, venv
