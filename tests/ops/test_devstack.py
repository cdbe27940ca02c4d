"""devstack/plugin.sh, run phase by phase under bash with DevStack stubbed.

Every phase runs in a fresh ``bash`` the way DevStack runs it (``settings``
then ``plugin.sh <mode> <phase>`` sourced, with ``errexit``), against a
temporary root: every path variable of the plugin points into ``tmp_path``,
and the ``sudo`` stub refuses any absolute path outside it, so a path the
plugin forgot to take from its settings fails the test instead of touching
the machine. DevStack's functions are replaced by small stubs that record
their calls; ``iniset`` is a real (tiny) INI writer so the daemon's config
file can be read back, and checked against the daemon's own options.

The commands of the smoke test (``kubectl``, ``crictl``, ``ip``) and the
virtualenv's ``pip`` are stand-ins on PATH that record their calls and
answer as the test says. The readiness wait and the smoke test's metrics
read talk to a real HTTP server on 127.0.0.1 through the real ``curl``.

Every variable the plugin reads from another project is checked against a
list of where that project defines it.
"""

import collections
import configparser
import http.server
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import yaml

from tests.ops import shellcheck

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

# kuryr-kubernetes' plugin's functions, defined when it ran before ours.
if [[ -z "${KC_NO_KURYR_PLUGIN:-}" ]]; then
    create_kuryr_account() { _kc_record create_kuryr_account "$@"; }
    configure_kuryr() { _kc_record configure_kuryr "$@"; }
fi
stop_process() { _kc_record stop_process "$@"; }
install_package() { _kc_record install_package "$@"; }

# DevStack's: the value of the variable named $2 as True or False, $1 if unset.
trueorfalse() {
    local default=$1 value=${!2:-}
    case "${value,,}" in
        1|yes|true|on) echo True ;;
        0|no|false|off) echo False ;;
        '') echo "$default" ;;
        *) die $LINENO "$2=$value is no boolean" ;;
    esac
}

iniset() {
    if [[ "$1" == "-sudo" ]]; then
        shift
    fi
    _kc_record iniset "$@"
    "$KC_PYTHON" "$KC_STUBS/iniset.py" "$@"
}
'''

# Commands on PATH. Each records its call like the functions above.
COMMANDS = {
    # `python3 -m venv DIR` makes a stand-in venv; any other use is Python's.
    'python3': r'''#!/bin/bash
if [[ "$1" == "-m" && "$2" == "venv" ]]; then
    source "$KC_STUBS/functions.sh"
    _kc_record python3 "$@"
    mkdir -p "$3/bin"
    cp "$KC_STUBS/pip" "$3/bin/pip"
    exit 0
fi
exec "$KC_PYTHON" "$@"
''',
    'kubectl': r'''#!/bin/bash
source "$KC_STUBS/functions.sh"
_kc_record kubectl "$@"
case "$1" in
    apply) cat > "$KC_APPLIED" ;;
    wait) [[ " $KC_NOT_READY " != *" ${3} "* ]] || exit 1 ;;
    get) echo "$KC_UID" ;;
    delete)
        [[ -n "${KC_DEVICE_STAYS:-}" ]] || echo '[]' > "$KC_LINKS"
        [[ -n "${KC_PORT_STAYS:-}" ]] || : > "$KC_PORT_STATUS"
        ;;
esac
''',
    # Neutron's answer: the status of the pod's port, until kubectl deleted the pod.
    'openstack': r'''#!/bin/bash
source "$KC_STUBS/functions.sh"
_kc_record openstack "$@"
cat "$KC_PORT_STATUS"
''',
    'crictl': r'''#!/bin/bash
source "$KC_STUBS/functions.sh"
_kc_record crictl "$@"
echo "$KC_SANDBOX"
''',
    'ip': r'''#!/bin/bash
source "$KC_STUBS/functions.sh"
_kc_record ip "$@"
if [[ "$*" == "-j link show" ]]; then
    cat "$KC_LINKS"
fi
''',
}

# The virtualenv's pip: records, and leaves the console script behind.
PIP = r'''#!/bin/bash
source "$KC_STUBS/functions.sh"
_kc_record pip "$@"
printf '#!/bin/sh\nexit 0\n' > "$(dirname "$0")/kuryr-cni-daemon"
chmod 0755 "$(dirname "$0")/kuryr-cni-daemon"
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
    """GET /ready answers 503 ``fail_first`` times (forever if None), then 200.

    GET /metrics answers ``metrics``, the daemon's text format.
    """

    def __init__(self):
        self.fail_first = 0
        self.paths = []
        self.metrics = ''
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == '/metrics':
                    return self._answer(200, server.metrics.encode())
                server.paths.append(self.path)
                failing = (server.fail_first is None
                           or len(server.paths) <= server.fail_first)
                self._answer(503 if failing or self.path != '/ready' else 200, b'')

            def _answer(self, code, body):
                self.send_response(code)
                self.send_header('Content-Length', str(len(body)))
                self.end_headers()
                self.wfile.write(body)

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

    def __init__(self, tmp_path, server_port, shim):
        self.root = tmp_path / 'root'
        self.stubs = tmp_path / 'stubs'
        self.calls_file = tmp_path / 'calls'
        self.applied = tmp_path / 'applied.yaml'      # what kubectl apply read
        self.links = tmp_path / 'links.json'          # what ip -j link show prints
        self.port_status = tmp_path / 'port-status'   # what openstack port list prints
        r = self.root
        self.home = r / 'opt/stack/kuryr-cni'
        self.venv = r / 'opt/stack/data/venv-kuryr-cni'
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
        (self.stubs / 'bin').mkdir(parents=True)
        (self.stubs / 'functions.sh').write_text(STUBS)
        (self.stubs / 'iniset.py').write_text(INISET)
        (self.stubs / 'run.sh').write_text(RUNNER)
        (self.stubs / 'pip').write_text(PIP)
        (self.stubs / 'pip').chmod(0o755)
        for name, text in COMMANDS.items():
            (self.stubs / 'bin' / name).write_text(text)
            (self.stubs / 'bin' / name).chmod(0o755)
        self.calls_file.write_text('')
        self.links.write_text('[]')

        self.env = {
            'PATH': '%s:%s' % (self.stubs / 'bin', os.environ.get('PATH', '/usr/bin:/bin')),
            'HOME': str(r / 'tmp'),
            'TMPDIR': str(r / 'tmp'),
            'LANG': 'C.UTF-8',
            'KC_ROOT': str(r),
            'KC_STUBS': str(self.stubs),
            'KC_CALLS': str(self.calls_file),
            'KC_APPLIED': str(self.applied),
            'KC_LINKS': str(self.links),
            'KC_PORT_STATUS': str(self.port_status),
            'KC_PYTHON': sys.executable,
            'KC_SHIM': shim,
            'KC_SETTINGS': str(SETTINGS),
            'KC_PLUGIN': str(PLUGIN),
            # What DevStack defines before plugins run.
            'DEST': str(r / 'opt/stack'),
            'DATA_DIR': str(r / 'opt/stack/data'),
            'STACK_USER': _current_user(),
            'ENABLE_DEBUG_LOG_LEVEL': 'True',
            'ENABLED_SERVICES': 'etcd3,container,k8s-master,kuryr-cni-daemon',
            # What devstack-plugin-container's kubeadm needs (see local.conf.sample).
            'CONTAINER_ENGINE': 'crio',
            'K8S_TOKEN': '9a08jv.c0izixklcxtmnze7',
            # Every path of the plugin, inside the root; devstack-plugin-container's
            # CNI_PLUGIN_DIR and CNI_CONF_DIR name the runtime's directories.
            'CNI_PLUGIN_DIR': str(self.cni_bin_dir),
            'CNI_CONF_DIR': str(self.cni_conf_dir),
            'KURYR_CNI_CONF_DIR': str(self.conf_dir),
            'KURYR_CNI_STATE_DIR': str(self.state_dir),
            'KURYR_CNI_RUN_DIR': str(self.run_dir),
            'KURYR_CNI_KUBECONFIG': str(self.kubeconfig),
            'KURYR_CNI_HEALTH_PORT': str(server_port),
            'KURYR_CNI_PROMETHEUS_PORT': str(server_port),
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

    def run_code(self, code, env=None, base=None):
        """Source settings and plugin.sh (service disabled), then run ``code``.

        ``base`` replaces the host's environment, ``env`` is added to it.
        """
        script = self.stubs / 'snippet.sh'
        script.write_text(RUNNER.replace('source "$KC_PLUGIN" "$@"', 'source "$KC_PLUGIN"')
                          + code + '\n')
        full_env = dict(self.env if base is None else base, ENABLED_SERVICES='')
        full_env.update(env or {})
        return subprocess.run(['bash', str(script)], env=full_env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=60)

    def calls(self, name=None):
        records = [r.split('\x1f') for r in self.calls_file.read_text().split('\x1e') if r]
        return [r[1:] for r in records if name is None or r[0] == name]

    def stack(self):
        for phase in ('install', 'post-config', 'extra', 'test-config'):
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

def test_install_makes_the_venv_installs_the_package_then_builds_the_shim(host, shim_binary):
    host.run('stack', 'install')

    # Its own virtualenv, its own pip: OpenStack's upper-constraints stay out.
    assert host.calls('python3') == [['-m', 'venv', str(host.venv)]]
    assert host.calls('pip') == [['install', '--upgrade', '-e', str(host.home)]]
    assert host.calls('pip_install') == host.calls('setup_develop') == []
    assert host.calls('install_package') == [['golang-go']]
    assert host.calls('build-shim') == [[]]
    assert _tree(host.cni_bin_dir) == ['kuryr-cni']     # no temporary file left
    shim = host.cni_bin_dir / 'kuryr-cni'
    assert _mode(shim) == 0o755
    assert shim.read_bytes() == Path(shim_binary).read_bytes()
    _assert_answers_version(shim)


def test_install_reuses_an_existing_venv(host):
    host.run('stack', 'install')
    host.run('stack', 'install')
    assert len(host.calls('python3')) == 1
    assert len(host.calls('pip')) == 2


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


@pytest.mark.parametrize('env, words', [
    ({'CONTAINER_ENGINE': 'docker'}, 'CONTAINER_ENGINE=docker'),
    ({'CONTAINER_ENGINE': ''}, 'needs CONTAINER_ENGINE=crio'),
    ({'K8S_TOKEN': ''}, 'K8S_TOKEN must be a kubeadm bootstrap token'),
    ({'K8S_TOKEN': 'abcdef.0123456789ABCDEF'}, 'K8S_TOKEN must be'),
    ({'K8S_TOKEN': 'abcdef-0123456789abcdef'}, 'K8S_TOKEN must be'),
])
def test_install_refuses_what_devstack_plugin_containers_kubeadm_refuses(host, env, words):
    proc = host.run('stack', 'install', env=env, check=False)
    assert proc.returncode != 0
    assert words in proc.stderr
    assert host.calls('pip') == []


@pytest.mark.parametrize('services', ['etcd3,container,k8s-node,kuryr-cni-daemon',
                                      'etcd3,container,k8s-master,kuryr-cni-daemon'])
def test_kubernetes_settings_are_checked_on_every_kubeadm_node(host, services):
    proc = host.run('stack', 'install', env={'ENABLED_SERVICES': services,
                                             'CONTAINER_ENGINE': 'docker'}, check=False)
    assert 'CONTAINER_ENGINE=docker' in proc.stderr


def test_kubernetes_settings_are_not_checked_without_kubeadm(host):
    # Kubernetes installed some other way: nothing of devstack-plugin-container applies.
    host.run('stack', 'install', env={'ENABLED_SERVICES': 'kuryr-cni-daemon',
                                      'CONTAINER_ENGINE': '', 'K8S_TOKEN': ''})
    assert host.calls('pip')


# --- what the plugin reads from other projects -----------------------------------

# Every variable the plugin and its settings read without defining it: where
# it is defined (read from the projects' own sources).
FOREIGN = {
    'DEST': 'devstack: stackrc',
    'DATA_DIR': 'devstack: stackrc',
    'STACK_USER': 'devstack: stackrc',
    'ENABLE_DEBUG_LOG_LEVEL': 'devstack: stackrc',
    'CNI_PLUGIN_DIR': 'devstack-plugin-container: devstack/settings',
    'CNI_CONF_DIR': 'devstack-plugin-container: devstack/settings',
    'CONTAINER_ENGINE': 'devstack-plugin-container: devstack/settings',
    'K8S_TOKEN': 'devstack-plugin-container: devstack/lib/k8s',
    'KURYR_CONFIG': 'kuryr-kubernetes: devstack/settings',
}
BASH = {'LINENO', 'SECONDS', 'BASH_SOURCE', 'LC_ALL'}


def _variables_read(text):
    """Names of the variables a shell text expands."""
    text = '\n'.join(line for line in text.splitlines() if not line.lstrip().startswith('#'))
    # Not the Python and JSON programs fed to python3 on stdin or as arguments.
    text = re.sub(r"<<'EOF'.*?\nEOF\n", '', text, flags=re.S)
    text = re.sub(r"python3 -c '.*?'", '', text, flags=re.S)
    return set(re.findall(r'\$\{?!?([A-Za-z_][A-Za-z0-9_]*)', text))


def _locals(text):
    """Names declared ``local`` (``local a b=$1 c=$2``)."""
    declared = set()
    for line in re.findall(r'^\s*local\s+(.*)$', text, re.M):
        declared |= set(re.findall(r'(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)(?==|\s|$)', line))
    return declared


def _foreign(text):
    """Variables read that are neither ours (KURYR_CNI_*), nor local, nor bash's."""
    return {name for name in _variables_read(text) - _locals(text) - BASH
            if not name.startswith(('KURYR_CNI_', '_XTRACE_KURYR_CNI'))}


def test_the_plugin_reads_only_variables_whose_origin_is_known():
    text = PLUGIN.read_text() + '\n' + SETTINGS.read_text()
    read = _foreign(text)
    unknown = read - set(FOREIGN)
    assert not unknown, 'read from where? %s' % sorted(unknown)
    assert set(FOREIGN) <= read, 'no longer read: %s' % sorted(set(FOREIGN) - read)


def test_the_origin_check_catches_a_misnamed_variable():
    # The name devstack-plugin-container gives CNI_PLUGIN_DIR, as settings once had it.
    text = 'CNI_BIN_DIR=${CNI_BIN_DIR:-/opt/cni/bin}\nf() {\n    local x=$1\n    echo "$x"\n}\n'
    assert _foreign(text) == {'CNI_BIN_DIR'}


def test_no_variable_of_another_project_is_assigned():
    text = PLUGIN.read_text() + '\n' + SETTINGS.read_text()
    assigned = set(re.findall(r'^\s*([A-Za-z_][A-Za-z0-9_]*)=', text, re.M))
    assert not set(FOREIGN) & assigned


@pytest.mark.parametrize('env, plugin_dir, network_dir', [
    ({}, '/opt/cni/bin', '/etc/cni/net.d'),
    ({'CNI_PLUGIN_DIR': '', 'CNI_CONF_DIR': ''}, '/opt/cni/bin', '/etc/cni/net.d'),
    ({'CNI_PLUGIN_DIR': '/usr/libexec/cni', 'CNI_CONF_DIR': '/etc/crio/net.d'},
     '/usr/libexec/cni', '/etc/crio/net.d'),
    # A variable of that name exists nowhere in devstack-plugin-container.
    ({'CNI_BIN_DIR': '/elsewhere'}, '/opt/cni/bin', '/etc/cni/net.d'),
])
def test_cni_directories_follow_devstack_plugin_container(host, env, plugin_dir, network_dir):
    base = {k: v for k, v in host.env.items() if k not in ('CNI_PLUGIN_DIR', 'CNI_CONF_DIR')}
    proc = host.run_code('echo "$KURYR_CNI_PLUGIN_DIR $KURYR_CNI_NETWORK_DIR"',
                         env=env, base=base)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [plugin_dir, network_dir]


@pytest.mark.parametrize('services, kubeconfig', [
    ('etcd3,k8s-master', '/etc/kubernetes/admin.conf'),
    # kubeadm join leaves no admin.conf, but the kubelet's kubeconfig.
    ('k8s-node', '/etc/kubernetes/kubelet.conf'),
])
def test_the_kubeconfig_is_one_that_exists_on_the_node(host, services, kubeconfig):
    base = {k: v for k, v in host.env.items() if k != 'KURYR_CNI_KUBECONFIG'}
    proc = host.run_code('echo "$KURYR_CNI_KUBECONFIG"', base=base,
                         env={'ENABLED_SERVICES': services})
    assert proc.stdout.strip() == kubeconfig, proc.stderr


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
        'vif_source': 'kuryrport',
    }
    assert conf['kubernetes']['kubeconfig'] == str(host.kubeconfig)
    for unset in ('api_root', 'token_file', 'ca_file'):
        assert unset not in conf['kubernetes']
    assert conf['binding']['ovsdb_connection'] == 'unix:/run/openvswitch/db.sock'
    assert conf['binding']['bridges'] == 'kuryr-br0,br-int,qbr*'
    assert 'link_iface' not in conf['binding']
    assert (conf['health']['host'], conf['health']['port']) == ('::', host.env[
        'KURYR_CNI_HEALTH_PORT'])
    assert (conf['prometheus']['host'], conf['prometheus']['port']) == ('::', host.env[
        'KURYR_CNI_PROMETHEUS_PORT'])

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
    assert conf.prometheus.port == int(host.env['KURYR_CNI_PROMETHEUS_PORT'])


def test_post_config_with_api_root_token_and_ca(host):
    env = {'KURYR_CNI_KUBECONFIG': '', 'KURYR_CNI_K8S_API_ROOT': 'https://192.0.2.1:6443',
           'KURYR_CNI_K8S_TOKEN_FILE': '/etc/kuryr-cni/token',
           'KURYR_CNI_K8S_CA_FILE': '/etc/kubernetes/pki/ca.crt',
           'KURYR_CNI_LINK_IFACE': 'eth1', 'KURYR_CNI_VIF_SOURCE': 'annotation',
           'KURYR_CNI_NODE_NAME': 'node-7'}
    host.run('stack', 'post-config', env=env)

    conf = _read_conf(host.conf)
    assert dict(conf['kubernetes']) == {
        'debug': 'True', 'api_root': 'https://192.0.2.1:6443',
        'token_file': '/etc/kuryr-cni/token', 'ca_file': '/etc/kubernetes/pki/ca.crt'}
    assert conf['binding']['link_iface'] == 'eth1'
    assert conf['cni_daemon']['vif_source'] == 'annotation'
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

    conflist = host.cni_conf_dir / '00-kuryr.conflist'
    data = json.loads(conflist.read_text())
    assert data == {
        'cniVersion': '1.0.0',
        'cniVersions': ['1.0.0', '1.1.0'],
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
    assert [p.name for p in host.cni_conf_dir.iterdir()] == ['00-kuryr.conflist']

    # The shim and the daemon must agree on the socket and the state dir.
    conf = _read_conf(host.conf)
    assert data['plugins'][0]['daemon_socket'] == conf['cni_daemon']['socket']
    assert data['plugins'][0]['state_dir'] == conf['cni_daemon']['state_dir']
    # ... and the shim may use them: they are in the allow file beside it.
    allow = host.cni_bin_dir / 'kuryr-cni-paths.json'
    assert json.loads(allow.read_text()) == {'daemon_socket': [str(host.socket)],
                                             'state_dir': [str(host.state_dir)]}
    assert _mode(allow) == 0o644


@pytest.mark.parametrize('others', [
    # flannel's, CRI-O's and podman's bridges, devstack-plugin-container's.
    ['10-flannel.conflist', '10-crio-bridge.conflist', '11-crio-ipv4-bridge.conflist',
     '87-podman-bridge.conflist', '10-bridge.conf', '99-loopback.conf'],
    # Not configurations: runtimes ignore them.
    ['.00-hidden.conflist.tmp', '00-a.conflist.disabled', '00-README'],
])
def test_post_config_puts_ours_first_among_what_runtimes_read(host, others):
    host.cni_conf_dir.mkdir(parents=True)
    for name in others:
        (host.cni_conf_dir / name).write_text('{}')
    host.run('stack', 'post-config')
    proc = host.run_code('kuryr_cni_first_conflist')
    assert proc.stdout.strip() == '00-kuryr.conflist'


@pytest.mark.parametrize('first', ['00-cilium.conflist', '00-aaa.conf', '0-x.json'])
def test_post_config_fails_when_another_config_sorts_first(host, first):
    host.cni_conf_dir.mkdir(parents=True)
    (host.cni_conf_dir / first).write_text('{}')
    proc = host.run('stack', 'post-config', check=False)
    assert proc.returncode != 0
    assert '%s sorts before 00-kuryr.conflist' % first in proc.stderr
    assert 'KURYR_CNI_CONFLIST_NAME' in proc.stderr


def test_post_config_takes_the_conflist_name_from_its_setting(host):
    host.cni_conf_dir.mkdir(parents=True)
    (host.cni_conf_dir / '00-multus.conf').write_text('{}')
    host.run('stack', 'post-config', env={'KURYR_CNI_CONFLIST_NAME': '0-kuryr.conflist'})
    assert (host.cni_conf_dir / '0-kuryr.conflist').is_file()


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
        '%s/bin/kuryr-cni-daemon --config-file %s' % (host.venv, host.conf),
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
    ('::', '127.0.0.1'), ('[::]', '127.0.0.1'), ('2001:db8::5', '[2001:db8::5]'),
    ('[2001:db8::5]', '[2001:db8::5]'),
])
def test_ready_url_reaches_the_health_server_bind_address(host, bind, url_host):
    proc = host.run_code('kuryr_cni_ready_url', env={
        'KURYR_CNI_HEALTH_HOST': bind, 'KURYR_CNI_HEALTH_PORT': '8090'})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == 'http://%s:8090/ready' % url_host


# --- stack test-config: the smoke test ---------------------------------------

SANDBOX = 'a3' * 32                      # what crictl answers: a sandbox ID
METRICS = """# HELP kuryr_cni_requests_total CNI requests handled, by command and result.
# TYPE kuryr_cni_requests_total counter
kuryr_cni_requests_total{command="ADD",result="error"} 4.0
kuryr_cni_requests_total{command="ADD",result="success"} %s
kuryr_cni_requests_total{command="DEL",result="success"} 7.0
"""


def _link(ifname, alias=None):
    link = {'ifindex': 7, 'ifname': ifname, 'flags': ['UP'], 'mtu': 1500}
    if alias is not None:
        link['ifalias'] = alias
    return link


UID = '0d1c2b3a-4e5f-4a6b-8c7d-9e0f1a2b3c4d'       # what kubectl get answers


@pytest.fixture
def plumbed(host, ready_server):
    """A node where the pod came up on an ACTIVE port, its host device tagged, one ADD
    counted."""
    ready_server.metrics = METRICS % '1.0'
    host.links.write_text(json.dumps([
        _link('lo'), _link('br-int'),
        _link('kc0123456789abc', 'kuryr-cni:%s:eth0' % SANDBOX),
        _link('kc1111111111111', 'kuryr-cni:%s:eth0' % ('b4' * 32))]))
    host.port_status.write_text('ACTIVE\n')
    host.cni_conf_dir.mkdir(parents=True)
    (host.cni_conf_dir / '00-kuryr.conflist').write_text('{}')
    (host.cni_conf_dir / '10-kuryr.conflist').write_text('{}')   # kuryr-kubernetes'
    host.env.update(KURYR_CNI_SMOKE_TEST='True', KC_SANDBOX=SANDBOX, KC_NOT_READY='',
                    KC_UID=UID, KURYR_CNI_NODE_NAME='node-1',
                    ENABLED_SERVICES='etcd3,container,kubernetes-master,kuryr-kubernetes,'
                                     'kuryr-cni-daemon')
    return host


@needs_curl
def test_smoke_test_starts_a_pod_proves_it_plumbed_and_deletes_it(plumbed):
    host = plumbed
    proc = host.run('stack', 'test-config')
    assert ('kuryr-cni plumbed pod kuryr-cni-smoke: sandbox %s, port ACTIVE, '
            '1 successful ADDs' % SANDBOX) in proc.stdout

    kubectl = host.calls('kubectl')
    assert [call[:2] for call in kubectl] == [
        ['wait', '--for=condition=Ready'], ['apply', '-f'],
        ['wait', '--for=condition=Ready'], ['get', 'pod'], ['delete', 'pod']]
    assert kubectl[0][2] == 'node/node-1' and kubectl[2][2] == 'pod/kuryr-cni-smoke'
    assert all(any(a.startswith('--timeout=300s') for a in call) for call in kubectl
               if call[0] not in ('apply', 'get'))
    [crictl] = host.calls('crictl')
    assert crictl[:2] == ['--runtime-endpoint', 'unix:///var/run/crio/crio.sock']
    assert '^kuryr-cni-smoke$' in crictl and '--quiet' in crictl
    # Neutron asked for the pod's port: ACTIVE while it ran, none once it was deleted.
    openstack = host.calls('openstack')
    assert len(openstack) == 2
    assert all(call[:4] == ['--os-cloud', 'devstack-admin', 'port', 'list'] and
               call[call.index('--device-id') + 1] == UID for call in openstack)
    assert host.calls('ip') == [['-j', 'link', 'show'], ['-j', 'link', 'show']]


def test_smoke_pod_is_an_ordinary_pod_on_this_node(plumbed):
    proc = plumbed.run_code('kuryr_cni_smoke_pod kuryr-cni-smoke',
                            env={'KURYR_CNI_NODE_NAME': 'node-1'})
    pod = yaml.safe_load(proc.stdout)
    assert (pod['kind'], pod['metadata']['name']) == ('Pod', 'kuryr-cni-smoke')
    assert pod['spec']['nodeName'] == 'node-1'
    # Its VIF is kuryr-controller's to make: the pod names none.
    assert 'annotations' not in pod['metadata']
    assert pod['spec']['containers'][0]['image'] == 'registry.k8s.io/pause:3.10'


@needs_curl
@pytest.mark.parametrize('breakage, words', [
    ({'KC_NOT_READY': 'node/node-1'}, 'Node node-1 not Ready after 300s'),
    ({'KC_NOT_READY': 'pod/kuryr-cni-smoke'}, 'Pod kuryr-cni-smoke not Ready after 300s'),
    ({'KC_SANDBOX': ''}, 'Expected the one ready sandbox of pod kuryr-cni-smoke'),
    ({'KC_SANDBOX': SANDBOX + '\n' + 'b4' * 32}, 'Expected the one ready sandbox'),
    # Plumbed by another plugin: no device carries this sandbox's owner tag.
    ({'KC_SANDBOX': 'c5' * 32}, 'No host device carries the owner tag kuryr-cni:%s:eth0'
     % ('c5' * 32)),
    ({'KC_DEVICE_STAYS': '1'}, 'The host device of sandbox %s outlived' % SANDBOX),
    ({'KC_PORT_STAYS': '1', 'KURYR_CNI_SMOKE_TIMEOUT': '2'},
     'The Neutron port of pod kuryr-cni-smoke outlived it by 2s'),
])
def test_smoke_test_fails_on_every_missing_proof(plumbed, breakage, words):
    proc = plumbed.run('stack', 'test-config', env=breakage, check=False)
    assert proc.returncode != 0
    assert words in proc.stderr, proc.stderr


@needs_curl
@pytest.mark.parametrize('status', ['DOWN', 'BUILD', ''])
def test_smoke_test_fails_unless_neutron_says_the_port_is_active(plumbed, status):
    plumbed.port_status.write_text(status + '\n' if status else '')
    proc = plumbed.run('stack', 'test-config', check=False)
    assert proc.returncode != 0
    assert 'The Neutron port of pod kuryr-cni-smoke (device %s) is %s, not ACTIVE' % (
        UID, status or 'missing') in proc.stderr


@needs_curl
@pytest.mark.parametrize('value', ['0.0', None])
def test_smoke_test_fails_when_the_metrics_counted_no_add(plumbed, ready_server, value):
    ready_server.metrics = METRICS % value if value else '# nothing\n'
    proc = plumbed.run('stack', 'test-config', check=False)
    assert proc.returncode != 0
    assert 'counts no successful ADD' in proc.stderr


@pytest.mark.parametrize('env, words', [
    ({'KURYR_CNI_VIF_SOURCE': 'annotation'}, 'set KURYR_CNI_VIF_SOURCE=kuryrport'),
    ({'ENABLED_SERVICES': 'etcd3,container,kubernetes-master,kuryr-cni-daemon'},
     'enable_service kuryr-kubernetes'),
])
def test_smoke_test_needs_kuryr_controller_and_its_kuryrports(plumbed, env, words):
    proc = plumbed.run('stack', 'test-config', env=env, check=False)
    assert proc.returncode != 0
    assert words in proc.stderr
    assert plumbed.calls('kubectl') == []


def test_smoke_test_fails_when_another_config_comes_first(plumbed):
    (plumbed.cni_conf_dir / '00-aaa.conflist').write_text('{}')
    proc = plumbed.run('stack', 'test-config', check=False)
    assert proc.returncode != 0
    assert '00-aaa.conflist sorts before 00-kuryr.conflist' in proc.stderr
    assert plumbed.calls('kubectl') == []


@pytest.mark.parametrize('env', [
    {'KURYR_CNI_SMOKE_TEST': ''},                          # off by default
    {'KURYR_CNI_SMOKE_TEST': 'False'},
    # Subnodes: the pod is started once, from the node that has kubectl's admin access.
    {'ENABLED_SERVICES': 'container,k8s-node,kuryr-cni-daemon'},
    {'ENABLED_SERVICES': 'container,kubernetes-worker,kuryr-kubernetes,kuryr-cni-daemon'},
])
def test_smoke_test_runs_only_when_asked_on_the_master(plumbed, env):
    plumbed.run('stack', 'test-config', env=env)
    assert plumbed.calls() == []


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
    assert {Path('opt/cni/bin/kuryr-cni'), Path('etc/cni/net.d/00-kuryr.conflist'),
            Path('etc/kuryr-cni/kuryr-cni.conf'),
            Path('opt/stack/data/venv-kuryr-cni/bin/kuryr-cni-daemon')} <= made

    host.run('unstack')
    host.run('clean')

    # Only the shim built in the checkout stays.
    assert host.files() - before == {Path('opt/stack/kuryr-cni/shim/kuryr-cni')}
    assert before <= host.files()
    for gone in (host.conf_dir, host.state_dir, host.run_dir, host.venv):
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
                                  ('stack', 'extra'), ('stack', 'test-config'), ('unstack',),
                                  ('clean',)])
def test_every_phase_is_a_noop_when_the_service_is_disabled(host, ready_server, args):
    before = host.files()
    host.run(*args, env={'ENABLED_SERVICES': 'etcd3,k8s-master'})
    assert host.calls() == []
    assert host.files() == before
    assert ready_server.paths == []


# --- shellcheck --------------------------------------------------------------

@pytest.mark.parametrize('script', [PLUGIN, SETTINGS], ids=lambda p: p.name)
def test_shellcheck(script):
    shellcheck.assert_clean(script, '--shell=bash', '--severity=style')


def _localrc(text):
    """KEY=VALUE settings of a local.conf's [[local|localrc]] section."""
    section = text.split('[[local|localrc]]', 1)[1].split('\n[[', 1)[0]
    return dict(re.findall(r'^([A-Z][A-Z0-9_]*)=(\S*)$', section, re.M))


def _zuul_localrc():
    return {key: str(value) for key, value in _zuul_job()['vars']['devstack_localrc'].items()}


def _sample_services():
    """The services local.conf.sample enables, and those it disables."""
    text = (REPO / 'devstack' / 'local.conf.sample').read_text()
    enabled, disabled = set(), set()
    for verb, names in re.findall(r'^(enable|disable)_service (.+)$', text, re.M):
        (enabled if verb == 'enable' else disabled).update(names.split())
    return enabled, disabled


def _zuul_job():
    with open(REPO / '.zuul.yaml') as f:
        [job] = [item['job'] for item in yaml.safe_load(f)
                 if 'job' in item and item['job']['name'] == 'kuryr-cni-devstack']
    return job


def _zuul_services():
    services = _zuul_job()['vars']['devstack_services']
    return ({name for name, on in services.items() if on},
            {name for name, on in services.items() if not on})


def _settings_of(where):
    return (_localrc((REPO / 'devstack' / 'local.conf.sample').read_text())
            if where == 'local.conf.sample' else _zuul_localrc())


def _services_of(where):
    return _sample_services() if where == 'local.conf.sample' else _zuul_services()


def _tier_conf(name):
    """A configuration file tools/openstack writes (``kuryr/kuryr.conf``,
    ``neutron/plugins/ml2/ml2_conf.ini``), read from the tool as shipped, its
    variables given their defaults (``start`` without ``--nested``, the gate's)."""
    text = (REPO / 'tools' / 'openstack').read_text()
    body = re.search(r'cat >"\$etc/%s" <<EOF\n(.*?)\nEOF\n' % re.escape(name), text, re.S)
    assert body, 'tools/openstack writes no %s' % name
    start = re.search(r'^start\(\) \{\n(.*?)^    while ', text, re.S | re.M).group(1)
    defaults = dict(re.findall(r'\b([A-Z_]+)=([^\s\'"$]+)', start))
    conf = re.sub(r'\$([A-Z_]+)', lambda m: defaults.get(m.group(1), m.group(0)),
                  body.group(1))
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(conf)
    return parser


# The gate topology: the services the job and the sample enable, as the offline
# tiers run them (tools/openstack: Neutron ML2/OVN, kube-apiserver,
# kuryr-controller; tools/node: kubelet on a container runtime), and the one
# they must not: kuryr-kubernetes' own CNI daemon.
TOPOLOGY_SERVICES = {'key', 'mysql', 'q-svc', 'ovn-controller', 'ovn-northd', 'ovs-vswitchd',
                     'ovsdb-server', 'etcd3', 'container', 'kubernetes-master',
                     'kuryr-kubernetes', 'kuryr-cni-daemon'}

# What the job and the sample set, and where the tier sets the same: (variable,
# tier file, section, option). kuryr-controller's drivers decide the VIFs the
# daemon gets (a port per pod, VIFOpenVSwitch on br-int with ML2/OVN).
TOPOLOGY_SETTINGS = [
    ('Q_ML2_PLUGIN_MECHANISM_DRIVERS', 'neutron/plugins/ml2/ml2_conf.ini', 'ml2',
     'mechanism_drivers'),
    ('Q_ML2_TENANT_NETWORK_TYPE', 'neutron/plugins/ml2/ml2_conf.ini', 'ml2',
     'tenant_network_types'),
    ('KURYR_ENABLED_HANDLERS', 'kuryr/kuryr.conf', 'kubernetes', 'enabled_handlers'),
    ('KURYR_POD_VIF_DRIVER', 'kuryr/kuryr.conf', 'kubernetes', 'pod_vif_driver'),
    ('KURYR_VIF_POOL_DRIVER', 'kuryr/kuryr.conf', 'kubernetes', 'vif_pool_driver'),
    ('KURYR_SUBNET_DRIVER', 'kuryr/kuryr.conf', 'kubernetes', 'pod_subnets_driver'),
    ('KURYR_SG_DRIVER', 'kuryr/kuryr.conf', 'kubernetes', 'pod_security_groups_driver'),
    ('KURYR_PROJECT_DRIVER', 'kuryr/kuryr.conf', 'kubernetes', 'pod_project_driver'),
]


@pytest.mark.parametrize('where', ['local.conf.sample', '.zuul.yaml'])
def test_the_sample_and_the_job_run_the_tiers_topology(where):
    enabled, disabled = _services_of(where)
    assert TOPOLOGY_SERVICES <= enabled, sorted(TOPOLOGY_SERVICES - enabled)
    assert 'kuryr-daemon' in disabled and 'kuryr-daemon' not in enabled
    # devstack-plugin-container's own kubeadm would be a second Kubernetes.
    assert 'k8s-master' not in enabled
    settings = _settings_of(where)
    for variable, name, section, option in TOPOLOGY_SETTINGS:
        assert settings.get(variable) == _tier_conf(name)[section][option], variable
    assert settings['KURYR_K8S_CONTAINERIZED_DEPLOYMENT'].lower() == 'false'
    assert settings.get('KURYR_CNI_VIF_SOURCE', 'kuryrport') == 'kuryrport'


@pytest.mark.parametrize('where', ['local.conf.sample', '.zuul.yaml'])
def test_kuryr_kubernetes_plugin_comes_before_ours(where):
    # Phase by phase, plugins run in this order: ours replaces its kuryr-cni executable.
    if where == '.zuul.yaml':
        plugins = list(_zuul_job()['vars']['devstack_plugins'])
    else:
        plugins = re.findall(r'^enable_plugin (\S+) ',
                             (REPO / 'devstack' / 'local.conf.sample').read_text(), re.M)
    assert plugins.index('kuryr-kubernetes') < plugins.index('kuryr-cni')


def test_the_job_writes_the_daemon_config_the_tiers_run(host):
    """What post-config writes with the job's settings is the configuration the gate tier
    runs the daemon on (the DaemonSet's), and names the source the openstack tier's has."""
    from tests.node import kubenode
    from tests.openstack import stack as osstack
    settings = _zuul_localrc()
    for default in ('KURYR_CNI_HEALTH_PORT', 'KURYR_CNI_PROMETHEUS_PORT',
                    'KURYR_CNI_KUBECONFIG'):
        del host.env[default]
    enabled, _ = _zuul_services()
    host.run('stack', 'post-config', env=dict(settings,
                                              ENABLED_SERVICES=','.join(sorted(enabled))))
    written = _read_conf(host.conf)
    shipped = configparser.ConfigParser(interpolation=None)
    shipped.read_string(kubenode.shipped_config()['kuryr-cni.conf'])
    for section in shipped.sections():
        for option in set(shipped.options(section)) - set(shipped.defaults()):
            assert written[section][option].replace(str(host.root), '') == \
                shipped[section][option], (section, option)
    tier = configparser.ConfigParser(interpolation=None)
    tier.read_string(osstack.Stack.daemon_config(
        types.SimpleNamespace(node='node1', env=collections.defaultdict(str)), 60))
    assert written['cni_daemon']['vif_source'] == tier['cni_daemon']['vif_source']
    # The API server and credentials: kuryr-controller's, from its kuryr.conf.
    assert not written.has_option('kubernetes', 'kubeconfig')
    assert host.calls('configure_kuryr') == [[]]
    # The conflist is the one the gate tier's node installs.
    rendered = (host.cni_conf_dir / '00-kuryr.conflist').read_text()
    assert json.loads(rendered.replace(str(host.root), '')) == json.loads(
        (REPO / 'etc' / 'cni' / '10-kuryr.conflist').read_text())


def test_the_consistency_check_sees_a_job_that_leaves_ovn(monkeypatch):
    job = _zuul_job()
    job['vars']['devstack_localrc']['Q_ML2_PLUGIN_MECHANISM_DRIVERS'] = 'openvswitch'
    monkeypatch.setattr(sys.modules[__name__], '_zuul_job', lambda: job)
    with pytest.raises(AssertionError, match='Q_ML2_PLUGIN_MECHANISM_DRIVERS'):
        test_the_sample_and_the_job_run_the_tiers_topology('.zuul.yaml')


@pytest.mark.parametrize('where', ['local.conf.sample', '.zuul.yaml'])
def test_the_sample_and_the_job_set_what_kubeadm_needs(host, where):
    settings = _settings_of(where)
    base = {k: v for k, v in host.env.items() if k not in ('CONTAINER_ENGINE', 'K8S_TOKEN')}
    proc = host.run_code('check_kuryr_cni_kubernetes_settings', base=base,
                         env=dict(settings, ENABLED_SERVICES='container,kubernetes-master'))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize('services', ['container,k8s-master', 'container,kubernetes-master'])
def test_the_check_refuses_what_kubeadm_cannot_run_on(host, services):
    base = {k: v for k, v in host.env.items() if k not in ('CONTAINER_ENGINE', 'K8S_TOKEN')}
    proc = host.run_code('check_kuryr_cni_kubernetes_settings', base=base,
                         env={'ENABLED_SERVICES': services})
    assert proc.returncode != 0 and 'CONTAINER_ENGINE' in proc.stderr


def test_the_job_runs_the_smoke_test():
    assert _zuul_localrc()['KURYR_CNI_SMOKE_TEST'] in ('True', 'true')


# --- beside kuryr-kubernetes' plugin -------------------------------------------------

KURYR_SERVICES = 'etcd3,container,kubernetes-master,kuryr-kubernetes,kuryr-cni-daemon'


def test_install_refuses_kuryr_daemon_beside_ours(host):
    proc = host.run('stack', 'install', env={'ENABLED_SERVICES': KURYR_SERVICES
                                             + ',kuryr-daemon'}, check=False)
    assert proc.returncode != 0
    assert 'disable_service kuryr-daemon' in proc.stderr
    assert host.calls('pip') == []


def test_post_config_has_kuryr_controllers_config_written(host):
    host.run('stack', 'post-config', env={'ENABLED_SERVICES': KURYR_SERVICES})
    assert host.calls('create_kuryr_account') == [[]]
    assert host.calls('configure_kuryr') == [[]]


def test_post_config_needs_kuryr_kubernetes_plugin_first(host):
    proc = host.run('stack', 'post-config', env={'ENABLED_SERVICES': KURYR_SERVICES,
                                                 'KC_NO_KURYR_PLUGIN': '1'}, check=False)
    assert proc.returncode != 0
    assert 'put its enable_plugin line first' in proc.stderr


@needs_curl
def test_extra_runs_the_daemon_on_kuryr_controllers_config_then_its_own(host):
    env = {'ENABLED_SERVICES': KURYR_SERVICES, 'KURYR_CONFIG': '/etc/kuryr/kuryr.conf'}
    host.run('stack', 'install', env=env)
    host.run('stack', 'post-config', env=env)
    host.run('stack', 'extra', env=env)
    [[name, command, *_]] = host.calls('run_process')
    assert command == '%s/bin/kuryr-cni-daemon --config-file /etc/kuryr/kuryr.conf ' \
        '--config-file %s' % (host.venv, host.conf)


def test_extra_refuses_kuryr_kubernetes_executable_in_place_of_our_shim(host):
    host.run('stack', 'install')
    (host.cni_bin_dir / 'kuryr-cni').write_text('kuryr-kubernetes\' kuryr-cni')
    proc = host.run('stack', 'extra', check=False)
    assert proc.returncode != 0
    assert 'is not kuryr-cni\'s shim' in proc.stderr
    assert host.calls('run_process') == []
