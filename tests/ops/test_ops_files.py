"""The systemd unit, the container image, its entrypoint and the Zuul jobs.

The unit is checked for the contract (DESIGN.md 4.4: Type=notify, watchdog,
graceful stop, the daemon's directories, a hardening that still allows
netlink and setns) and, where ``systemd-analyze`` exists, verified by systemd
itself and held to its security exposure score. The entrypoint runs for real
against temporary directories with a stand-in daemon.
"""

import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.ops import shellcheck

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / 'etc' / 'systemd' / 'kuryr-cni-daemon.service'
DOCKERFILE = REPO / 'Dockerfile'
ENTRYPOINT = REPO / 'tools' / 'container-entrypoint.sh'
ZUUL = REPO / '.zuul.yaml'

CONFIG = '/etc/kuryr-cni/kuryr-cni.conf'
SHIM_TIMEOUT = 110
# Exposure reported by `systemd-analyze security` (0 best, 10 worst) is 3.7
# today; a change that loosens the sandbox past this fails.
MAX_EXPOSURE = 4.5


# --- systemd unit ------------------------------------------------------------

def _parse_unit(text):
    """section -> key -> [values] (keys may repeat in unit files)."""
    sections = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in '#;':
            continue
        if line.startswith('['):
            current = sections.setdefault(line.strip('[]'), {})
            continue
        key, _, value = line.partition('=')
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


UNIT_DATA = _parse_unit(UNIT.read_text())
SERVICE = UNIT_DATA['Service']


def _one(key):
    values = SERVICE.get(key, [])
    assert len(values) == 1, '%s: %r' % (key, values)
    return values[0]


def _seconds(value):
    match = re.fullmatch(r'(\d+)\s*(s|min|m)?', value)
    assert match, value
    return int(match.group(1)) * (60 if match.group(2) in ('min', 'm') else 1)


def test_unit_is_a_notify_service_with_a_watchdog():
    assert _one('Type') == 'notify'
    assert _one('NotifyAccess') in ('main', 'all')
    assert _seconds(_one('WatchdogSec')) == 30
    assert _one('Restart') == 'on-failure'
    assert _seconds(_one('RestartSec')) > 0


def _daemon_defaults():
    from kuryr_cni import conf as kuryr_conf
    return {group: {opt.name: opt.default for opt in opts}
            for group, opts in kuryr_conf.list_opts()}


def test_unit_stops_gracefully():
    # SIGTERM to the cotyledon parent only; SIGKILL for all after the timeout,
    # which must outlast the daemon's own graceful shutdown (main.py: request
    # deadline + 10 s) and the shim's wait.
    assert _one('KillMode') == 'mixed'
    assert SERVICE.get('KillSignal', ['SIGTERM']) == ['SIGTERM']
    graceful = _daemon_defaults()['cni_daemon']['request_timeout'] + 10
    assert _seconds(_one('TimeoutStopSec')) > max(graceful, SHIM_TIMEOUT)


def test_unit_starts_the_daemon_with_its_config():
    command = _one('ExecStart').split()
    # The virtualenv of doc/source/install.rst (tests/ops/test_install.py).
    assert command[0] == '/opt/kuryr-cni/bin/kuryr-cni-daemon'
    assert command[1:] == ['--config-file', CONFIG]
    assert 'User' not in SERVICE or SERVICE['User'] == ['root']


def test_unit_directories_are_the_daemons_defaults():
    defaults = _daemon_defaults()
    run_dir = Path(defaults['cni_daemon']['socket']).parent
    state_dir = Path(defaults['cni_daemon']['state_dir'])
    assert (Path('/run') / _one('RuntimeDirectory')) == run_dir
    assert (Path('/var/lib') / _one('StateDirectory')) == state_dir
    assert _one('RuntimeDirectoryMode') == '0700'
    assert _one('StateDirectoryMode') == '0700'
    writable = {p.lstrip('-') for p in _one('ReadWritePaths').split()}
    assert {str(run_dir), str(state_dir)} <= writable


# The watcher's and ops' drop to [cni_daemon] unprivileged_user (privileges.drop), and
# the run dir's shared directories given to that user's group (privileges.shared_dir),
# and the parent's SIGTERM to the dropped processes at shutdown (CAP_KILL).
DROP_CAPS = {'CAP_SETUID', 'CAP_SETGID', 'CAP_SETPCAP', 'CAP_CHOWN', 'CAP_KILL'}


def test_unit_bounds_memory_as_the_daemonset_does():
    """operations.rst says MemoryMax= bounds the daemon's memory: the unit must set it."""
    with open(REPO / 'etc' / 'kubernetes' / 'kuryr-cni-daemonset.yaml') as f:
        [daemonset] = [d for d in yaml.safe_load_all(f) if d and d['kind'] == 'DaemonSet']
    [container] = [c for c in daemonset['spec']['template']['spec']['containers']
                   if c['name'] == 'kuryr-cni-daemon']
    assert container['resources']['limits']['memory'] == '512Mi'
    assert _one('MemoryMax') == '512M'


def test_unit_capabilities_allow_netlink_setns_and_the_drop_of_root_only():
    caps = {cap for line in SERVICE['CapabilityBoundingSet'] for cap in line.split()}
    assert {'CAP_NET_ADMIN', 'CAP_SYS_ADMIN'} | DROP_CAPS <= caps
    assert caps <= {'CAP_NET_ADMIN', 'CAP_SYS_ADMIN', 'CAP_SYS_PTRACE',
                    'CAP_DAC_OVERRIDE'} | DROP_CAPS
    assert _one('NoNewPrivileges') == 'yes'
    assert 'User' not in SERVICE and 'DynamicUser' not in SERVICE


def test_unit_hardening_keeps_network_and_namespace_work_possible():
    assert _one('ProtectSystem') == 'strict'
    assert _one('ProtectHome') in ('yes', 'read-only')
    assert _one('PrivateTmp') == 'yes'
    families = set(_one('RestrictAddressFamilies').split())
    assert families == {'AF_UNIX', 'AF_INET', 'AF_INET6', 'AF_NETLINK'}
    # The daemon works in the host netns and writes sysctls of pod netns.
    for breaking in ('PrivateNetwork', 'ProtectKernelTunables', 'ProtectHostname'):
        assert SERVICE.get(breaking, ['no']) == ['no'], breaking
    # setns(2) into network namespaces must stay allowed.
    assert _one('RestrictNamespaces') == 'net'
    # The netns bind mounts are only read: no bind mount of ours over them.
    writable = _one('ReadWritePaths')
    assert 'netns' not in writable


@pytest.fixture
def systemd_analyze():
    path = shutil.which('systemd-analyze')
    if not path:
        pytest.skip('systemd-analyze is not installed (Debian package systemd)')
    return path


def _unit_copy(tmp_path, text=None):
    """The unit with ExecStart pointing at an executable that exists here."""
    daemon = tmp_path / 'kuryr-cni-daemon'
    daemon.write_text('#!/bin/sh\nexit 0\n')
    daemon.chmod(0o755)
    text = text if text is not None else UNIT.read_text()
    text = re.sub(r'^ExecStart=\S+', 'ExecStart=%s' % daemon, text, flags=re.M)
    path = tmp_path / 'units' / UNIT.name
    path.parent.mkdir()
    path.write_text(text)
    return path


def _verify(systemd_analyze, unit):
    proc = subprocess.run([systemd_analyze, 'verify', str(unit)], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, SYSTEMD_LOG_COLOR='0'))
    # verify exits 0 on unknown keys and bad values; its complaints name the file.
    complaints = [line for line in (proc.stdout + proc.stderr).splitlines()
                  if unit.name in line]
    return proc.returncode, complaints


def test_systemd_verifies_the_unit(systemd_analyze, tmp_path):
    rc, complaints = _verify(systemd_analyze, _unit_copy(tmp_path))
    assert rc == 0 and complaints == []


def test_systemd_verify_catches_mistakes(systemd_analyze, tmp_path):
    text = UNIT.read_text().replace('Type=notify', 'Type=notfy').replace(
        'KillMode=mixed', 'KilMode=mixed')
    _, complaints = _verify(systemd_analyze, _unit_copy(tmp_path, text))
    assert len(complaints) == 2, complaints


def _syscalls(systemd_analyze, group, seen=None):
    """The system calls of a SystemCallFilter= group, its groups expanded."""
    seen = set() if seen is None else seen
    out = subprocess.run([systemd_analyze, 'syscall-filter', group], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    calls = set()
    for line in out.splitlines()[1:]:
        word = line.strip()
        if word.startswith('@') and word not in seen:
            seen.add(word)
            calls |= _syscalls(systemd_analyze, word, seen)
        elif word and not word.startswith('#'):
            calls.add(word)
    return calls


def test_the_system_call_filter_lets_the_watcher_and_ops_drop_root(systemd_analyze):
    allowed = set()
    for group in _one('SystemCallFilter').split():
        allowed |= _syscalls(systemd_analyze, group) if group.startswith('@') else {group}
    assert {'setgroups', 'setresgid', 'setresuid', 'capset', 'prctl'} <= allowed


def test_systemd_security_exposure_stays_low(systemd_analyze, tmp_path):
    unit = _unit_copy(tmp_path)
    proc = subprocess.run([systemd_analyze, 'security', '--offline=yes', '--no-pager',
                           str(unit)], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0 and 'offline' in proc.stderr:
        pytest.skip('this systemd-analyze has no --offline')
    match = re.search(r'Overall exposure level for \S+: ([\d.]+)', proc.stdout)
    assert match, proc.stdout + proc.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE


# --- Dockerfile --------------------------------------------------------------

def _dockerfile_instructions():
    """(INSTRUCTION, arguments) with continuation lines joined."""
    instructions = []
    pending = ''
    for line in DOCKERFILE.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith('#')):
            continue
        if line.rstrip().endswith('\\'):
            pending += line.rstrip()[:-1] + ' '
            continue
        line = pending + line
        pending = ''
        word, _, rest = line.strip().partition(' ')
        instructions.append((word.upper(), rest.strip()))
    assert not pending
    return instructions


def _stage(name=None):
    """The instructions of the stage ``name`` (``FROM ... AS name``), or of the last one."""
    instructions = _dockerfile_instructions()
    starts = [i for i, (word, _) in enumerate(instructions) if word == 'FROM']
    if name is None:
        return instructions[starts[-1]:]
    for start, end in zip(starts, starts[1:] + [len(instructions)]):
        if instructions[start][1].split()[-2:] == ['AS', name]:
            return instructions[start:end]
    raise AssertionError('no stage %s in the Dockerfile' % name)


def _copies(stage):
    """destination -> source of COPY instructions from the build context."""
    copies = {}
    for word, args in stage:
        if word == 'COPY' and '--from=' not in args:
            parts = [p for p in args.split() if not p.startswith('--')]
            src, dst = parts[:-1], parts[-1]
            assert len(src) == 1, args
            copies[dst] = src[0]
    return copies


def test_image_is_built_on_python_311_bookworm():
    bases = [args.split()[0] for word, args in _dockerfile_instructions() if word == 'FROM']
    assert bases
    for base in bases:
        assert base in ('python:3.11-slim-bookworm', 'debian:bookworm-slim'), base


def test_image_installs_the_package_and_stages_the_shim():
    stage = _stage()
    runs = ' '.join(args for word, args in stage if word == 'RUN')
    assert re.search(r'pip install .*\bkuryr-cni\b', runs)
    copies = _copies(stage)
    for src in copies.values():
        assert (REPO / src).exists(), src
    staged = [args for word, args in stage
              if word == 'COPY' and args.endswith(' /opt/cni-bin-stage/kuryr-cni')]
    assert staged == ['--from=shim /kuryr-cni /opt/cni-bin-stage/kuryr-cni']
    for dst in list(copies) + ['/opt/cni-bin-stage/kuryr-cni']:
        assert dst in runs, '%s is not made executable' % dst


def test_image_builds_the_shim_with_debians_go_and_the_build_script():
    stage = _stage('shim')
    assert stage[0][1].split()[0] == 'debian:bookworm-slim'
    runs = [args for word, args in stage if word == 'RUN']
    assert 'apt-get install -y --no-install-recommends golang-go' in runs[0]
    assert runs[-1] == '/src/tools/build-shim /kuryr-cni'


def test_image_shim_stage_copies_what_the_build_needs(tmp_path, shim_binary):
    """Run the stage's build on exactly what it copies (under tmp_path, as /src)."""
    stage = _stage('shim')
    for args in (args for word, args in stage if word == 'COPY'):
        *sources, dst = args.split()
        assert dst.startswith('/src/'), dst
        for src in sources:
            target = tmp_path / (dst[1:] + os.path.basename(src) if dst.endswith('/')
                                 else dst[1:])
            target.parent.mkdir(parents=True, exist_ok=True)
            copy = shutil.copytree if (REPO / src).is_dir() else shutil.copy2
            copy(REPO / src, target)
    build = [args for word, args in stage if word == 'RUN'][-1].split()
    out = tmp_path / 'kuryr-cni'
    env = dict(os.environ, GOCACHE=str(REPO / '.cache' / 'go-build'))   # warm: fast
    proc = subprocess.run([str(tmp_path) + build[0], str(out)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == Path(shim_binary).read_bytes()   # the same build


def test_image_entrypoint_is_the_script_that_installs_the_shim():
    stage = _stage()
    entrypoints = [args for word, args in stage if word == 'ENTRYPOINT']
    assert len(entrypoints) == 1
    command = json.loads(entrypoints[0])   # exec form: the daemon gets the signals
    assert _copies(stage)[command[0]] == 'tools/container-entrypoint.sh'
    default_shim = re.search(r'^KURYR_CNI_SHIM=\$\{KURYR_CNI_SHIM:-([^}]+)\}$',
                             ENTRYPOINT.read_text(), re.M).group(1)
    assert default_shim == '/opt/cni-bin-stage/kuryr-cni'


# --- entrypoint --------------------------------------------------------------

class Node:
    """A node's CNI directories and a stand-in daemon, under tmp_path."""

    def __init__(self, tmp_path, shim):
        self.tmp = tmp_path
        self.bin_dir = tmp_path / 'host/opt/cni/bin'
        self.conf_dir = tmp_path / 'host/etc/cni/net.d'
        self.stage = tmp_path / 'stage/kuryr-cni'
        self.config_dir = tmp_path / 'etc/kuryr-cni'
        self.config = self.config_dir / 'kuryr-cni.conf'
        self.conflist = self.config_dir / '10-kuryr.conflist'
        self.shim_paths = self.config_dir / 'kuryr-cni-paths.json'     # not there by default
        self.node_config = tmp_path / 'run/kuryr-cni-node.conf'
        self.record = tmp_path / 'daemon-record.json'
        self.daemon = tmp_path / 'fake-daemon'
        for d in (self.bin_dir, self.conf_dir, self.stage.parent, self.config_dir,
                  self.node_config.parent):
            d.mkdir(parents=True)
        shutil.copy2(shim, self.stage)
        self.config.write_text('[DEFAULT]\n')
        self.conflist.write_text('{"cniVersion": "1.1.0", "name": "kuryr", "plugins": []}\n')
        # Records its pid and arguments, and the node config as it saw it.
        self.daemon.write_text(
            '#!%s\nimport json, os, sys\n'
            'conf = open(sys.argv[2]).read()\n'
            'json.dump({"pid": os.getpid(), "argv": sys.argv[1:], "node_conf": conf},'
            ' open(%r, "w"))\n' % (shutil.which('python3'), str(self.record)))
        self.daemon.chmod(0o755)
        self.env = {
            'PATH': os.environ.get('PATH', '/usr/bin:/bin'),
            'CNI_BIN_DIR': str(self.bin_dir),
            'CNI_CONF_DIR': str(self.conf_dir),
            'KURYR_CNI_SHIM': str(self.stage),
            'KURYR_CNI_CONFIG': str(self.config),
            'KURYR_CNI_CONFLIST': str(self.conflist),
            'KURYR_CNI_SHIM_PATHS': str(self.shim_paths),
            'KURYR_CNI_POD_CONFIG': str(self.node_config),
            'KURYR_CNI_DAEMON': str(self.daemon),
            'NODE_NAME': 'worker-3',
        }

    def run(self, *args, **env):
        full_env = dict(self.env)
        for key, value in env.items():
            if value is None:
                full_env.pop(key, None)
            else:
                full_env[key] = value
        proc = subprocess.Popen(['bash', str(ENTRYPOINT), *args], env=full_env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        out, err = proc.communicate(timeout=60)
        record = json.loads(self.record.read_text()) if self.record.exists() else None
        return proc, err, record


@pytest.fixture
def node(tmp_path, shim_binary):
    return Node(tmp_path, shim_binary)


def test_entrypoint_installs_shim_and_conflist_then_execs_the_daemon(node):
    proc, err, record = node.run('--debug')
    assert proc.returncode == 0, err

    _assert_shim_installed(node)
    installed = node.conf_dir / '10-kuryr.conflist'
    assert installed.read_bytes() == node.conflist.read_bytes()
    assert stat.S_IMODE(installed.stat().st_mode) == 0o644
    # Nothing left behind under temporary names.
    assert [p.name for p in node.bin_dir.iterdir()] == ['kuryr-cni']
    assert [p.name for p in node.conf_dir.iterdir()] == ['10-kuryr.conflist']

    # exec'd (same pid: kubelet's SIGTERM reaches the daemon), per-node config
    # first so that the ConfigMap wins, extra arguments passed on.
    assert record['pid'] == proc.pid
    assert record['argv'] == ['--config-file', str(node.node_config),
                              '--config-file', str(node.config), '--debug']
    assert 'node_name = worker-3' in record['node_conf'].splitlines()


def test_entrypoint_installs_the_shims_allow_file_when_the_configmap_has_one(node):
    node.shim_paths.write_text('{"daemon_socket": ["/run/kuryr-cni-b/daemon.sock"]}\n')
    proc, err, record = node.run()
    assert proc.returncode == 0, err
    installed = node.bin_dir / 'kuryr-cni-paths.json'
    assert installed.read_bytes() == node.shim_paths.read_bytes()
    assert stat.S_IMODE(installed.stat().st_mode) == 0o644
    assert sorted(p.name for p in node.bin_dir.iterdir()) == ['kuryr-cni', installed.name]


def test_entrypoint_node_config_is_a_valid_daemon_config(node, tmp_path):
    from kuryr_cni import conf as kuryr_conf
    proc, err, _ = node.run()
    assert proc.returncode == 0, err
    conf = kuryr_conf.load(['--config-file', str(node.node_config)])
    assert conf.cni_daemon.node_name == 'worker-3'


def test_entrypoint_replaces_an_installed_shim(node):
    (node.bin_dir / 'kuryr-cni').write_text('old')
    (node.bin_dir / 'loopback').write_text('other plugin')
    proc, err, _ = node.run()
    assert proc.returncode == 0, err
    _assert_shim_installed(node)
    assert (node.bin_dir / 'loopback').read_text() == 'other plugin'


def _assert_shim_installed(node):
    """The staged executable, copied, answering VERSION."""
    shim = node.bin_dir / 'kuryr-cni'
    assert stat.S_IMODE(shim.stat().st_mode) == 0o755
    assert shim.read_bytes() == node.stage.read_bytes()
    proc = subprocess.run([str(shim)], env={'CNI_COMMAND': 'VERSION'}, capture_output=True,
                          stdin=subprocess.DEVNULL, timeout=30)
    assert (proc.returncode, proc.stderr) == (0, b'')
    assert json.loads(proc.stdout)['cniVersion'] == '1.1.0'


def test_entrypoint_without_conflist_leaves_cni_config_alone(node):
    node.conflist.unlink()
    proc, err, record = node.run()
    assert proc.returncode == 0, err
    assert list(node.conf_dir.iterdir()) == []
    assert record is not None


def test_entrypoint_without_node_name_lets_the_daemon_use_the_hostname(node):
    proc, err, record = node.run(NODE_NAME=None)
    assert proc.returncode == 0, err
    assert 'node_name' not in record['node_conf']
    assert 'NODE_NAME is not set' in err


def test_entrypoint_fails_when_the_cni_bin_dir_is_not_mounted(node):
    shutil.rmtree(node.bin_dir)
    proc, err, record = node.run()
    assert proc.returncode != 0
    assert 'is not mounted' in err
    assert record is None


def test_entrypoint_shellcheck():
    shellcheck.assert_clean(ENTRYPOINT)


# --- Zuul --------------------------------------------------------------------

def _zuul():
    with open(ZUUL) as f:
        data = yaml.safe_load(f)
    jobs = {item['job']['name']: item['job'] for item in data if 'job' in item}
    projects = [item['project'] for item in data if 'project' in item]
    assert len(projects) == 1
    return jobs, projects[0]


def _job_names(pipeline):
    return [j if isinstance(j, str) else next(iter(j)) for j in pipeline['jobs']]


def test_zuul_devstack_job_enables_the_plugin_and_the_service():
    jobs, _ = _zuul()
    job = jobs['kuryr-cni-devstack']
    assert job['parent'] in ('devstack', 'devstack-minimal')
    assert 'openstack/kuryr-cni' in job['required-projects']
    for project in ('devstack-plugin-container', 'kuryr-kubernetes', 'neutron'):
        assert 'openstack/' + project in job['required-projects']
    variables = job['vars']
    assert set(variables['devstack_plugins']) >= {'kuryr-cni', 'devstack-plugin-container',
                                                  'kuryr-kubernetes'}
    services = variables['devstack_services']
    assert services['kuryr-cni-daemon'] is True
    assert services['kuryr-kubernetes'] is True
    assert services['kuryr-daemon'] is False


def test_zuul_pipelines_run_every_tier_and_the_devstack_job():
    _, project = _zuul()
    check = _job_names(project['check'])
    gate = _job_names(project['gate'])
    for job in ('openstack-tox-pep8', 'openstack-tox-py311', 'kuryr-cni-tox-ops',
                'kuryr-cni-tox-py3-constraints', 'kuryr-cni-tox-functional',
                'kuryr-cni-devstack'):
        assert job in check and job in gate, job
    # As the zuul user, every functional test would skip: never that job.
    assert 'openstack-tox-functional' not in check
    assert set(gate) <= set(check)


def _tox_envs():
    import configparser
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(REPO / 'tox.ini')
    return tox


def test_zuul_tox_jobs_have_their_tox_environments():
    tox = _tox_envs()
    jobs, project = _zuul()
    for job in _job_names(project['check']):
        match = re.fullmatch(r'openstack-tox-(\w+)', job)
        if match and not re.fullmatch(r'py\d+', match.group(1)):
            assert tox.has_section('testenv:%s' % match.group(1)), job
        if job in jobs and 'tox_envlist' in jobs[job].get('vars', {}):
            assert tox.has_section('testenv:%s' % jobs[job]['vars']['tox_envlist']), job


def test_zuul_functional_job_runs_tox_as_root_with_ci_true():
    jobs, _ = _zuul()
    job = jobs['kuryr-cni-tox-functional']
    assert job['vars']['tox_envlist'] == 'functional'
    with open(REPO / job['run']) as f:
        [play] = yaml.safe_load(f)
    [task] = play['tasks']
    assert task['become'] is True
    assert task['command'].endswith('-e {{ tox_envlist }}')
    assert task['args']['chdir'] == '{{ zuul.project.src_dir }}'
    assert task['environment']['CI'] == 'true'


def test_zuul_ops_job_runs_with_ci_true():
    jobs, _ = _zuul()
    assert jobs['kuryr-cni-tox-ops']['vars']['tox_environment']['CI'] == 'true'
    assert 'CI' in _tox_envs()['testenv']['passenv']


def test_ci_run_exports_ci_true():
    text = (REPO / '.ci' / 'run').read_text()
    assert re.search(r'^export CI=true$', text, re.M)
    assert text.rstrip().endswith('exec tools/test')


# --- bindep.txt ------------------------------------------------------------------

def _bindep():
    packages = {}
    for line in (REPO / 'bindep.txt').read_text().splitlines():
        line = line.split('#')[0].strip()
        if line:
            name, _, selector = line.partition(' ')
            packages[name] = set(selector.strip('[]').split())
    return packages


def _bootstrap_packages():
    text = (REPO / 'tools' / 'bootstrap').read_text()
    block = re.search(r'^PACKAGES=\((.*?)^\)', text, re.M | re.S).group(1)
    return {word for line in block.splitlines() for word in line.split('#')[0].split()}


def test_bindep_installs_for_the_tests_what_bootstrap_installs_here():
    packages = _bindep()
    for name, selector in packages.items():
        assert {'platform:dpkg', 'test'} <= selector, name
    # python3 itself is the gate node's; promtool comes from the prometheus
    # package there, from a download of it here.
    assert _bootstrap_packages() - {'python3'} <= set(packages)
    assert {'prometheus', 'iproute2', 'openvswitch-switch', 'golang-go'} <= set(packages)
