"""The shim driven by the real libcni, and the emulator checked against it.

tests/functional/libcni_client.go is built here, offline, against the libcni
source Debian ships (packages golang-go and golang-github-appc-cni-dev; the
test skips, saying so, where either is missing). It runs ADD, CHECK and DEL
through ``CNIConfig.AddNetworkList/CheckNetworkList/DelNetworkList``, which
find our plugin by its type, export the CNI_* variables, inject prevResult
and keep the result cache, as containerd and CRI-O do.

A recording wrapper stands in front of the shim, so each case also proves
that tools.testbed.runtime sends byte-for-byte what libcni sends (stdin
JSON and CNI_* variables, prevResult included) and caches what libcni
caches.
"""

import json
import os
import shutil
import subprocess

import pytest
import yaml

from tools.testbed import host as testhost

from tests.functional import cni_world
from tests.functional import conftest

GOPATH = '/usr/share/gocode'
LIBCNI = os.path.join(GOPATH, 'src/github.com/containernetworking/cni')
CLIENT_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'libcni_client.go')
GO = shutil.which('go')

pytestmark = [
    pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON),
    pytest.mark.skipif(GO is None, reason='no Go toolchain (Debian package golang-go)'),
    pytest.mark.skipif(not os.path.isdir(os.path.join(LIBCNI, 'libcni')),
                       reason='no libcni source (Debian package golang-github-appc-cni-dev)'),
]


def libcni_versions():
    """The spec versions this libcni can read results of (1.1.0 only from libcni 1.2)."""
    versions = ['0.3.0', '0.3.1', '0.4.0', '1.0.0']
    try:
        with open(os.path.join(LIBCNI, 'pkg/types/100/types.go')) as f:
            if '"1.1.0"' in f.read():
                versions.append('1.1.0')
    except OSError:
        pass
    return versions


@pytest.fixture(scope='module')
def client(tmp_path_factory):
    """The libcni client, built offline from Debian's source (GOPATH mode, no proxy)."""
    build = tmp_path_factory.mktemp('libcni-client')
    env = dict(os.environ, GO111MODULE='off', GOPATH=GOPATH, GOFLAGS='', GOPROXY='off',
               GOCACHE=str(build / 'cache'), HOME=str(build), CGO_ENABLED='0')
    binary = str(build / 'libcni_client')
    proc = subprocess.run([GO, 'build', '-o', binary, CLIENT_SOURCE], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, 'building the libcni client failed:\n' + proc.stderr
    return binary


@pytest.fixture(scope='module')
def world(tmp_path_factory):
    yield from cni_world.start(tmp_path_factory)


@pytest.fixture(autouse=True)
def clean(world, tmp_path):
    # tmp_path first, so that it outlives the clean-up DELs: a test's runtime may run
    # its plugin from there (the recorder), and a passing test's tmp_path is removed.
    yield
    world.clean()


@pytest.fixture
def recorder(tmp_path, shim_binary):
    """A plugin named kuryr-cni that records its stdin and CNI_* variables, then runs the shim."""
    bin_dir = tmp_path / 'bin'
    records = tmp_path / 'records'
    bin_dir.mkdir()
    records.mkdir()
    wrapper = bin_dir / 'kuryr-cni'
    wrapper.write_text(
        '#!/bin/sh\n'
        'record="%s/$(date +%%s%%N)"\n'
        'cat > "$record.stdin"\n'
        'env | grep "^CNI_" | sort > "$record.env"\n'
        'exec "%s" < "$record.stdin"\n' % (records, shim_binary))
    wrapper.chmod(0o755)
    return str(bin_dir), str(records)


def recorded(records):
    """``[(command, stdin as JSON, {CNI_*: value})]`` in call order, and forget them."""
    calls = []
    for name in sorted(n for n in os.listdir(records) if n.endswith('.stdin')):
        base = os.path.join(records, name[:-len('.stdin')])
        with open(base + '.stdin') as f:
            stdin = json.load(f)
        with open(base + '.env') as f:
            env = dict(line.rstrip('\n').split('=', 1) for line in f if '=' in line)
        env.pop('CNI_PATH')         # where each looks for plugins: not part of the contract
        calls.append((env['CNI_COMMAND'], stdin, env))
        os.unlink(base + '.stdin')
        os.unlink(base + '.env')
    return calls


def run(client, command, conflist, bin_dir, cache_dir, sandbox):
    proc = subprocess.run([client, command, conflist, bin_dir, cache_dir, sandbox.container_id,
                           sandbox.netns, sandbox.ifname, sandbox.cni_args()],
                          capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def cache_entry(cache_dir, sandbox):
    path = os.path.join(cache_dir, 'results', 'kuryr-%s-%s' % (sandbox.container_id,
                                                               sandbox.ifname))
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


@pytest.mark.parametrize('version', libcni_versions())
def test_libcni_add_check_del(world, client, recorder, tmp_path, version):
    bin_dir, records = recorder
    runtime = world.runtime(version)
    runtime.shim = os.path.join(bin_dir, 'kuryr-cni')
    conflist = tmp_path / 'kuryr.conflist'
    conflist.write_bytes(runtime.conflist)      # the very bytes the emulator caches
    cache = str(tmp_path / 'libcni-cache')
    sandbox, index = world.pod(runtime)

    added = run(client, 'add', str(conflist), bin_dir, cache, sandbox)
    assert 'error' not in added, added
    assert [ip['address'] for ip in added['result']['ips']] == [cni_world.address(index)]
    assert added['result']['interfaces'][0]['mac'] == cni_world.mac(index)
    assert world.host.ping(sandbox.netns, testhost.GATEWAY)
    libcni_cache = cache_entry(cache, sandbox)
    assert libcni_cache['kind'] == 'cniCacheV1'

    checked = run(client, 'check', str(conflist), bin_dir, cache, sandbox)
    if version >= '0.4.0':
        assert checked == {}, checked
        testhost.ip('-n', os.path.basename(sandbox.netns), 'link', 'set', 'eth0', 'address',
                    'fa:16:3e:99:99:99')
        failed = run(client, 'check', str(conflist), bin_dir, cache, sandbox)
        assert failed['code'] == 100, failed
        testhost.ip('-n', os.path.basename(sandbox.netns), 'link', 'set', 'eth0', 'address',
                    cni_world.mac(index))
        assert run(client, 'check', str(conflist), bin_dir, cache, sandbox) == {}
    else:      # libcni refuses CHECK below 0.4.0 without running the plugin
        assert checked['code'] == 0 and 'does not support the CHECK' in checked['error']

    assert run(client, 'del', str(conflist), bin_dir, cache, sandbox) == {}
    assert cache_entry(cache, sandbox) is None
    assert 'eth0' not in world.host.links(sandbox.netns)
    assert run(client, 'del', str(conflist), bin_dir, cache, sandbox) == {}   # repeated
    by_libcni = recorded(records)

    # The emulator, the same operations on the same sandbox: the same calls and cache.
    assert runtime.add(sandbox).ok
    emulated = cache_entry(runtime.cache_dir, sandbox)
    if 'netns' not in libcni_cache:     # libcni caches it from 1.2 on, for its GC
        assert emulated.pop('netns') == sandbox.netns
    assert emulated == libcni_cache
    if version >= '0.4.0':
        for _ in range(3):          # as many as above, with the same prevResult
            assert runtime.check(sandbox).ok
    assert runtime.delete(sandbox).ok and runtime.delete(sandbox).ok
    assert recorded(records) == by_libcni


# The shipped network configuration, as installed ------------------------------------------

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def shipped_conflist(where):
    """The conflist text an operator installs: the file, or the DaemonSet's ConfigMap entry."""
    if where == 'etc/cni':
        with open(os.path.join(REPO, 'etc/cni/10-kuryr.conflist')) as f:
            return f.read()
    with open(os.path.join(REPO, 'etc/kubernetes/kuryr-cni-daemonset.yaml')) as f:
        [config_map] = [d for d in yaml.safe_load_all(f) if d and d['kind'] == 'ConfigMap']
    return config_map['data']['10-kuryr.conflist']


def installed(text, world, tmp_path, version=None):
    """Write ``text`` as installed on the test node: only its socket and state paths differ."""
    conf = json.loads(text)
    [plugin] = conf['plugins']
    plugin.update(daemon_socket=world.host.socket, state_dir=world.host.state_dir)
    if version:
        conf['cniVersion'] = version
    path = tmp_path / 'installed.conflist'
    path.write_text(json.dumps(conf))
    return str(path)


@pytest.fixture
def plugin_dir(tmp_path, shim_binary):
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    (bin_dir / 'kuryr-cni').symlink_to(shim_binary)
    return str(bin_dir)


@pytest.mark.parametrize('where', ['etc/cni', 'daemonset'])
def test_the_shipped_conflist_runs_on_this_libcni(world, client, plugin_dir, tmp_path, where):
    shipped = shipped_conflist(where)
    # cniVersion for libcni before 1.2 (which ignores the list); the newest of cniVersions
    # (GC, STATUS) for the libcni that reads it and 1.1.0 results.
    assert json.loads(shipped)['cniVersion'] == '1.0.0'
    assert json.loads(shipped)['cniVersions'] == ['1.0.0', '1.1.0']
    conflist = installed(shipped, world, tmp_path)
    cache = str(tmp_path / 'libcni-cache')
    sandbox, index = world.pod(world.runtime('1.0.0'))
    added = run(client, 'add', conflist, plugin_dir, cache, sandbox)
    assert 'error' not in added, added
    assert added['result']['cniVersion'] == ('1.1.0' if '1.1.0' in libcni_versions()
                                             else '1.0.0')
    assert [ip['address'] for ip in added['result']['ips']] == [cni_world.address(index)]
    assert world.host.ping(sandbox.netns, testhost.GATEWAY)
    assert run(client, 'check', conflist, plugin_dir, cache, sandbox) == {}
    assert run(client, 'del', conflist, plugin_dir, cache, sandbox) == {}
    assert 'eth0' not in world.host.links(sandbox.netns)


def test_a_conflist_asking_for_a_result_this_libcni_cannot_read_fails(
        world, client, plugin_dir, tmp_path):
    """What the shipped conflist avoids: libcni 1.1.x cannot parse a 1.1.0 result."""
    if '1.1.0' in libcni_versions():
        pytest.skip('this libcni reads 1.1.0 results')
    conflist = installed(shipped_conflist('etc/cni'), world, tmp_path, version='1.1.0')
    cache = str(tmp_path / 'libcni-cache')
    sandbox, _ = world.pod(world.runtime('1.0.0'))
    added = run(client, 'add', conflist, plugin_dir, cache, sandbox)
    assert 'unsupported CNI result version "1.1.0"' in added.get('error', ''), added
    assert run(client, 'del', conflist, plugin_dir, cache, sandbox) == {}
