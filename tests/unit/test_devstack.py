"""devstack/plugin.sh, run phase by phase under bash with DevStack stubbed.

Every phase runs in a fresh ``bash`` the way DevStack runs it (``settings``
then ``plugin.sh <mode> <phase>`` sourced, with ``errexit``), against a
temporary root: every path variable of the plugin points into ``tmp_path``,
and the ``sudo`` stub refuses any absolute path outside it, so a path the
plugin forgot to take from its settings fails the test instead of touching
the machine. DevStack's functions are replaced by small stubs that record
their calls; ``iniset`` is a real (tiny) INI writer so the daemon's config
file can be read back, and checked against the daemon's own options.

The readiness wait talks to a real HTTP server on 127.0.0.1 through the real
``curl``.
"""

import configparser
import http.server
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / 'devstack' / 'plugin.sh'
SETTINGS = REPO / 'devstack' / 'settings'

# tools/build-shim as the plugin runs it, standing in for a Go build: it puts
# the shim this test session built where the real script puts it.
BUILD_SHIM = r'''#!/bin/sh
printf 'build-shim\036' >> "$KC_CALLS"
[ -z "$KC_BUILD_FAILS" ] || { echo "go: build failed" >&2; exit 1; }
cp "$KC_SHIM" "$(dirname "$0")/../shim/kuryr-cni"
'''

# DevStack's functions, as far as the plugin uses them. Calls are appended to
# $KC_CALLS as fields separated by \x1f, records by \x1e.
STUBS = r'''
_kc_record() {
    local arg
    {
        printf '%s' "$1"
        shift
        for arg in "$@"; do printf '\x1f%s' "$arg"; done
        printf '\x1e'
    } >> "$KC_CALLS"
}

is_service_enabled() {
    local svc
    for svc in "$@"; do
        [[ ",${ENABLED_SERVICES}," == *",${svc},"* ]] && return 0
    done
    return 1
}

echo_summary() { echo "SUMMARY: $*"; }

die() {
    local line=$1
    shift
    echo "[ERROR] ${BASH_SOURCE[1]}:${line} $*" >&2
    exit 1
}

# sudo runs the command itself, after checking that every absolute path it
# is given stays inside the test root.
sudo() {
    local arg
    for arg in "$@"; do
        if [[ "$arg" == /* && "$arg" != "$KC_ROOT"/* && "$arg" != /dev/null ]]; then
            echo "sudo stub: $arg is outside the test root $KC_ROOT" >&2
            exit 97
        fi
    done
    _kc_record sudo "$@"
    "$@"
}

run_process() { _kc_record run_process "$@"; }
stop_process() { _kc_record stop_process "$@"; }
pip_install() { _kc_record pip_install "$@"; }
install_package() { _kc_record install_package "$@"; }

# Like `pip install -e`: leaves the console script behind.
setup_develop() {
    _kc_record setup_develop "$@"
    mkdir -p "$KC_VENV_BIN"
    printf '#!/bin/sh\nexit 0\n' > "$KC_VENV_BIN/kuryr-cni-daemon"
    chmod 0755 "$KC_VENV_BIN/kuryr-cni-daemon"
}

get_python_exec_prefix() { echo "$KC_VENV_BIN"; }

iniset() {
    if [[ "$1" == "-sudo" ]]; then
        shift
    fi
    _kc_record iniset "$@"
    "$KC_PYTHON" "$KC_STUBS/iniset.py" "$@"
}
'''

# DevStack's iniset semantics: create the file and the section when missing,
# add the option right under the section header, or replace its value.
INISET = r'''
import re
import sys

path, section, option, value = sys.argv[1:5]
try:
    with open(path) as f:
        lines = f.read().splitlines()
except FileNotFoundError:
    lines = []
header = '[%s]' % section
line = '%s = %s' % (option, value)
try:
    start = [l.strip() for l in lines].index(header)
except ValueError:
    lines += ['', header, line]
else:
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith('[')),
               len(lines))
    for i in range(start + 1, end):
        if re.match(r'%s\s*=' % re.escape(option), lines[i]):
            lines[i] = line
            break
    else:
        lines.insert(start + 1, line)
with open(path, 'w') as f:
    f.write('\n'.join(lines) + '\n')
'''

RUNNER = r'''
set -o errexit -o pipefail -o nounset
source "$KC_STUBS/functions.sh"
source "$KC_SETTINGS"
source "$KC_PLUGIN" "$@"
'''


class ReadyServer:
    """GET /ready answers 503 ``fail_first`` times (forever if None), then 200."""

    def __init__(self):
        self.fail_first = 0
        self.paths = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server.paths.append(self.path)
                failing = (server.fail_first is None
                           or len(server.paths) <= server.fail_first)
                code = 503 if failing or self.path != '/ready' else 200
                self.send_response(code)
                self.send_header('Content-Length', '0')
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def ready_server():
    server = ReadyServer()
    yield server
    server.close()


class Stack:
    """One temporary DevStack host: its paths, and a way to run phases."""

    def __init__(self, tmp_path, health_port, shim):
        self.root = tmp_path / 'root'
        self.stubs = tmp_path / 'stubs'
        self.calls_file = tmp_path / 'calls'
        r = self.root
        self.home = r / 'opt/stack/kuryr-cni'
        self.venv_bin = r / 'opt/stack/data/venv/bin'
        self.cni_bin_dir = r / 'opt/cni/bin'
        self.cni_conf_dir = r / 'etc/cni/net.d'
        self.conf_dir = r / 'etc/kuryr-cni'
        self.conf = self.conf_dir / 'kuryr-cni.conf'
        self.state_dir = r / 'var/lib/kuryr-cni'
        self.run_dir = r / 'run/kuryr-cni'
        self.socket = self.run_dir / 'daemon.sock'
        self.kubeconfig = r / 'etc/kubernetes/admin.conf'

        (self.home / 'shim').mkdir(parents=True)
        (self.home / 'tools').mkdir()
        (self.home / 'tools/build-shim').write_text(BUILD_SHIM)
        (self.home / 'tools/build-shim').chmod(0o755)
        (r / 'tmp').mkdir()
        self.stubs.mkdir()
        (self.stubs / 'functions.sh').write_text(STUBS)
        (self.stubs / 'iniset.py').write_text(INISET)
        (self.stubs / 'run.sh').write_text(RUNNER)
        self.calls_file.write_text('')

        self.env = {
            'PATH': os.environ.get('PATH', '/usr/bin:/bin'),
            'HOME': str(r / 'tmp'),
            'TMPDIR': str(r / 'tmp'),
            'LANG': 'C.UTF-8',
            'KC_ROOT': str(r),
            'KC_STUBS': str(self.stubs),
            'KC_CALLS': str(self.calls_file),
            'KC_VENV_BIN': str(self.venv_bin),
            'KC_PYTHON': sys.executable,
            'KC_SHIM': shim,
            'KC_SETTINGS': str(SETTINGS),
            'KC_PLUGIN': str(PLUGIN),
            # What DevStack defines before plugins run.
            'DEST': str(r / 'opt/stack'),
            'DATA_DIR': str(r / 'opt/stack/data'),
            'STACK_USER': _current_user(),
            'ENABLE_DEBUG_LOG_LEVEL': 'True',
            'ENABLED_SERVICES': 'etcd3,k8s-master,kuryr-cni-daemon',
            # Every path of the plugin, inside the root.
            'CNI_BIN_DIR': str(self.cni_bin_dir),
            'CNI_CONF_DIR': str(self.cni_conf_dir),
            'KURYR_CNI_CONF_DIR': str(self.conf_dir),
            'KURYR_CNI_STATE_DIR': str(self.state_dir),
            'KURYR_CNI_RUN_DIR': str(self.run_dir),
            'KURYR_CNI_KUBECONFIG': str(self.kubeconfig),
            'KURYR_CNI_HEALTH_PORT': str(health_port),
            'KURYR_CNI_READY_TIMEOUT': '20',
        }

    def run(self, *args, env=None, check=True):
        """Source settings and plugin.sh with ``args`` in a fresh bash."""
        full_env = dict(self.env, **(env or {}))
        proc = subprocess.run(
            ['bash', str(self.stubs / 'run.sh'), *args], env=full_env,
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            pytest.fail('plugin.sh %s failed (rc=%d):\n%s\n%s' % (
                ' '.join(args), proc.returncode, proc.stdout, proc.stderr))
        return proc

    def run_code(self, code, env=None):
        """Source settings and plugin.sh (service disabled), then run ``code``."""
        script = self.stubs / 'snippet.sh'
        script.write_text(RUNNER.replace('source "$KC_PLUGIN" "$@"', 'source "$KC_PLUGIN"')
                          + code + '\n')
        full_env = dict(self.env, ENABLED_SERVICES='', **(env or {}))
        return subprocess.run(['bash', str(script)], env=full_env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=60)

    def calls(self, name=None):
        records = [r.split('\x1f') for r in self.calls_file.read_text().split('\x1e') if r]
        return [r[1:] for r in records if name is None or r[0] == name]

    def stack(self):
        for phase in ('install', 'post-config', 'extra'):
            self.run('stack', phase)

    def files(self):
        """Every file and symlink under the root, as relative paths."""
        return {p.relative_to(self.root) for p in self.root.rglob('*')
                if p.is_file() or p.is_symlink()}


def _current_user():
    import pwd
    return pwd.getpwuid(os.getuid()).pw_name


def _mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def _read_conf(path):
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(path.read_text())
    return parser


needs_curl = pytest.mark.skipif(shutil.which('curl') is None,
                                reason='curl is not installed (apt-get install curl)')


@pytest.fixture
def host(tmp_path, ready_server, shim_binary):
    return Stack(tmp_path, ready_server.port, shim_binary)


# --- the harness itself ------------------------------------------------------

def test_sudo_stub_refuses_paths_outside_the_root(host):
    proc = host.run_code('sudo touch /etc/kuryr-cni-test-escape')
    assert proc.returncode == 97, proc.stderr
    assert 'outside the test root' in proc.stderr
    assert not os.path.exists('/etc/kuryr-cni-test-escape')


def test_iniset_stub_adds_and_replaces(host):
    conf = host.root / 'x.conf'
    proc = host.run_code('iniset "$1" a k1 v1; iniset "$1" b k v; iniset "$1" a k1 v2; '
                         'iniset "$1" a k2 v3'.replace('"$1"', '"%s"' % conf))
    assert proc.returncode == 0, proc.stderr
    parser = _read_conf(conf)
    assert dict(parser['a']) == {'k1': 'v2', 'k2': 'v3'}
    assert dict(parser['b']) == {'k': 'v'}


# --- stack install -----------------------------------------------------------

def test_install_develops_the_package_then_builds_and_installs_the_shim(host, shim_binary):
    host.run('stack', 'install')

    assert host.calls('setup_develop') == [[str(host.home)]]
    assert host.calls('install_package') == [['golang-go']]
    assert host.calls('build-shim') == [[]]
    assert _tree(host.cni_bin_dir) == ['kuryr-cni']     # no temporary file left
    shim = host.cni_bin_dir / 'kuryr-cni'
    assert _mode(shim) == 0o755
    assert shim.read_bytes() == Path(shim_binary).read_bytes()
    _assert_answers_version(shim)


def test_install_replaces_an_existing_shim_in_place(host):
    host.cni_bin_dir.mkdir(parents=True)
    (host.cni_bin_dir / 'kuryr-cni').write_text('old')
    (host.cni_bin_dir / 'loopback').write_text('another plugin')

    host.run('stack', 'install')

    _assert_answers_version(host.cni_bin_dir / 'kuryr-cni')
    assert (host.cni_bin_dir / 'loopback').read_text() == 'another plugin'
    assert _tree(host.cni_bin_dir) == ['kuryr-cni', 'loopback']


def _tree(directory):
    return sorted(str(p.relative_to(directory)) for p in directory.rglob('*'))


def _assert_answers_version(shim):
    proc = subprocess.run([str(shim)], env={'CNI_COMMAND': 'VERSION'}, capture_output=True,
                          stdin=subprocess.DEVNULL, timeout=30)
    assert (proc.returncode, proc.stderr) == (0, b'')
    assert json.loads(proc.stdout)['cniVersion'] == '1.1.0'


def test_install_dies_when_the_shim_does_not_build(host):
    proc = host.run('stack', 'install', env={'KC_BUILD_FAILS': '1'}, check=False)
    assert proc.returncode != 0
    assert 'Cannot build the CNI shim' in proc.stderr
    assert not (host.cni_bin_dir / 'kuryr-cni').exists()


def test_the_plugin_builds_with_the_repository_build_script():
    assert os.access(REPO / 'tools' / 'build-shim', os.X_OK)


# --- stack post-config -------------------------------------------------------

def test_post_config_writes_the_daemon_config(host):
    host.run('stack', 'install')
    host.run('stack', 'post-config')

    assert _mode(host.conf) == 0o640
    conf = _read_conf(host.conf)
    assert conf['DEFAULT']['debug'] == 'True'
    assert dict(conf['cni_daemon']) == {
        'debug': 'True',   # configparser shows DEFAULT in every section
        'node_name': socket.gethostname().lower(),
        'socket': str(host.socket),
        'state_dir': str(host.state_dir),
        'worker_count': '4',
        'vif_timeout': '60',
        'vif_source': 'annotation',
    }
    assert conf['kubernetes']['kubeconfig'] == str(host.kubeconfig)
    for unset in ('api_root', 'token_file', 'ca_file'):
        assert unset not in conf['kubernetes']
    assert conf['binding']['ovsdb_connection'] == 'unix:/run/openvswitch/db.sock'
    assert 'link_iface' not in conf['binding']
    assert (conf['health']['host'], conf['health']['port']) == ('0.0.0.0', host.env[
        'KURYR_CNI_HEALTH_PORT'])
    assert (conf['prometheus']['host'], conf['prometheus']['port']) == ('0.0.0.0', '9655')

    assert host.state_dir.is_dir()
    assert _mode(host.state_dir) == 0o700


def test_post_config_options_are_the_daemons_own(host):
    """Every option written is one the daemon registers, and parses."""
    from kuryr_cni import conf as kuryr_conf
    host.run('stack', 'post-config')

    conf = kuryr_conf.load(['--config-file', str(host.conf)])
    known = {group: {opt.name for opt in opts} for group, opts in kuryr_conf.list_opts()}
    written = _read_conf(host.conf)
    for section in written.sections():
        for option in written.options(section):
            if option in written.defaults():
                continue
            assert option in known.get(section, ()), '[%s] %s is not a daemon option' % (
                section, option)
    assert conf.debug is True
    assert conf.cni_daemon.worker_count == 4
    assert conf.cni_daemon.vif_timeout == 60
    assert conf.cni_daemon.socket == str(host.socket)
    assert conf.kubernetes.kubeconfig == str(host.kubeconfig)
    assert conf.health.port == int(host.env['KURYR_CNI_HEALTH_PORT'])
    assert conf.prometheus.port == 9655


def test_post_config_with_api_root_token_and_ca(host):
    env = {'KURYR_CNI_KUBECONFIG': '', 'KURYR_CNI_K8S_API_ROOT': 'https://192.0.2.1:6443',
           'KURYR_CNI_K8S_TOKEN_FILE': '/etc/kuryr-cni/token',
           'KURYR_CNI_K8S_CA_FILE': '/etc/kubernetes/pki/ca.crt',
           'KURYR_CNI_LINK_IFACE': 'eth1', 'KURYR_CNI_VIF_SOURCE': 'kuryrport',
           'KURYR_CNI_NODE_NAME': 'node-7'}
    host.run('stack', 'post-config', env=env)

    conf = _read_conf(host.conf)
    assert dict(conf['kubernetes']) == {
        'debug': 'True', 'api_root': 'https://192.0.2.1:6443',
        'token_file': '/etc/kuryr-cni/token', 'ca_file': '/etc/kubernetes/pki/ca.crt'}
    assert conf['binding']['link_iface'] == 'eth1'
    assert conf['cni_daemon']['vif_source'] == 'kuryrport'
    assert conf['cni_daemon']['node_name'] == 'node-7'


def test_post_config_needs_a_way_to_the_api_server(host):
    proc = host.run('stack', 'post-config', env={'KURYR_CNI_KUBECONFIG': ''}, check=False)
    assert proc.returncode != 0
    assert 'KURYR_CNI_KUBECONFIG or KURYR_CNI_K8S_API_ROOT' in proc.stderr


def test_post_config_rewrites_the_config_from_scratch(host):
    host.conf_dir.mkdir(parents=True)
    host.conf.write_text('[cni_daemon]\nworker_count = 99\nstale_option = 1\n')
    host.run('stack', 'post-config')
    conf = _read_conf(host.conf)
    assert conf['cni_daemon']['worker_count'] == '4'
    assert 'stale_option' not in conf['cni_daemon']


def test_post_config_writes_the_conflist(host):
    host.run('stack', 'post-config')

    conflist = host.cni_conf_dir / '10-kuryr.conflist'
    data = json.loads(conflist.read_text())
    assert data == {
        'cniVersion': '1.1.0',
        'name': 'kuryr',
        'plugins': [{
            'type': 'kuryr-cni',
            'daemon_socket': str(host.socket),
            'timeout': 110,
            'state_dir': str(host.state_dir),
        }],
    }
    assert _mode(conflist) == 0o644
    # Written through a temporary name the runtime ignores, none left over.
    assert [p.name for p in host.cni_conf_dir.iterdir()] == ['10-kuryr.conflist']

    # The shim and the daemon must agree on the socket and the state dir.
    conf = _read_conf(host.conf)
    assert data['plugins'][0]['daemon_socket'] == conf['cni_daemon']['socket']
    assert data['plugins'][0]['state_dir'] == conf['cni_daemon']['state_dir']


def test_post_config_warns_about_configs_that_shadow_ours(host):
    host.cni_conf_dir.mkdir(parents=True)
    (host.cni_conf_dir / '05-flannel.conflist').write_text('{}')
    (host.cni_conf_dir / '99-loopback.conf').write_text('{}')
    proc = host.run('stack', 'post-config')
    assert '05-flannel.conflist sorts before' in proc.stderr
    assert '99-loopback.conf sorts before' not in proc.stderr


def test_post_config_rejects_a_bad_shim_timeout(host):
    proc = host.run('stack', 'post-config', env={'KURYR_CNI_SHIM_TIMEOUT': '1m'},
                    check=False)
    assert proc.returncode != 0
    assert 'KURYR_CNI_SHIM_TIMEOUT' in proc.stderr


# --- stack extra -------------------------------------------------------------

@needs_curl
def test_extra_starts_the_daemon_and_waits_for_ready(host, ready_server):
    ready_server.fail_first = 2
    host.run('stack', 'install')
    host.run('stack', 'post-config')
    host.run('stack', 'extra')

    assert host.calls('run_process') == [[
        'kuryr-cni-daemon',
        '%s/kuryr-cni-daemon --config-file %s' % (host.venv_bin, host.conf),
        'root', 'root',
    ]]
    # 503, 503, then 200: it polled until ready, and then stopped.
    assert ready_server.paths == ['/ready'] * 3
    assert host.run_dir.is_dir()
    assert _mode(host.run_dir) == 0o700


@needs_curl
def test_extra_fails_when_the_daemon_never_gets_ready(host, ready_server):
    ready_server.fail_first = None
    host.run('stack', 'install')
    started = time.monotonic()
    proc = host.run('stack', 'extra', env={'KURYR_CNI_READY_TIMEOUT': '2'}, check=False)
    elapsed = time.monotonic() - started

    assert proc.returncode != 0
    assert 'not ready after 2s' in proc.stderr
    assert elapsed < 15
    assert 2 <= len(ready_server.paths) <= 6


def test_extra_fails_without_the_daemon_binary(host):
    proc = host.run('stack', 'extra', check=False)
    assert proc.returncode != 0
    assert 'kuryr-cni-daemon is missing' in proc.stderr
    assert host.calls('run_process') == []


@pytest.mark.parametrize('bind, url_host', [
    ('0.0.0.0', '127.0.0.1'), ('', '127.0.0.1'), ('192.0.2.5', '192.0.2.5'),
    ('::', '[::1]'), ('2001:db8::5', '[2001:db8::5]'), ('[2001:db8::5]', '[2001:db8::5]'),
])
def test_ready_url_reaches_the_health_server_bind_address(host, bind, url_host):
    proc = host.run_code('kuryr_cni_ready_url', env={
        'KURYR_CNI_HEALTH_HOST': bind, 'KURYR_CNI_HEALTH_PORT': '8090'})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == 'http://%s:8090/ready' % url_host


# --- unstack and clean -------------------------------------------------------

def test_unstack_stops_the_daemon(host):
    host.run('unstack')
    assert host.calls('stop_process') == [['kuryr-cni-daemon']]
    assert host.calls('run_process') == []


@needs_curl
def test_clean_removes_what_stack_made_and_nothing_else(host):
    # What was on the host before DevStack: another plugin, another network
    # config, an operator's kubeconfig next to ours.
    host.cni_bin_dir.mkdir(parents=True)
    (host.cni_bin_dir / 'loopback').write_text('x')
    host.cni_conf_dir.mkdir(parents=True)
    (host.cni_conf_dir / '99-loopback.conf').write_text('{}')
    host.kubeconfig.parent.mkdir(parents=True)
    host.kubeconfig.write_text('apiVersion: v1\n')
    before = host.files()

    host.stack()
    # What the daemon leaves at run time.
    host.socket.touch()
    (host.state_dir / 'bindings').mkdir()
    (host.state_dir / 'bindings' / 'default_pod.json').write_text('{}')
    made = host.files() - before
    assert {Path('opt/cni/bin/kuryr-cni'), Path('etc/cni/net.d/10-kuryr.conflist'),
            Path('etc/kuryr-cni/kuryr-cni.conf')} <= made

    host.run('unstack')
    host.run('clean')

    # Only the console script of the (stubbed) pip install and the shim built
    # in the checkout stay.
    assert host.files() - before == {Path('opt/stack/data/venv/bin/kuryr-cni-daemon'),
                                     Path('opt/stack/kuryr-cni/shim/kuryr-cni')}
    assert before <= host.files()
    for gone in (host.conf_dir, host.state_dir, host.run_dir):
        assert not gone.exists(), gone
    assert host.cni_bin_dir.is_dir() and host.cni_conf_dir.is_dir()


def test_clean_keeps_a_config_dir_with_foreign_files(host):
    host.run('stack', 'post-config')
    (host.conf_dir / 'kubeconfig').write_text('mine')
    host.run('clean')
    assert not host.conf.exists()
    assert (host.conf_dir / 'kubeconfig').read_text() == 'mine'


def test_clean_refuses_to_remove_a_directory_that_is_not_ours(host):
    shared = host.root / 'var/lib'
    shared.mkdir(parents=True)
    (shared / 'dpkg').write_text('precious')
    proc = host.run('clean', env={'KURYR_CNI_STATE_DIR': str(shared)})
    assert (shared / 'dpkg').read_text() == 'precious'
    assert 'not removing %s' % shared in proc.stderr


def test_clean_is_a_noop_on_a_clean_host(host):
    before = host.files()
    host.run('clean')
    assert host.files() == before


@pytest.mark.parametrize('args', [('stack', 'install'), ('stack', 'post-config'),
                                  ('stack', 'extra'), ('unstack',), ('clean',)])
def test_every_phase_is_a_noop_when_the_service_is_disabled(host, ready_server, args):
    before = host.files()
    host.run(*args, env={'ENABLED_SERVICES': 'etcd3,k8s-master'})
    assert host.calls() == []
    assert host.files() == before
    assert ready_server.paths == []


# --- shellcheck --------------------------------------------------------------

@pytest.mark.parametrize('script', [PLUGIN, SETTINGS], ids=lambda p: p.name)
def test_shellcheck(script):
    shellcheck = shutil.which('shellcheck')
    if shellcheck is None:
        pytest.skip('shellcheck is not installed (apt-get install shellcheck)')
    proc = subprocess.run([shellcheck, '--shell=bash', '--severity=style', str(script)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_local_conf_sample_enables_the_plugin_and_the_service():
    sample = (REPO / 'devstack' / 'local.conf.sample').read_text().splitlines()
    assert any(line.startswith('enable_plugin kuryr-cni ') for line in sample)
    assert 'enable_service kuryr-cni-daemon' in sample
