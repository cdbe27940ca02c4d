"""What gets shipped: the wheel (setup.cfg, pyproject.toml) and the image's build context.

The wheel is built for real (``pip wheel --no-deps``, the build backend
fetched by pip as for any install) from a copy of the checkout in a
temporary directory, so the build leaves nothing in the tree.
"""

import configparser
import email
import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from kuryr_cni import version

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / 'pyproject.toml').read_text())
SETUP_CFG = configparser.ConfigParser(interpolation=None)
SETUP_CFG.read(REPO / 'setup.cfg')
DIST_INFO = 'kuryr_cni-%s.dist-info/' % version.VERSION


@pytest.fixture(scope='module')
def wheel(tmp_path_factory):
    """The wheel's ``zipfile.ZipFile``, built from a copy of the checkout."""
    tmp = tmp_path_factory.mktemp('wheel')
    listed = subprocess.run(['git', 'ls-files', '-z', '--cached', '--others',
                             '--exclude-standard'], cwd=REPO, capture_output=True, check=True,
                            timeout=60).stdout.decode().split('\0')
    src = tmp / 'src'
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    proc = subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-cache-dir',
                           '--disable-pip-version-check', '-q', '-w', str(tmp / 'out'),
                           str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [built] = (tmp / 'out').glob('*.whl')
    with zipfile.ZipFile(built) as zf:
        yield zf


def _metadata(wheel):
    return email.message_from_string(wheel.read(DIST_INFO + 'METADATA').decode())


def test_the_wheel_holds_the_package_modules_and_nothing_else(wheel):
    names = set(wheel.namelist())
    modules = {n for n in names if not n.startswith(DIST_INFO)}
    source = {str(p.relative_to(REPO)) for p in (REPO / 'kuryr_cni').rglob('*.py')}
    assert modules == source
    assert {n for n in names if n.startswith(DIST_INFO)} == {
        DIST_INFO + f for f in ('METADATA', 'WHEEL', 'RECORD', 'entry_points.txt',
                                'top_level.txt')}
    for unwanted in ('testbed', 'demo', 'tools/', 'tests/', 'bench'):
        assert not [n for n in names if unwanted in n], unwanted


def test_the_wheel_is_named_and_versioned_from_the_one_version(wheel):
    metadata = _metadata(wheel)
    assert (metadata['Name'], metadata['Version']) == ('kuryr-cni', version.VERSION)
    assert wheel.read(DIST_INFO + 'top_level.txt').decode().split() == ['kuryr_cni']


def test_the_wheel_metadata_states_python_readme_license_and_dependencies(wheel):
    metadata = _metadata(wheel)
    assert metadata['Requires-Python'] == '>=3.11'
    assert metadata['License-Expression'] == 'Apache-2.0'
    assert metadata['Description-Content-Type'] == 'text/markdown'
    assert metadata.get_payload().strip() == (REPO / 'README.md').read_text().strip()
    requires = {Requirement(r).name: Requirement(r) for r in metadata.get_all('Requires-Dist')}
    assert set(requires) == {'cotyledon', 'kubernetes', 'oslo.config', 'oslo.log',
                             'prometheus_client', 'pyroute2', 'setproctitle', 'urllib3'}
    # watcher.py calls HTTPResponse.shutdown(), new in urllib3 2.3.
    assert not requires['urllib3'].specifier.contains('2.2.3')
    assert requires['urllib3'].specifier.contains('2.3.0')
    # netns.py drives pyroute2 0.9's asyncio core.
    assert not requires['pyroute2'].specifier.contains('0.8.1')


def test_the_wheel_declares_the_commands_and_the_options_entry_point(wheel):
    entry_points = configparser.ConfigParser()
    entry_points.read_string(wheel.read(DIST_INFO + 'entry_points.txt').decode())
    assert dict(entry_points['console_scripts']) == {
        'kuryr-cni-daemon': 'kuryr_cni.daemon.main:main',
        'kuryr-cni-ctl': 'kuryr_cni.ctl:main'}
    assert dict(entry_points['oslo.config.opts']) == {'kuryr_cni': 'kuryr_cni.conf:list_opts'}


def test_setup_cfg_describes_the_package_and_pyproject_builds_it():
    # One description of the package, where OpenStack projects keep it.
    assert set(SETUP_CFG) >= {'metadata', 'options', 'options.entry_points'}
    assert SETUP_CFG['metadata']['version'] == 'attr: kuryr_cni.version.VERSION'
    assert 'project' not in PYPROJECT and 'setuptools' not in PYPROJECT.get('tool', {})
    assert PYPROJECT['build-system']['build-backend'] == 'setuptools.build_meta'
    assert not (REPO / 'setup.py').exists()


def test_version_is_a_literal_the_build_reads_without_importing():
    text = (REPO / 'kuryr_cni' / 'version.py').read_text()
    assert re.search(r"^VERSION = '%s'$" % re.escape(version.VERSION), text, re.M)
    Version(version.VERSION)     # a valid PEP 440 version


# --- the constraints file of tox -e py3-constraints ------------------------------

def _constraints():
    pins = {}
    for line in (REPO / 'upper-constraints.txt').read_text().splitlines():
        line = line.split('#')[0].strip()
        if line:
            name, _, pin = line.partition('===')
            pins[re.sub(r'[-_.]+', '-', name).lower()] = pin
    return pins


def test_every_dependency_is_pinned_within_its_range_in_the_constraints():
    pins = _constraints()
    for text in SETUP_CFG['options']['install_requires'].split():
        req = Requirement(text)
        pin = pins.get(re.sub(r'[-_.]+', '-', req.name).lower())
        assert pin is not None, '%s has no pin' % req.name
        assert req.specifier.contains(pin), '%s===%s is outside %s' % (req.name, pin, text)


def test_tox_has_a_constrained_unit_env_that_the_gate_points_at_openstack_pins():
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(REPO / 'tox.ini')
    env = tox['testenv:py3-constraints']
    assert '-c{env:TOX_CONSTRAINTS_FILE:{toxinidir}/upper-constraints.txt}' in env['deps']
    assert env['constrain_package_deps'] == 'true'
    assert 'commands' not in env or 'tests/unit' in env['commands']


# --- the image's build context -------------------------------------------------

def _dockerignored(path):
    patterns = [line.strip() for line in (REPO / '.dockerignore').read_text().splitlines()
                if line.strip() and not line.startswith('#')]
    parts = Path(path).parts
    for pattern in patterns:
        pattern = pattern.removeprefix('**/')
        for i in range(len(parts)):
            if fnmatch.fnmatch('/'.join(parts[:i + 1]), pattern) or fnmatch.fnmatch(
                    parts[i], pattern):
                return True
    return False


@pytest.mark.parametrize('path', ['.git/config', '.venv/bin/python', '.tox/py3/bin/python',
                                  '.cache/go-build/x', 'bench-results/report.json',
                                  'kuryr_cni/__pycache__/conf.cpython-311.pyc',
                                  'kuryr_cni.egg-info/PKG-INFO', 'doc/build/html/index.html',
                                  'tests/unit/test_vif.py'])
def test_dockerignore_keeps_environments_caches_and_results_out(path):
    assert _dockerignored(path), path


def test_dockerignore_keeps_what_the_image_build_reads():
    needed = ['pyproject.toml', 'README.md', 'kuryr_cni/conf.py', 'kuryr_cni/daemon/main.py',
              'tools/container-entrypoint.sh']
    for line in (REPO / 'Dockerfile').read_text().splitlines():
        match = re.match(r'COPY (?!--from)(\S+) ', line)
        if match and match.group(1) != '.':
            needed.append(match.group(1))
    for path in needed:
        assert not _dockerignored(path), path
