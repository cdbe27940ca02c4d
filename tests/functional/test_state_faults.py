"""The state store against a clumsy operator, a broken disk and a hostile runtime.

Issue 13, items 3, 4, 5, 6 and 8: each test names its item. Real daemon, real
shim, real namespaces; the damaged state files are written while the daemon is
stopped, under whatever name the pod's binding has (found by listing the
directory, so the same test judged kuryr-cni 0.1.0, whose files were named
``<namespace>_<name>.json``). The disk faults are real: a small tmpfs mounted
on the state dir, filled up, then remounted read-only.
"""

import contextlib
import json
import os
import subprocess

import pytest

from kuryr_cni.binding import owner_tag
from tools.testbed import host as testhost
from tools.testbed import runtime as testruntime

from tests import wait
from tests.functional import conftest
from tests.functional import crash
from tests.functional import helpers

pytestmark = pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON)


def binding_files(node):
    directory = os.path.join(node.state_dir, 'bindings')
    return sorted(n for n in os.listdir(directory) if n.endswith('.json'))


def the_binding_file(node):
    """The path of the one binding file there is."""
    (name,) = binding_files(node)
    return os.path.join(node.state_dir, 'bindings', name)


def set_aside(node):
    return [n for n in os.listdir(os.path.join(node.state_dir, 'bindings')) if '.corrupt' in n]


def restart(node):
    assert node.stop_daemon() == 0
    node.start_daemon()


# Item 3: a valid-JSON binding of the wrong shape never stops the daemon -----------------

WRONG_SHAPES = {
    'empty object': {},
    'no sandboxes': {'pod': 'default/ghost-1', 'owner': None, 'uid': None},
    'a list': [{'pod': 'default/ghost-2'}],
}


def test_item3_bindings_of_the_wrong_shape_never_stop_the_daemon(daemon, runtime):
    node = daemon
    live = crash.make_pod(node, 5, name='live')
    assert runtime.add(live).ok
    assert node.stop_daemon() == 0
    bindings = os.path.join(node.state_dir, 'bindings')
    for index, content in enumerate(WRONG_SHAPES.values()):
        with open(os.path.join(bindings, 'default_ghost-%d.json' % index), 'w') as f:
            json.dump(content, f)
    os.mkdir(os.path.join(bindings, 'default_ghost-dir.json'))

    node.start_daemon()                      # it starts: nothing above is fatal

    assert len(set_aside(node)) == len(WRONG_SHAPES) + 1
    assert helpers.metric(node, 'kuryr_cni_state_files_set_aside_total',
                          kind='binding') == len(WRONG_SHAPES) + 1
    helpers.assert_connected(node, live, 5)
    assert runtime.delete(live).ok
    assert helpers.leftovers(node)['devices'] == []


def test_item3_a_list_where_a_dict_belongs_does_not_fail_every_del(daemon, runtime):
    node = daemon
    a = crash.make_pod(node, 6, name='web')
    assert runtime.add(a).ok
    assert node.stop_daemon() == 0
    path = the_binding_file(node)
    with open(path) as f:
        record = json.load(f)
    record['sandboxes'] = [record['sandboxes']]          # a list where a dict belongs
    with open(path, 'w') as f:
        json.dump(record, f)
    node.start_daemon()

    outcome = runtime.delete(a)
    assert outcome.ok, outcome                # not code 999, not today nor at any retry
    # The record was set aside, so the DEL judged by the owner tag: A's devices went.
    assert set(node.links(a.netns)) == {'lo'}
    assert helpers.leftovers(node) == {'devices': [], 'bindings': [], 'locks': []}


# Item 4: a lost record never disconnects a live pod ---------------------------------------

def test_item4_a_truncated_binding_leaves_its_live_pod_connected(daemon, runtime):
    node = daemon
    a = crash.make_pod(node, 7, name='web')
    assert runtime.add(a).ok
    assert node.stop_daemon() == 0
    path = the_binding_file(node)
    with open(path, 'r+b') as f:
        f.truncate(40)                        # a crash mid-write on a disk without barriers

    node.start_daemon()

    assert len(set_aside(node)) == 1
    helpers.assert_connected(node, a, 7)              # start-up left the unrecorded devices alone
    assert 'leaving it alone' in node.log_tail(200)
    assert runtime.delete(a).ok               # its DEL still removes them, by their tag
    assert set(node.links(a.netns)) == {'lo'}
    assert helpers.leftovers(node)['devices'] == []


def test_item4_a_file_naming_another_pod_cannot_take_its_record(daemon, runtime):
    node = daemon
    victim = crash.make_pod(node, 8, name='victim')
    assert runtime.add(victim).ok
    assert node.stop_daemon() == 0
    with open(the_binding_file(node)) as f:
        impostor = json.load(f)
    cid = impostor['owner']
    impostor['sandboxes'] = {'intruder': impostor['sandboxes'][cid]}
    impostor['owner'] = 'intruder'
    # Under another pod's name (sorted after the victim's), content naming the victim.
    with open(os.path.join(node.state_dir, 'bindings', 'default_zzz.json'), 'w') as f:
        json.dump(impostor, f)

    node.start_daemon()

    assert crash.registry_pods(node)['default/victim']['owner'] == victim.container_id
    helpers.assert_connected(node, victim, 8)
    assert len(set_aside(node)) == 1
    assert runtime.delete(victim).ok
    assert helpers.leftovers(node) == helpers.NOTHING


def test_start_leaves_alone_tagged_devices_that_no_binding_records(daemon, runtime):
    """Item 4: a device tagged for a sandbox nobody can prove dead is never deleted."""
    node = daemon
    live = crash.make_pod(node, 9)
    assert runtime.add(live).ok
    assert node.stop_daemon() == 0
    # A veth pair tagged for a sandbox no binding records (its binding was lost).
    ghost_netns = node.pod_netns()
    ghost = owner_tag.host_ifname('ghost', 'eth0')
    testhost.ip('-n', node.ns, 'link', 'add', ghost, 'type', 'veth', 'peer', 'name', 'eth0',
                'netns', os.path.basename(ghost_netns))
    testhost.ip('-n', node.ns, 'link', 'set', ghost, 'alias', owner_tag.alias('ghost', 'eth0'))
    node.start_daemon()
    assert ghost in node.links()
    assert set(node.links(ghost_netns)) == {'lo', 'eth0'}
    helpers.assert_connected(node, live, 9)
    # The runtime's DEL of that sandbox, even without pod identity, removes it by its tag.
    orphan = testruntime.Sandbox('ghost', ghost_netns, '')
    assert runtime.execute('DEL', orphan).ok
    assert ghost not in node.links()
    assert set(node.links(ghost_netns)) == {'lo'}


# Item 5: the longest legal Kubernetes names --------------------------------------------

def test_item5_the_longest_legal_names_add_check_and_del(daemon, runtime):
    node = daemon
    namespace = 'n' * 63
    name = '.'.join(['a' * 63] * 3) + '.' + 'b' * 61
    assert len(name) == 253
    node.api.create_pod(namespace, name, testhost.NODE, uid='uid-long',
                        annotations={'kuryr.openstack.org/vifs': json.dumps(node.vifs(10))})
    sandbox = testruntime.Sandbox('cid-long', node.pod_netns(), name,
                                  pod_namespace=namespace, pod_uid='uid-long')
    outcome = runtime.add(sandbox)
    assert outcome.ok, outcome
    helpers.assert_connected(node, sandbox, 10)
    assert runtime.check(sandbox).ok
    assert runtime.delete(sandbox).ok
    assert runtime.delete(sandbox).ok         # and again, as runtimes do
    assert helpers.leftovers(node) == helpers.NOTHING


# Item 6: an ADD retried with another pod's netns -------------------------------------------

def test_item6_an_add_retried_with_another_netns_is_refused_and_touches_nothing(daemon,
                                                                                runtime):
    node = daemon
    p2 = crash.make_pod(node, 12, name='p2', container_id='sb-p2')
    p3 = crash.make_pod(node, 13, name='p3', container_id='sb-p3')
    assert runtime.add(p2).ok and runtime.add(p3).ok
    before = {key: b for key, b in crash.registry_pods(node).items()}

    misdirected = testruntime.Sandbox('sb-p2', p3.netns, 'p2', pod_uid=p2.pod_uid)
    outcome = runtime.execute('ADD', misdirected)

    assert outcome.code != 0 and outcome.output['code'] == 4, outcome
    assert 'cannot change' in outcome.output['details']
    helpers.assert_connected(node, p3, 13)
    helpers.assert_connected(node, p2, 12)
    assert crash.registry_pods(node) == before


# Item 8: disk faults --------------------------------------------------------------------------

@contextlib.contextmanager
def small_disk(path, size='512k'):
    """A tmpfs of ``size`` mounted on ``path`` (made first); unmounted afterwards."""
    os.makedirs(path, exist_ok=True)
    subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=%s,mode=0700' % size, 'tmpfs', path],
                   check=True, capture_output=True, timeout=30)
    try:
        yield path
    finally:
        subprocess.run(['umount', '-l', path], capture_output=True, timeout=30)


def fill(directory):
    """Write until the disk is full; returns the filler's path."""
    path = os.path.join(directory, 'filler')
    with open(path, 'wb', buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b'\0' * 4096)
    return path


def test_item8_a_full_or_read_only_state_dir_is_code_11_naming_it(node, runtime):
    with small_disk(node.state_dir):
        node.start_daemon()
        a = crash.make_pod(node, 14, name='a')
        b = crash.make_pod(node, 15, name='b')
        assert runtime.add(a).ok
        filler = fill(node.state_dir)

        full = runtime.add(b)
        assert full.output['code'] == 11, full
        assert node.state_dir in full.output['msg']
        assert 'error 28' in full.output['details']              # ENOSPC
        assert set(node.links(b.netns)) == {'lo'}                # nothing was plugged

        os.unlink(filler)
        subprocess.run(['mount', '-o', 'remount,ro', node.state_dir], check=True,
                       capture_output=True, timeout=30)
        read_only = runtime.execute('DEL', a)
        assert read_only.output['code'] == 11, read_only
        assert node.state_dir in read_only.output['msg']
        assert 'error 30' in read_only.output['details']          # EROFS
        helpers.assert_connected(node, a, 14)                            # not half unplugged

        subprocess.run(['mount', '-o', 'remount,rw', node.state_dir], check=True,
                       capture_output=True, timeout=30)
        assert runtime.add(b).ok
        assert runtime.delete(a).ok and runtime.delete(b).ok
        assert helpers.leftovers(node) == helpers.NOTHING
        assert [n for n in os.listdir(os.path.join(node.state_dir, 'bindings'))] == []
        assert node.stop_daemon() == 0


def test_item8_temporary_files_are_removed_at_start_whoever_wrote_them(daemon, runtime):
    node = daemon
    a = crash.make_pod(node, 16)
    assert runtime.add(a).ok
    assert node.stop_daemon() == 0
    bindings = os.path.join(node.state_dir, 'bindings')
    # Left by a writer whose pid now belongs to a live process (pid 1 always runs).
    left = os.path.join(bindings, '.0123456789abcdef0123456789abcdef.json.1.tmp')
    with open(left, 'wb') as f:
        f.write(b'{"pod": "default/p')
    node.start_daemon()
    assert not os.path.exists(left)
    assert [n for n in os.listdir(bindings) if n.startswith('.')] == []
    helpers.assert_connected(node, a, 16)


# Issue 20, item 2: only root may plant state -------------------------------------------


@pytest.mark.parametrize('sub, mode', [('', 0o770), ('bindings', 0o777), ('locks', 0o775),
                                       ('del-queue', 0o777), ('del-queue', 0o730)])
def test_issue20_a_state_directory_others_may_write_refuses_the_start(node, sub, mode):
    directory = os.path.join(node.state_dir, sub)
    os.makedirs(directory, mode=0o700)
    os.chmod(directory, mode)
    assert node.start_daemon(wait=False).wait(30) == 2
    log = open(os.path.join(node.workdir, 'daemon.log')).read()
    refusals = [line for line in log.splitlines() if 'Refusing to start' in line]
    assert len(refusals) == 1, log
    assert refusals[0].endswith('Refusing to start: %s is writable by group or others '
                                '(mode %o)' % (directory.rstrip('/'), mode))
    assert not os.path.exists(node.socket)


def _a_queued_del(node, sandbox, tmp_path):
    """The bytes of the queue entry a shim writes for ``sandbox``'s DEL."""
    elsewhere = str(tmp_path / 'elsewhere')
    cut_off = testruntime.Runtime(str(tmp_path / 'unreachable' / 'd.sock'), elsewhere,
                                  str(tmp_path / 'cut-off-cache'))
    assert cut_off.delete(sandbox).ok
    (name,) = os.listdir(os.path.join(elsewhere, 'del-queue'))
    with open(os.path.join(elsewhere, 'del-queue', name), 'rb') as f:
        return f.read()


def test_issue20_a_del_planted_by_someone_else_is_set_aside_not_replayed(daemon, runtime,
                                                                         tmp_path):
    node = daemon
    pod = crash.make_pod(node, 8)
    assert runtime.add(pod).ok
    entry = _a_queued_del(node, pod, tmp_path)
    queue = os.path.join(node.state_dir, 'del-queue')
    # What an ordinary user could leave in a queue directory others may write:
    # an entry of their own, and a link to one of root's elsewhere.
    planted = os.path.join(queue, '1-1.json')
    with open(planted, 'wb') as f:
        f.write(entry)
    os.chown(planted, 65534, 65534)
    roots = tmp_path / 'roots-entry.json'
    roots.write_bytes(entry)
    os.symlink(roots, os.path.join(queue, '2-1.json'))
    # The housekeeping round comes every 2 s.
    wait.until(lambda: helpers.metric(node, 'kuryr_cni_state_files_set_aside_total',
                                      kind='del_queue') == 2, 15,
               'both planted entries to be set aside')
    assert sorted(n.partition('.corrupt-')[0] for n in crash.queue_entries(node)) == [
        '1-1.json', '2-1.json']
    assert helpers.metric(node, 'kuryr_cni_queued_del_replayed_total') == 0
    helpers.assert_connected(node, pod, 8)          # still has its eth0, and pings
    log = node.log_tail(200)
    assert 'it belongs to uid 65534, not to root' in log and 'it is a symbolic link' in log
    assert runtime.delete(pod).ok                   # the runtime's own DEL still works
    assert set(node.links(pod.netns)) == {'lo'}


# Issue 31, hole 2: a queued DEL whose replay fails is kept and retried, never dropped ---

def test_issue31_a_queued_del_that_fails_is_kept_shown_and_applied_once_it_can_be(
        daemon, runtime):
    """The daemon was downgraded while a DEL was queued: the pod's binding is of a newer
    format, so the replay fails (code 5). The entry stays, shown by the metric, /ready
    and kuryr-cni-ctl; once the binding is readable again (the upgrade back), a retry
    applies the DEL and nothing of the sandbox is left."""
    node = daemon
    pod = crash.make_pod(node, 9)
    assert runtime.add(pod).ok
    assert node.stop_daemon() == 0
    path = the_binding_file(node)
    with open(path) as f:
        record = json.load(f)
    with open(path, 'w') as f:
        json.dump(dict(record, format=99), f)
    assert runtime.delete(pod).ok               # the shim queues it and reports success
    (entry,) = crash.queue_entries(node)

    node.start_daemon()
    wait.until(lambda: helpers.metric(node, 'kuryr_cni_queued_del_failures_total') >= 2, 15,
               'the queued DEL to fail at start and in a retry')
    assert crash.queue_entries(node) == [entry]     # kept, not set aside
    status, ready = crash.health(node, 'ready')
    assert (status, ready['queued_dels_failing']) == (200, 1), ready
    assert 'queued DELs failing' in ready['warnings'][0]
    status, listed = crash.daemon_get(node, '/v1/queued-dels')     # kuryr-cni-ctl's view
    (shown,) = listed['entries']
    assert (shown['entry'], shown['pod'], shown['container_id']) == (
        entry, 'default/pod-9', pod.container_id)
    assert 'newer kuryr-cni' in shown['error'] and '(code 5)' in shown['error']
    assert owner_tag.host_ifname(pod.container_id, 'eth0') in node.links()

    with open(path, 'w') as f:                  # the upgrade back
        json.dump(record, f)
    wait.until(lambda: crash.queue_entries(node) == [], 90, 'the retry to apply the DEL')
    assert helpers.leftovers(node) == helpers.NOTHING
    assert set(node.links(pod.netns)) == {'lo'}
    assert helpers.metric(node, 'kuryr_cni_queued_del_replayed_total') == 1
    wait.until(lambda: crash.health(node, 'ready')[1]['queued_dels_failing'] == 0, 15,
               'the failing count to clear')


def _ovsdb_read_only(switch, read_only):
    """ovsdb-server as a backup during a failover (every write answered "not allowed"),
    or active again."""
    commands = (['ovsdb-server/set-active-ovsdb-server', 'unix:' + os.path.join(
        switch.dir, 'no-active.sock')], ['ovsdb-server/connect-active-ovsdb-server']) \
        if read_only else (['ovsdb-server/disconnect-active-ovsdb-server'],)
    for command in commands:
        subprocess.run(['ovs-appctl', '-t', os.path.join(switch.dir, 'ovsdb-server.ctl'),
                        *command], env=switch.env, check=True, capture_output=True,
                       timeout=20)


def test_issue31_a_queued_del_refused_by_a_read_only_ovsdb_is_retried_until_it_applies(
        node, br_int, runtime):
    """Issue 31's probe: a DEL queued while the daemon was down, replayed while
    ovsdb-server answers "not allowed" (a read-only backup). On 2c4a2fa the entry was
    set aside and the pod's Interface row stayed on br-int for good."""
    switch = br_int
    extra = ('\n[cni_daemon]\nvif_source = annotation\n[binding]\novsdb_connection = %s\n'
             % switch.connection)
    node.start_daemon(workers=2, extra=extra)
    vifs = node.vifs(5, kind='ovs', bridge='br-int', port_id='5d0b-port-5',
                     ips=['10.20.0.5/24'], gateway='10.20.0.1')
    node.api.create_pod('default', 'web-0', testhost.NODE, uid='uid-web-0',
                        annotations={'kuryr.openstack.org/vifs': json.dumps(vifs)})
    sandbox = testruntime.Sandbox('sandbox-a', node.pod_netns(), 'web-0', pod_uid='uid-web-0')
    try:
        assert runtime.add(sandbox).ok
        [port] = switch.ports('br-int')
        assert node.stop_daemon() == 0
        assert runtime.delete(sandbox).ok       # queued: the daemon is down
        (entry,) = crash.queue_entries(node)
        _ovsdb_read_only(switch, True)
        try:
            node.start_daemon(workers=2, extra=extra)
            wait.until(lambda: helpers.metric(
                node, 'kuryr_cni_queued_del_failures_total') >= 3, 30,
                'the queued DEL to fail at start and in two retries')
            assert crash.queue_entries(node) == [entry]
            assert switch.ports('br-int') == {port}
            status, listed = crash.daemon_get(node, '/v1/queued-dels')
            assert 'not allowed' in listed['entries'][0]['error'], listed
        finally:
            _ovsdb_read_only(switch, False)     # the failover is over
        wait.until(lambda: crash.queue_entries(node) == [], 90, 'the retry to apply the DEL')
        assert switch.ports('br-int') == set()
        assert helpers.leftovers(node) == helpers.NOTHING
        assert set(node.links(sandbox.netns)) == {'lo'}
    finally:
        node.stop_daemon()
