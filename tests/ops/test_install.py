"""doc/source/install.rst, "Under systemd": the documented lines, run as written.

The shell block of that section is taken from the page and run by bash from
the checkout, with ``errexit``. Its absolute paths (``/opt``, ``/etc``,
``/usr/local``) are moved into a temporary root, so nothing outside it is
written. The lines that would act on the machine itself stay commands but
are stand-ins that record their arguments: ``apt-get`` and ``systemctl``.
Everything else is real: the virtualenv made by Debian's Python, ``pip
install .`` (dependencies from PyPI, as for an operator), the shim install,
``oslo-config-validator`` from the virtualenv, and ``systemd-analyze verify``
of the installed unit against that root, where its ``ExecStart`` must exist.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kuryr_cni import version

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / 'doc' / 'source' / 'install.rst'
SYSTEM_PYTHON = '/usr/bin/python3'
UNITS = Path('/usr/lib/systemd/system')

RECORDER = '#!/bin/sh\nprintf "%s\\n" "$(basename "$0") $*" >> "$KC_RECORD"\n'


def _documented_steps():
    """The shell lines of the "Under systemd" section's code block, joined."""
    section = PAGE.read_text().split('Under systemd\n=============', 1)[1]
    block = section.split('.. code-block:: sh\n', 1)[1]
    lines = []
    for line in block.split('\n')[1:]:
        if line and not line.startswith('    '):
            break
        lines.append(line[4:])
    return '\n'.join(lines).strip().replace('\\\n', '')


def _moved(steps, root):
    return re.sub(r'(?<![\w.~/-])/(opt|etc|usr/local)/', lambda m: '%s/%s/' % (root, m.group(1)),
                  steps)


needs = pytest.mark.skipif(
    not (os.path.exists(SYSTEM_PYTHON) and shutil.which('systemd-analyze')
         and UNITS.is_dir()),
    reason='needs Debian\'s python3 (with python3-venv) and systemd-analyze (package systemd)')


@pytest.fixture(scope='module')
def installed(tmp_path_factory):
    """Run the documented steps into a temporary root; returns (root, record, proc)."""
    tmp = tmp_path_factory.mktemp('install')
    root = tmp / 'root'
    # What a Debian 12 machine has before the first step.
    for directory in ('usr/local/bin', 'etc/systemd/system'):
        (root / directory).mkdir(parents=True)
    # The units systemd-analyze resolves the unit's dependencies against.
    shutil.copytree(UNITS, root / 'usr/lib/systemd/system', symlinks=True)
    stand_ins = tmp / 'bin'
    stand_ins.mkdir()
    for name in ('apt-get', 'systemctl'):
        (stand_ins / name).write_text(RECORDER)
        (stand_ins / name).chmod(0o755)
    record = tmp / 'record'
    record.write_text('')
    script = tmp / 'steps.sh'
    script.write_text('set -o errexit -o nounset -o pipefail\n'
                      'systemd-analyze() { command systemd-analyze --root="$KC_ROOT" "$@"; }\n'
                      + _moved(_documented_steps(), root) + '\n')
    env = {'PATH': '%s:/usr/sbin:/usr/bin:/sbin:/bin' % stand_ins, 'HOME': str(tmp),
           'LANG': 'C.UTF-8', 'KC_RECORD': str(record), 'KC_ROOT': str(root),
           'SYSTEMD_LOG_COLOR': '0', 'PIP_DISABLE_PIP_VERSION_CHECK': '1'}
    for name in ('PIP_INDEX_URL', 'PIP_EXTRA_INDEX_URL', 'PIP_FIND_LINKS', 'http_proxy',
                 'https_proxy', 'no_proxy'):
        if name in os.environ:
            env[name] = os.environ[name]
    proc = subprocess.run(['bash', str(script)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900, stdin=subprocess.DEVNULL)
    return root, record, proc


def test_the_steps_are_what_the_page_says():
    steps = _documented_steps().splitlines()
    assert steps[0] == 'apt-get install --yes python3-venv golang-go'
    assert 'python3 -m venv /opt/kuryr-cni' in steps
    assert '/opt/kuryr-cni/bin/pip install .' in steps
    assert not [s for s in steps if re.match(r'(sudo )?pip3? install', s)], \
        'pip into the system Python is refused on Debian 12 (externally managed)'
    assert steps[-1] == 'systemctl enable --now kuryr-cni-daemon'


@needs
def test_the_documented_steps_run_to_the_end(installed):
    root, record, proc = installed
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert record.read_text().splitlines() == [
        'apt-get install --yes python3-venv golang-go', 'systemctl daemon-reload',
        'systemctl enable --now kuryr-cni-daemon']


@needs
def test_the_unit_starts_what_the_venv_holds(installed):
    root, _, proc = installed
    assert proc.returncode == 0, proc.stderr
    unit = (root / 'etc/systemd/system/kuryr-cni-daemon.service').read_text()
    exec_start = re.search(r'^ExecStart=(\S+) --config-file (\S+)$', unit, re.M)
    daemon, config = exec_start.groups()
    assert daemon == '/opt/kuryr-cni/bin/kuryr-cni-daemon'
    assert (root / config.lstrip('/')).is_file()
    answer = subprocess.run([str(root / daemon.lstrip('/')), '--version'],
                            capture_output=True, text=True, timeout=60)
    assert answer.stdout == 'kuryr-cni-daemon %s\n' % version.VERSION
    ctl = subprocess.run([str(root / 'usr/local/bin/kuryr-cni-ctl'), '--version'],
                         capture_output=True, text=True, timeout=60)
    assert ctl.stdout == 'kuryr-cni-ctl %s\n' % version.VERSION
    # systemd-analyze verify said nothing about the unit.
    assert 'kuryr-cni-daemon.service' not in proc.stderr + proc.stdout


@needs
def test_verify_fails_the_steps_when_execstart_is_missing(installed, tmp_path):
    root, _, _ = installed
    unit = root / 'etc/systemd/system/kuryr-cni-daemon.service'
    broken = tmp_path / 'root'
    shutil.copytree(root / 'etc', broken / 'etc')
    shutil.copytree(root / 'usr/lib', broken / 'usr/lib', symlinks=True)
    proc = subprocess.run(['systemd-analyze', 'verify', '--root=%s' % broken,
                           str(broken / unit.relative_to(root))], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, SYSTEMD_LOG_COLOR='0'))
    assert proc.returncode != 0
    assert '/opt/kuryr-cni/bin/kuryr-cni-daemon is not executable' in proc.stderr


@needs
def test_the_shim_and_the_network_config_are_in_place(installed):
    root, _, _ = installed
    assert os.access(root / 'opt/cni/bin/kuryr-cni', os.X_OK)
    assert (root / 'etc/cni/net.d/10-kuryr.conflist').read_bytes() == (
        REPO / 'etc/cni/10-kuryr.conflist').read_bytes()
    assert oct((root / 'etc/kuryr-cni/kuryr-cni.conf').stat().st_mode & 0o777) == '0o640'


def test_the_validator_the_page_names_refuses_a_typo(tmp_path):
    """oslo-config-validator, as documented for operators, catches [cni_damon]."""
    import sys
    validator = Path(sys.executable).parent / 'oslo-config-validator'
    conf = tmp_path / 'kuryr-cni.conf'
    conf.write_text('[cni_damon]\nworker_count = 2\n')
    args = [str(validator), '--namespace', 'kuryr_cni', '--namespace', 'oslo.log',
            '--input-file', str(conf)]
    assert ' '.join(args[1:5]) in _documented_steps()
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert 'cni_damon/worker_count is not part of the sample config' in proc.stderr
    conf.write_text('[cni_daemon]\nworker_count = 2\n')
    assert subprocess.run(args, capture_output=True, timeout=60).returncode == 0
