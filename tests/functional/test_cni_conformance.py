"""The CNI contract, every spec version and command, through the real shim and daemon.

A libcni-like runtime (:mod:`tools.testbed.runtime`) drives the shim for
each of the spec versions 0.3.0, 0.3.1, 0.4.0, 1.0.0 and 1.1.0, in real
network namespaces: results have exactly the shape of the requested version,
CHECK follows what the kernel holds, DEL is forgiving where a retry could not
help, GC and STATUS behave as 1.1.0 says, and commands a version lacks are
refused with code 1. One daemon serves the module; every test's leftovers are
removed and checked after it (tests/functional/cni_world.py).
"""

import base64
import concurrent.futures
import json
import os
import subprocess
import time

import pytest

from kuryr_cni import netns
from kuryr_cni.binding import owner_tag
from tools.testbed import host as testhost
from tools.testbed import runtime as testruntime

from tests.functional import cni_world
from tests.functional import conftest
from tests.functional import helpers

pytestmark = pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON)

VERSIONS = ['0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0']
WITH_CHECK = [v for v in VERSIONS if v >= '0.4.0']
GATEWAY = testhost.GATEWAY
DAEMON_NOT_READY = 'kuryr-cni daemon not ready to add pods'


@pytest.fixture(scope='module')
def world(tmp_path_factory):
    if not conftest.CAN_RUN:
        pytest.skip(conftest.SKIP_REASON)
    yield from cni_world.start(tmp_path_factory)


@pytest.fixture(autouse=True)
def clean(request):
    if 'world' not in request.fixturenames:
        yield
        return
    world = request.getfixturevalue('world')
    yield
    world.clean()


def expected_result(version, sandbox, index):
    """The exact ADD result of a one-address bridge VIF in ``version``'s shape."""
    interface = {'name': sandbox.ifname, 'mac': cni_world.mac(index), 'sandbox': sandbox.netns}
    if version >= '1.1.0':
        interface['mtu'] = 1450
    ip = {'address': cni_world.address(index), 'gateway': GATEWAY, 'interface': 0}
    if version < '1.0.0':
        ip['version'] = '4'
    return {'cniVersion': version, 'interfaces': [interface], 'ips': [ip],
            'routes': [{'dst': '0.0.0.0/0', 'gw': GATEWAY}], 'dns': {}}


def ip(sandbox, *args):
    testhost.ip('-n', os.path.basename(sandbox.netns), *args)


def assert_refused(outcome, code, version):
    assert outcome.code != 0, outcome
    assert set(outcome.output) == {'cniVersion', 'code', 'msg', 'details'}, outcome
    assert outcome.output['code'] == code, outcome
    assert outcome.output['cniVersion'] == version, outcome


def assert_silent_success(outcome):
    """Success with nothing on stdout: what DEL, CHECK, GC and STATUS print."""
    assert outcome.ok, outcome
    assert outcome.stdout == b'', outcome


def assert_attached(world, sandbox, index):
    links = world.host.links(sandbox.netns)
    assert links[sandbox.ifname].get('address') == cni_world.mac(index)
    assert world.host.addresses(sandbox.netns, sandbox.ifname) == {cni_world.address(index)}
    assert owner_tag.host_ifname(sandbox.container_id, sandbox.ifname) in world.host.links()


def assert_detached(world, sandbox, pod_key):
    assert owner_tag.host_ifname(sandbox.container_id, sandbox.ifname) not in world.host.links()
    assert helpers.binding(world.host, pod_key) is None
    if netns.exists(sandbox.netns):
        assert sandbox.ifname not in world.host.links(sandbox.netns)


def rewrite_cached_result(runtime, sandbox, change):
    """Edit the runtime's cached ADD result in place (what CHECK gets as prevResult)."""
    path = runtime._cache_path(sandbox.container_id, sandbox.ifname)
    with open(path) as f:
        entry = json.load(f)
    change(entry['result'])
    with open(path, 'w') as f:
        json.dump(entry, f)


# VERSION -------------------------------------------------------------------------


@pytest.mark.parametrize('version', VERSIONS)
def test_version_lists_every_version_without_the_daemon(world, version):
    runtime = world.runtime(version)
    expected = {'cniVersion': version, 'supportedVersions': VERSIONS}
    assert runtime.version(version).output == expected
    # Runtimes ask before every operation, even when the daemon is down.
    config = {'cniVersion': version, 'name': 'kuryr', 'type': 'kuryr-cni',
              'daemon_socket': '/nonexistent/daemon.sock'}
    outcome = runtime.execute('VERSION', None, config=config)
    assert outcome.ok and outcome.output == expected, outcome


# ADD, CHECK, DEL -------------------------------------------------------------------


@pytest.mark.parametrize('version', VERSIONS)
def test_add_check_del(world, version):
    runtime = world.runtime(version)
    sandbox, index = world.pod(runtime)

    outcome = runtime.add(sandbox)
    assert outcome.ok, outcome
    assert outcome.output == expected_result(version, sandbox, index)
    assert_attached(world, sandbox, index)
    assert world.host.ping(sandbox.netns, GATEWAY)
    (entry,) = runtime.cached()
    assert (entry['kind'], entry['containerId'], entry['ifName'], entry['networkName'],
            entry['netns']) == ('cniCacheV1', sandbox.container_id, 'eth0', 'kuryr',
                                sandbox.netns)
    assert json.loads(base64.b64decode(entry['config']))['cniVersion'] == version

    if version in WITH_CHECK:
        assert_silent_success(runtime.check(sandbox))
    else:
        with pytest.raises(testruntime.NotSupported):
            runtime.check(sandbox)      # libcni itself refuses; the plugin must too:
        assert_refused(runtime.execute('CHECK', sandbox, prev_result=outcome.output),
                       1, version)

    outcome = runtime.delete(sandbox)
    assert_silent_success(outcome)
    assert runtime.cached() == []
    assert_detached(world, sandbox, 'default/' + sandbox.pod_name)
    assert_silent_success(runtime.delete(sandbox))           # repeated


@pytest.mark.parametrize('version', WITH_CHECK)
def test_check_follows_the_kernel(world, version):
    runtime = world.runtime(version)
    sandbox, index = world.pod(runtime)
    assert runtime.add(sandbox).ok
    assert_silent_success(runtime.check(sandbox))

    ip(sandbox, 'link', 'set', 'eth0', 'address', 'fa:16:3e:99:99:99')
    failed = runtime.check(sandbox)
    assert_refused(failed, 100, version)
    assert 'fa:16:3e:99:99:99' in failed.output['details']
    ip(sandbox, 'link', 'set', 'eth0', 'address', cni_world.mac(index))
    assert_silent_success(runtime.check(sandbox))

    ip(sandbox, 'addr', 'del', cni_world.address(index), 'dev', 'eth0')
    ip(sandbox, 'addr', 'add', '10.10.0.251/24', 'dev', 'eth0')
    failed = runtime.check(sandbox)
    assert_refused(failed, 100, version)
    assert cni_world.address(index) in failed.output['details']


@pytest.mark.parametrize('version', WITH_CHECK)
def test_check_judges_the_kernel_against_prev_result(world, version):
    """The kernel matches the VIF; prevResult disagreeing with it fails CHECK."""
    runtime = world.runtime(version)
    sandbox, index = world.pod(runtime)
    assert runtime.add(sandbox).ok

    def other_mac(result):
        result['interfaces'][0]['mac'] = 'fa:16:3e:12:34:56'

    def other_address(result):
        result['ips'][0]['address'] = '10.10.0.252/24'

    def other_route(result):
        result['routes'].append({'dst': '192.168.7.0/24', 'gw': GATEWAY})

    def no_interface(result):
        result['interfaces'][0]['sandbox'] = '/run/netns/elsewhere'

    for change, words in ((other_mac, 'prevResult says fa:16:3e:12:34:56'),
                          (other_address, 'lacks address 10.10.0.252/24'),
                          (other_route, 'route 192.168.7.0/24 via 10.10.0.1'),
                          (no_interface, 'prevResult lists no interface eth0')):
        original = runtime._cache_read(sandbox)
        rewrite_cached_result(runtime, sandbox, change)
        failed = runtime.check(sandbox)
        assert_refused(failed, 100, version)
        assert words in failed.output['details'], failed
        rewrite_cached_result(runtime, sandbox, lambda r: r.update(original))
        assert_silent_success(runtime.check(sandbox))

    # A chained plugin's own entries in prevResult are not ours to judge.
    rewrite_cached_result(runtime, sandbox, lambda r: r['interfaces'].append(
        {'name': 'tap0', 'mac': '00:11:22:33:44:55'}))
    assert_silent_success(runtime.check(sandbox))
    # Without prevResult there is nothing to check against.
    assert_refused(runtime.execute('CHECK', sandbox), 7, version)


@pytest.mark.parametrize('version', WITH_CHECK)
def test_check_of_an_unknown_or_replaced_container(world, version):
    runtime = world.runtime(version)
    a, index = world.pod(runtime)
    prev = expected_result(version, a, index)
    assert_refused(runtime.execute('CHECK', a, prev_result=prev), 3, version)   # no ADD yet
    assert runtime.add(a).ok
    b = testruntime.Sandbox('cid-%d-b' % index, world.host.pod_netns(), a.pod_name,
                            pod_uid=a.pod_uid)
    world.made.append((runtime, b))
    assert runtime.add(b).ok                                  # B replaces A
    assert_refused(runtime.check(a), 3, version)              # A's record is gone
    assert_silent_success(runtime.check(b))


@pytest.mark.parametrize('version', VERSIONS)
def test_add_refuses_an_interface_name_taken_in_the_netns(world, version):
    runtime = world.runtime(version)
    sandbox, _ = world.pod(runtime)
    ip(sandbox, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'foreign0')
    before = world.snapshot()

    outcome = runtime.add(sandbox)
    assert_refused(outcome, 4, version)
    assert 'already exists' in outcome.output['msg']
    assert world.snapshot() == before           # no owner recorded, nothing plugged
    assert runtime.cached() == []
    # The runtime's DEL after a failed ADD leaves the foreign eth0 alone.
    assert_silent_success(runtime.delete(sandbox))
    assert {'eth0', 'foreign0'} <= set(world.host.links(sandbox.netns))


@pytest.mark.parametrize('version', VERSIONS)
def test_add_appends_to_prev_result(world, version):
    """Chained after another plugin, ADD keeps its result and indexes after it."""
    runtime = world.runtime(version)
    sandbox, index = world.pod(runtime)
    earlier = expected_result(version, sandbox, index)
    earlier['interfaces'] = [{'name': 'tap9', 'mac': '00:11:22:33:44:55'}]
    earlier['ips'] = [dict(earlier['ips'][0], address='192.168.9.9/24', gateway='192.168.9.1')]
    earlier['routes'] = []
    earlier['dns'] = {'nameservers': ['192.168.9.53']}
    outcome = runtime.execute('ADD', sandbox, prev_result=earlier)
    assert outcome.ok, outcome
    mine = expected_result(version, sandbox, index)
    assert outcome.output['interfaces'] == earlier['interfaces'] + mine['interfaces']
    assert outcome.output['ips'] == earlier['ips'] + [dict(mine['ips'][0], interface=1)]
    assert outcome.output['routes'] == mine['routes']
    assert outcome.output['dns'] == earlier['dns']


@pytest.mark.parametrize('version', VERSIONS)
def test_del_is_forgiving(world, version):
    runtime = world.runtime(version)
    gone, _ = world.pod(runtime)
    bare, _ = world.pod(runtime)
    assert runtime.add(gone).ok
    assert runtime.add(bare).ok

    world.host.remove_netns(gone.netns)                    # the netns went first
    assert_silent_success(runtime.delete(gone))
    assert_detached(world, gone, 'default/' + gone.pod_name)
    assert_silent_success(runtime.delete(gone, netns=''))  # the second DEL, without netns

    # Without prevResult (what 0.3.x sends anyway) and with an empty CNI_NETNS.
    assert_silent_success(runtime.execute('DEL', bare, netns=''))
    assert_detached(world, bare, 'default/' + bare.pod_name)

    # The runtime unmounted the netns and left its file behind: no namespace any more.
    unmounted, _ = world.pod(runtime)
    assert runtime.add(unmounted).ok
    subprocess.run(['umount', unmounted.netns], check=True, timeout=30)
    assert os.path.isfile(unmounted.netns)
    assert_silent_success(runtime.delete(unmounted))
    assert_detached(world, unmounted, 'default/' + unmounted.pod_name)

    unknown = testruntime.Sandbox('cid-never-added', world.host.pod_netns(), 'pod-never')
    assert_silent_success(runtime.execute('DEL', unknown))
    for _ in range(2):                                      # repeated
        assert_silent_success(runtime.execute('DEL', bare))
    assert helpers.leftovers(world.host) == helpers.NOTHING


# GC ----------------------------------------------------------------------------------


def _gc_config(runtime, key, valid):
    config = dict(runtime.netconf)
    if key is not None:
        config[key] = [{'containerID': s.container_id, 'ifname': s.ifname} for s in valid]
    return config


def test_gc_runs_the_libcni_sequence(world):
    runtime = world.runtime('1.1.0')
    keep, keep_index = world.pod(runtime)
    drop, _ = world.pod(runtime)
    assert runtime.add(keep).ok and runtime.add(drop).ok

    outcome = runtime.gc([keep])
    assert_silent_success(outcome)
    assert [(cid, ifname, o.ok) for cid, ifname, o in outcome.stale_dels] == [
        (drop.container_id, 'eth0', True)]
    assert [e['containerId'] for e in runtime.cached()] == [keep.container_id]
    assert_detached(world, drop, 'default/' + drop.pod_name)
    assert_attached(world, keep, keep_index)
    assert_silent_success(runtime.check(keep))


@pytest.mark.parametrize('key', ['cni.dev/valid-attachments', 'cni.dev/attachments'])
def test_gc_with_an_empty_list_collects_the_whole_network(world, key):
    runtime = world.runtime('1.1.0')
    other = world.runtime('1.1.0', network='other-net')
    first, _ = world.pod(runtime)
    second, _ = world.pod(runtime)
    elsewhere, elsewhere_index = world.pod(other)
    for sandbox, rt in ((first, runtime), (second, runtime), (elsewhere, other)):
        assert rt.add(sandbox).ok

    # Sent directly: the daemon must collect what the runtime's cache no longer knows.
    assert_silent_success(runtime.execute('GC', None, config=_gc_config(runtime, key, [])))
    for sandbox in (first, second):
        assert_detached(world, sandbox, 'default/' + sandbox.pod_name)
    assert_attached(world, elsewhere, elsewhere_index)         # another network's
    assert_silent_success(other.check(elsewhere))


def test_gc_without_the_key_collects_nothing(world):
    runtime = world.runtime('1.1.0')
    sandbox, index = world.pod(runtime)
    assert runtime.add(sandbox).ok
    before = world.snapshot()
    assert_silent_success(runtime.execute('GC', None, config=_gc_config(runtime, None, [])))
    assert world.snapshot() == before
    assert_attached(world, sandbox, index)


def test_gc_spares_an_add_in_flight(world):
    runtime = world.runtime('1.1.0')
    sandbox, index = world.pod(runtime, active=False)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        adding = helpers.add_in_background(pool, world.host, runtime, sandbox)
        assert_silent_success(runtime.execute(
            'GC', None, config=_gc_config(runtime, 'cni.dev/valid-attachments', [])))
        assert not adding.done()
        world.activate(sandbox, index)
        outcome = adding.result(timeout=60)
    assert outcome.ok, outcome
    assert_attached(world, sandbox, index)
    assert_silent_success(runtime.check(sandbox))


@pytest.mark.parametrize('version', [v for v in VERSIONS if v < '1.1.0'])
def test_gc_and_status_need_1_1_0(world, version):
    runtime = world.runtime(version)
    sandbox, index = world.pod(runtime)
    assert runtime.add(sandbox).ok
    assert runtime.status() is None and runtime.gc([]) is None   # libcni does not ask
    assert runtime.cached() == []           # but its GC DELed the stale attachment
    assert_detached(world, sandbox, 'default/' + sandbox.pod_name)
    assert runtime.add(sandbox).ok
    config = dict(runtime.netconf, **{'cni.dev/valid-attachments': []})
    assert_refused(runtime.execute('GC', None, config=config), 1, version)
    assert_refused(runtime.execute('STATUS', None), 1, version)
    assert_attached(world, sandbox, index)


# STATUS ------------------------------------------------------------------------------


def test_status_when_serving(world):
    assert_silent_success(world.runtime('1.1.0').status())


def test_status_unreachable_daemon_is_50(tmp_path):
    runtime = testruntime.Runtime(str(tmp_path / 'no.sock'), str(tmp_path / 'state'),
                                  str(tmp_path / 'cache'))
    assert_refused(runtime.status(), 50, '1.1.0')


def test_status_is_50_until_the_watcher_synced(node, tmp_path):
    runtime = testruntime.Runtime(node.socket, node.state_dir, str(tmp_path / 'cache'))
    node.api.stop()
    node.start_daemon(workers=2, wait=False)
    outcome = _poll_status(runtime, lambda o: o.output['msg'] == DAEMON_NOT_READY)
    assert_refused(outcome, 50, '1.1.0')
    assert 'not synced' in outcome.output['details']
    node.api.start()
    _poll_status(runtime, lambda o: o.ok)


def _poll_status(runtime, wanted, timeout=40):
    """STATUS until ``wanted(outcome)``; the daemon's state has no event to wait on."""
    deadline = time.monotonic() + timeout
    while True:
        outcome = runtime.status()
        if (outcome.ok or outcome.output) and wanted(outcome):
            return outcome
        assert time.monotonic() < deadline, outcome
        time.sleep(0.1)
