"""kuryr_cni.state: atomic writes, the binding store and the shim's DEL queue.

A reader must only ever see a complete file; whatever is not a valid record
is set aside to ``*.corrupt-<time>`` (kept for the operator), counted, never
fatal and never retried. Files are named by a digest of the pod key, so the
longest legal names fit; bindings of kuryr-cni 0.1.0 load.
"""

import json
import logging
import os
import shutil
import stat

import pytest

from kuryr_cni import errors
from kuryr_cni import records
from kuryr_cni import state
from kuryr_cni import vif as vif_model

FIXTURE = os.path.join(os.path.dirname(__file__), 'fixtures', 'state-0.1.0', 'bindings')
VIF = vif_model.parse_vif({'kind': 'bridge', 'port_id': 'port-1', 'bridge': 'br0',
                           'mac': 'fa:16:3e:00:00:01', 'ips': ['10.0.0.1/24'],
                           'gateway': '10.0.0.254'})
# The longest legal names: a 63-character namespace, a 253-character name.
LONG_POD = '%s/%s' % ('n' * 63, '.'.join(['a' * 63] * 3) + '.' + 'b' * 61)


def binding(pod='demo/web-0', owner='c1'):
    sandbox = records.Sandbox(owner, '/var/run/netns/x', 'u1')
    sandbox.attachments[('kuryr', 'eth0')] = records.Attachment(
        'kuryr', 'eth0', [records.Interface('eth0', VIF, True)], state=records.READY,
        added_at=12.5, result={'cniVersion': '1.1.0'})
    return records.Binding(pod, owner, 'u1', {owner: sandbox})


def listing(directory):
    return sorted(os.listdir(directory))


def aside(directory):
    """The names set aside in ``directory``, without their ``.corrupt-<time>`` suffix."""
    return sorted(n.partition('.corrupt-')[0] for n in os.listdir(directory)
                  if '.corrupt-' in n)


@pytest.fixture
def store(tmp_path):
    return state.BindingStore(str(tmp_path))


def write_binding_file(store, pod_key, content):
    with open(store.path(pod_key), 'wb') as f:
        f.write(content if isinstance(content, bytes) else json.dumps(content).encode())


# -- write_atomically -------------------------------------------------------

def test_write_atomically_writes_the_data_with_mode_0600_and_no_temp(tmp_path):
    old_umask = os.umask(0)       # the mode must come from the code, not the umask
    try:
        state.write_atomically(str(tmp_path), 'a.json', b'{"x": 1}')
    finally:
        os.umask(old_umask)
    assert (tmp_path / 'a.json').read_bytes() == b'{"x": 1}'
    assert stat.S_IMODE((tmp_path / 'a.json').stat().st_mode) == 0o600
    assert listing(tmp_path) == ['a.json']


def test_a_durable_write_fsyncs_the_file_and_the_directory_and_another_neither(
        tmp_path, monkeypatch):
    synced = []
    fsync = os.fsync
    monkeypatch.setattr(os, 'fsync', lambda fd: (synced.append(os.readlink(
        '/proc/self/fd/%d' % fd)), fsync(fd)))
    state.write_atomically(str(tmp_path), 'a.json', b'1')
    assert synced == [str(tmp_path / ('.a.json.%d.tmp' % os.getpid())), str(tmp_path)]
    synced.clear()
    state.write_atomically(str(tmp_path), 'a.json', b'22', durable=False)
    assert synced == []
    assert (tmp_path / 'a.json').read_bytes() == b'22'
    assert listing(tmp_path) == ['a.json']


def test_write_atomically_replaces_and_survives_a_stale_temp(tmp_path):
    (tmp_path / 'a.json').write_bytes(b'old')
    # A temporary file left by an earlier write of this very process that died.
    stale = tmp_path / ('.a.json.%d.tmp' % os.getpid())
    stale.write_bytes(b'garbage that is longer than the new data')
    state.write_atomically(str(tmp_path), 'a.json', b'new')
    assert (tmp_path / 'a.json').read_bytes() == b'new'
    assert listing(tmp_path) == ['a.json']
    # rename, not rewrite in place: a reader holding the old file keeps the old data
    with open(tmp_path / 'a.json', 'rb') as reader:
        state.write_atomically(str(tmp_path), 'a.json', b'newer')
        assert reader.read() == b'new'
    assert (tmp_path / 'a.json').read_bytes() == b'newer'


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path):
    """Issue 13 item 8: a failed write removes its temporary file at once."""
    (tmp_path / 'a.json').write_bytes(b'old')
    with pytest.raises(TypeError):
        state.write_atomically(str(tmp_path), 'a.json', 'not bytes')
    assert (tmp_path / 'a.json').read_bytes() == b'old'
    assert listing(tmp_path) == ['a.json']


def test_ensure_dir_is_private(tmp_path):
    old_umask = os.umask(0)
    try:
        path = state.ensure_dir(str(tmp_path / 'a' / 'b'))
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert state.ensure_dir(path) == path     # idempotent


# -- BindingStore -----------------------------------------------------------

def test_binding_round_trip_under_a_digest_name(store, tmp_path):
    store.save(binding())
    assert store.load('demo/web-0') == binding()
    name = state.file_stem('demo/web-0') + '.json'
    assert listing(tmp_path / 'bindings') == [name]
    on_disk = json.loads((tmp_path / 'bindings' / name).read_bytes())
    assert (on_disk['format'], on_disk['pod']) == (1, 'demo/web-0')
    assert stat.S_IMODE(os.stat(tmp_path / 'bindings' / name).st_mode) == 0o600


HYBRID_VIF = vif_model.parse_vif({'kind': 'ovs-hybrid', 'port_id': 'port-2',
                                  'bridge': 'qbrport-2', 'integration_bridge': 'br-int',
                                  'mac': 'fa:16:3e:00:00:02', 'ips': ['10.0.0.2/24']})


NETWORK_VIF = vif_model.parse_vif({'kind': 'bridge', 'port_id': 'port-3', 'bridge': 'kuryr-br0',
                                   'network_id': 'net-1', 'mac': 'fa:16:3e:00:00:03',
                                   'ips': ['10.0.0.3/24']})


@pytest.mark.parametrize('vif, written, later_key', [
    (VIF, 1, None), (HYBRID_VIF, 2, 'integration_bridge'), (NETWORK_VIF, 3, 'network_id')],
    ids=['bridge', 'hybrid', 'network'])
def test_a_binding_is_written_in_the_oldest_format_that_holds_it(store, tmp_path, vif,
                                                                 written, later_key):
    """Issue 31 hole 9: format 2 added the VIF's integration_bridge, format 3 its
    network_id (the address fence's network); a record without them stays readable by
    the releases that read format 1."""
    record = binding()
    record.owner_sandbox.attachments[('kuryr', 'eth0')].interfaces[0].vif = vif
    store.save(record)
    on_disk = json.loads(open(store.path('demo/web-0'), 'rb').read())
    assert on_disk['format'] == written
    for key in ('integration_bridge', 'network_id'):
        assert (key in json.dumps(on_disk)) == (key == later_key)
    assert store.load('demo/web-0') == record


def test_the_longest_legal_names_fit(store, tmp_path):
    """Issue 13 item 5: a 316-character pod key is saved, loaded, removed and locked."""
    assert len(LONG_POD) == 63 + 1 + 253
    records.pod_key(LONG_POD)           # legal
    store.save(binding(LONG_POD))
    assert store.load(LONG_POD) == binding(LONG_POD)
    assert store.load_all() == {LONG_POD: binding(LONG_POD)}
    store.remove(LONG_POD)
    assert store.load(LONG_POD) is None
    assert listing(tmp_path / 'bindings') == []


def test_binding_save_overwrites(store, tmp_path):
    store.save(binding())
    store.save(binding(owner='c2'))
    assert store.load('demo/web-0').owner == 'c2'
    assert len(listing(tmp_path / 'bindings')) == 1


def test_binding_load_missing_is_none(store):
    assert store.load('demo/nothing') is None


def test_binding_remove(store, tmp_path):
    store.save(binding())
    store.remove('demo/web-0')
    assert store.load('demo/web-0') is None
    assert listing(tmp_path / 'bindings') == []
    store.remove('demo/web-0')       # a second remove is harmless
    assert listing(tmp_path / 'bindings') == []


GOOD = binding().to_dict()
SANDBOX = GOOD['sandboxes']['c1']
ATTACHMENT = SANDBOX['attachments']['kuryr/eth0']


def _with(path, value):
    """GOOD with the value at ``path`` (a tuple of keys) replaced; None deletes it."""
    data = json.loads(json.dumps(GOOD))
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is None:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


BAD_CONTENT = {
    # Not JSON at all
    'truncated': b'{"pod": "demo/web-0", "owner": "c1"',
    'empty': b'',
    'zeroed blocks': b'\x00' * 64,
    'not UTF-8': b'\xff\xfe{}',
    # JSON, but not of the declared shape (issue 13 item 3)
    'a list': [1, 2],
    'null': None,
    'a string': 'demo/web-0',
    'an empty object': {},
    'no sandboxes': _with(('sandboxes',), None),
    'sandboxes a list': _with(('sandboxes',), []),
    'attachments a list': _with(('sandboxes', 'c1', 'attachments'), []),
    'interfaces an object': _with(('sandboxes', 'c1', 'attachments', 'kuryr/eth0',
                                   'interfaces'), {}),
    'owner without a sandbox': _with(('owner',), 'c9'),
    'bad state': _with(('sandboxes', 'c1', 'attachments', 'kuryr/eth0', 'state'), 'done'),
    'bad VIF': _with(('sandboxes', 'c1', 'attachments', 'kuryr/eth0', 'interfaces'),
                     [{'ifname': 'eth0', 'vif': {'kind': 'bridge'}, 'default_route': True}]),
    'bad netns': _with(('sandboxes', 'c1', 'netns'), 7),
    'bad key': _with(('sandboxes', 'c1', 'attachments'), {'eth0': ATTACHMENT}),
    'negative format': _with(('format',), -1),
}


@pytest.mark.parametrize('content', BAD_CONTENT.values(), ids=BAD_CONTENT.keys())
def test_a_binding_not_of_its_shape_is_set_aside_and_counted(store, tmp_path, content):
    write_binding_file(store, 'demo/web-0', content)
    assert store.load('demo/web-0') is None
    name = state.file_stem('demo/web-0') + '.json'
    assert aside(tmp_path / 'bindings') == [name]
    # once set aside it is no longer seen, and a new binding can be saved
    assert store.load_all() == {}
    store.save(binding())
    assert store.load('demo/web-0') == binding()


def test_load_all_survives_every_bad_shape_at_once(tmp_path):
    """Issue 13 item 3: no content makes start-up raise."""
    store = state.BindingStore(str(tmp_path))
    for index, content in enumerate(BAD_CONTENT.values()):
        write_binding_file(store, 'demo/bad-%d' % index, content)
    store.save(binding('demo/good'))
    assert store.load_all() == {'demo/good': binding('demo/good')}
    assert len(aside(tmp_path / 'bindings')) == len(BAD_CONTENT)


def test_a_directory_in_the_place_of_a_binding_is_set_aside(store, tmp_path):
    """Issue 13 item 3."""
    os.mkdir(store.path('demo/web-0'))
    assert store.load_all() == {}
    assert store.load('demo/web-0') is None
    store.save(binding())
    assert store.load_all() == {'demo/web-0': binding()}


def test_a_record_naming_another_pod_is_refused(store, tmp_path):
    """Issue 13 item 4: a file whose content names another pod never overwrites its record."""
    store.save(binding('demo/victim', owner='c-victim'))
    write_binding_file(store, 'demo/web-0', binding('demo/victim', owner='c-intruder').to_dict())
    assert store.load_all() == {'demo/victim': binding('demo/victim', owner='c-victim')}
    assert store.load('demo/web-0') is None
    assert store.load('demo/victim') == binding('demo/victim', owner='c-victim')
    assert aside(tmp_path / 'bindings') == [state.file_stem('demo/web-0') + '.json']


def test_a_future_format_is_refused_and_left_untouched(store, caplog):
    """Issue 14 item 1: a file of a format newer than this release reads."""
    content = json.dumps(_with(('format',), records.FORMAT + 1)).encode()
    write_binding_file(store, 'demo/web-0', content)
    with pytest.raises(errors.UnreadableState) as raised:
        store.load('demo/web-0')
    assert (raised.value.code, raised.value.retry) == (5, False)
    assert 'newer' in raised.value.msg and store.path('demo/web-0') in raised.value.msg
    with caplog.at_level(logging.ERROR, logger='kuryr_cni.state'):
        assert store.load_all() == {}
    assert [r.getMessage() for r in caplog.records] == [
        'binding file %s was written by a newer kuryr-cni (format %d is newer than this '
        'release reads (%d)); leaving it untouched'
        % (store.path('demo/web-0'), records.FORMAT + 1, records.FORMAT)]
    with open(store.path('demo/web-0'), 'rb') as f:
        assert f.read() == content


UNKNOWN_KEYS = {
    'in the VIF': ('sandboxes', 'c1', 'attachments', 'kuryr/eth0', 'interfaces', 0, 'vif',
                   'qos_policy'),
    'in an interface': ('sandboxes', 'c1', 'attachments', 'kuryr/eth0', 'interfaces', 0,
                        'queues'),
    'in an attachment': ('sandboxes', 'c1', 'attachments', 'kuryr/eth0', 'checked_at'),
    'in a sandbox': ('sandboxes', 'c1', 'runtime'),
    'in the binding': ('generation',),
}


@pytest.mark.parametrize('path', UNKNOWN_KEYS.values(), ids=UNKNOWN_KEYS.keys())
@pytest.mark.parametrize('version', range(records.FORMAT + 1))
def test_a_key_this_release_does_not_know_is_refused_and_left_untouched(store, tmp_path,
                                                                        path, version):
    """Issue 31 hole 9: a newer release's record, even one that forgot to bump the
    format, is left untouched (code 5), never set aside as damaged."""
    data = json.loads(json.dumps(binding().to_dict()))
    data['format'] = version
    if version == 0:
        del data['format']
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = 'something new'
    content = json.dumps(data).encode()
    write_binding_file(store, 'demo/web-0', content)

    with pytest.raises(errors.UnreadableState) as raised:
        store.load('demo/web-0')

    assert raised.value.code == 5 and repr(path[-1]) in raised.value.details
    assert store.load_all() == {}
    assert aside(tmp_path / 'bindings') == []
    with open(store.path('demo/web-0'), 'rb') as f:
        assert f.read() == content


# -- state of kuryr-cni 0.1.0 --------------------------------------------------

def test_bindings_written_by_0_1_0_load_after_migration(tmp_path):
    """Issue 14 item 1: state written by the previous release (a committed fixture) loads."""
    store = state.BindingStore(str(tmp_path))
    locks = tmp_path / 'locks'
    locks.mkdir()
    (locks / 'default_web-0.lock').write_bytes(b'')
    originals = {}
    for name in os.listdir(FIXTURE):
        shutil.copy(os.path.join(FIXTURE, name), tmp_path / 'bindings' / name)
        with open(os.path.join(FIXTURE, name)) as f:
            originals[name] = json.load(f)
    assert store.migrate_legacy_names(str(locks)) == 3
    loaded = store.load_all()
    assert sorted(loaded) == ['default/pending-0', 'default/web-0', 'prod/db-0']
    for name, original in originals.items():
        pod_key = original['pod']
        rewritten = loaded[pod_key].to_dict()
        assert rewritten.pop('format') == 1
        assert rewritten == original                       # nothing lost or changed
    assert listing(tmp_path / 'bindings') == sorted(state.file_stem(k) + '.json'
                                                    for k in loaded)
    assert listing(locks) == []
    web = loaded['default/web-0']
    attachment = web.owner_sandbox.attachments[('kuryr', 'eth0')]
    assert (attachment.state, attachment.interfaces[0].vif.mac) == ('ready', 'fa:16:3e:00:00:02')
    assert loaded['default/pending-0'].owner_sandbox.attachments == {}
    assert store.migrate_legacy_names(str(locks)) == 0     # idempotent


def test_after_a_downgrade_to_0_1_0_and_back_its_newer_record_wins(tmp_path):
    """Issue 31 hole 9: this release migrated web-0's record (digest name); 0.1.0, run
    again, wrote the pod's newer record under its legacy name (the committed fixture,
    as 0.1.0 writes it); back on this release, the newer one is the pod's binding."""
    store = state.BindingStore(str(tmp_path))
    stale = binding('default/web-0', owner='c-before-the-downgrade')
    store.save(stale)
    shutil.copy(os.path.join(FIXTURE, 'default_web-0.json'), tmp_path / 'bindings')
    with open(os.path.join(FIXTURE, 'default_web-0.json')) as f:
        newer = records.Binding.from_dict(json.load(f))

    assert store.migrate_legacy_names(str(tmp_path / 'locks')) == 1

    assert store.load_all() == {'default/web-0': newer}
    assert aside(tmp_path / 'bindings') == [state.file_stem('default/web-0') + '.json']
    assert not (tmp_path / 'bindings' / 'default_web-0.json').exists()


def test_a_legacy_file_under_another_pods_name_is_set_aside(tmp_path):
    store = state.BindingStore(str(tmp_path))
    (tmp_path / 'bindings' / 'demo_web-0.json').write_text(
        json.dumps(binding('demo/victim').to_dict()))
    assert store.migrate_legacy_names(str(tmp_path / 'locks')) == 0
    assert store.load_all() == {}
    assert aside(tmp_path / 'bindings') == ['demo_web-0.json']


# -- temporary files and disk faults (issue 13 item 8) --------------------------------

def dead_pid():
    """A pid no process can have: above the kernel's pid_max."""
    with open('/proc/sys/kernel/pid_max') as f:
        return int(f.read()) + 1


def test_temporaries_are_removed_whoever_wrote_them(store, tmp_path):
    bindings = tmp_path / 'bindings'
    # One of this very process (a live pid, writing now), one of a dead writer,
    # one of a live pid but an hour old (its pid reused since).
    (bindings / ('.x.json.%d.tmp' % os.getpid())).write_bytes(b'{"pod": "de')
    (bindings / ('.y.json.%d.tmp' % dead_pid())).write_bytes(b'{"pod": "de')
    old = bindings / '.z.json.1.tmp'
    old.write_bytes(b'{"pod": "de')
    os.utime(old, (os.stat(old).st_mtime - 3600,) * 2)
    store.save(binding())
    assert store.remove_temporaries(while_running=True) == 2
    assert listing(bindings) == ['.x.json.%d.tmp' % os.getpid(),
                                 state.file_stem('demo/web-0') + '.json']
    assert store.remove_temporaries() == 1                  # at start-up: every one
    assert listing(bindings) == [state.file_stem('demo/web-0') + '.json']


def test_a_state_dir_that_refuses_writes_is_code_11_naming_it(store, tmp_path):
    # A real refusal, no mock: the bindings directory is replaced by a file.
    shutil.rmtree(tmp_path / 'bindings')
    (tmp_path / 'bindings').write_bytes(b'')
    with pytest.raises(errors.StateFailure) as raised:
        store.save(binding())
    exc = raised.value
    assert (exc.code, exc.retry) == (11, True)
    assert str(tmp_path / 'bindings') in exc.msg
    assert exc.details == 'error 20 (Not a directory)'


# -- DelQueue ---------------------------------------------------------------

def queue_entry(directory, name, body):
    path = directory / name
    path.write_bytes(body if isinstance(body, bytes) else json.dumps(body).encode())
    return str(path)


def test_del_queue_yields_complete_entries_oldest_first(tmp_path):
    queue = state.DelQueue(str(tmp_path))
    d = tmp_path / 'del-queue'
    # <time_ns>-<pid>.json, written out of order
    queue_entry(d, '1733140000300000000-77.json', {'CNI_CONTAINERID': 'c3'})
    queue_entry(d, '1733140000100000000-99.json', {'CNI_CONTAINERID': 'c1'})
    queue_entry(d, '1733140000200000000-12.json', {'CNI_CONTAINERID': 'c2'})
    # in-progress writes of the shim and other names: never read
    live_tmp = '.1733140000000000000-%d.tmp' % os.getpid()
    queue_entry(d, live_tmp, {'CNI_CONTAINERID': 'tmp'})
    queue_entry(d, '.1733140000000000001-5.json', {'CNI_CONTAINERID': 'hidden'})
    queue_entry(d, '1733140000000000002-5.json.corrupt-1', {'CNI_CONTAINERID': 'old'})
    queue_entry(d, 'stray.json', {'CNI_CONTAINERID': 'stray'})
    got = [(os.path.basename(p), b['CNI_CONTAINERID']) for p, b in queue.entries()]
    assert got == [('1733140000100000000-99.json', 'c1'),
                   ('1733140000200000000-12.json', 'c2'),
                   ('1733140000300000000-77.json', 'c3')]
    assert state.queued_del_count(str(tmp_path)) == 3
    # reading does not consume, and the temporary files are left to their writer
    assert len(list(queue.entries())) == 3
    assert live_tmp in listing(d)


@pytest.mark.parametrize('content', [b'{"CNI_COMMAND": "DEL", ', b'[]', b'7', b'\xff'])
def test_del_queue_sets_aside_a_corrupt_entry_and_goes_on(tmp_path, content):
    queue = state.DelQueue(str(tmp_path))
    d = tmp_path / 'del-queue'
    queue_entry(d, '1-1.json', {'CNI_CONTAINERID': 'c1'})
    queue_entry(d, '2-1.json', content)
    queue_entry(d, '3-1.json', {'CNI_CONTAINERID': 'c3'})
    got = [b['CNI_CONTAINERID'] for _, b in queue.entries()]
    assert got == ['c1', 'c3']
    assert aside(d) == ['2-1.json']
    assert [n for n in listing(d) if '.corrupt-' not in n] == ['1-1.json', '3-1.json']


def test_del_queue_done_removes_the_entry(tmp_path):
    queue = state.DelQueue(str(tmp_path))
    d = tmp_path / 'del-queue'
    queue_entry(d, '1-1.json', {'CNI_CONTAINERID': 'c1'})
    queue_entry(d, '2-1.json', {'CNI_CONTAINERID': 'c2'})
    for path, body in queue.entries():
        if body['CNI_CONTAINERID'] == 'c1':
            queue.done(path)
    assert listing(d) == ['2-1.json']
    queue.done(str(d / '1-1.json'))          # already gone: harmless
    assert [b['CNI_CONTAINERID'] for _, b in queue.entries()] == ['c2']


def test_del_queue_entry_written_atomically_is_read_whole(tmp_path):
    queue = state.DelQueue(str(tmp_path))
    body = {'CNI_COMMAND': 'DEL', 'CNI_CONTAINERID': 'c1', 'config': {'x': 'y' * 100000}}
    state.write_atomically(queue.directory, '5-5.json', json.dumps(body).encode())
    assert [b for _, b in queue.entries()] == [body]


def test_del_queue_removes_what_a_killed_shim_left_once_old(tmp_path):
    queue = state.DelQueue(str(tmp_path))
    d = tmp_path / 'del-queue'
    # A shim may live in another pid namespace and be writing right now, so
    # only age tells an abandoned file; its pid says nothing.
    old = queue_entry(d, '.1733140000000000000-%d.tmp' % os.getpid(), b'{"CNI_COMMAND": "D')
    an_hour_ago = os.stat(old).st_mtime - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    recent = queue_entry(d, '.1733140000200000000-1.tmp', b'{"CNI_COMM')
    queue_entry(d, '1733140000100000000-99.json', {'CNI_CONTAINERID': 'c1'})
    assert queue.remove_temporaries() == 1
    assert listing(d) == [os.path.basename(recent), '1733140000100000000-99.json']


# -- only root's entries are read (issue 20) --------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason='chown needs root')


def plant(directory, name, how, tmp_path):
    """An entry someone else could have planted; returns its path."""
    path = directory / name
    body = json.dumps({'CNI_CONTAINERID': 'planted'}).encode()
    if how == 'symlink':
        target = tmp_path / 'elsewhere.json'
        target.write_bytes(body)
        path.symlink_to(target)
    elif how == 'fifo':
        os.mkfifo(path, 0o600)
    else:
        path.write_bytes(body)
        if how == 'writable':
            os.chmod(path, 0o666)
        elif how == 'nobody':
            os.chown(path, 65534, 65534)
    return str(path)


@pytest.mark.parametrize('how', [
    'symlink', 'fifo', 'writable', pytest.param('nobody', marks=needs_root)])
def test_del_queue_sets_aside_an_entry_that_is_not_roots_unread(tmp_path, how):
    queue = state.DelQueue(str(tmp_path))
    d = tmp_path / 'del-queue'
    queue_entry(d, '1-1.json', {'CNI_CONTAINERID': 'c1'})
    plant(d, '2-1.json', how, tmp_path)
    assert [b['CNI_CONTAINERID'] for _, b in queue.entries()] == ['c1']
    assert aside(d) == ['2-1.json']
    if how == 'symlink':
        assert (tmp_path / 'elsewhere.json').exists()       # the link moved, not its target


def test_del_queue_is_not_read_while_others_may_write_it(tmp_path, caplog):
    queue = state.DelQueue(str(tmp_path))
    d = tmp_path / 'del-queue'
    queue_entry(d, '1-1.json', {'CNI_CONTAINERID': 'c1'})
    os.chmod(d, 0o777)
    with caplog.at_level(logging.ERROR):
        assert list(queue.entries()) == [] and list(queue.entries()) == []
    assert [r.getMessage() for r in caplog.records] == [
        'Refusing to replay the DEL queue while %s is writable by group or others '
        '(mode 777)' % d]                                    # once, not at every round
    assert listing(d) == ['1-1.json']                        # left for the operator
    os.chmod(d, 0o700)
    assert [b['CNI_CONTAINERID'] for _, b in queue.entries()] == ['c1']


@pytest.mark.parametrize('how', [
    'symlink', 'writable', pytest.param('nobody', marks=needs_root)])
def test_a_binding_that_is_not_roots_is_set_aside_unread(store, tmp_path, how):
    store.save(binding())
    name = os.path.basename(store.path('demo/web-0'))
    os.unlink(store.path('demo/web-0'))
    plant(tmp_path / 'bindings', name, how, tmp_path)
    assert store.load('demo/web-0') is None
    assert aside(store.directory) == [name]


def test_bindings_are_not_read_while_others_may_write_their_directory(store):
    store.save(binding())
    os.chmod(store.directory, 0o775)
    with pytest.raises(errors.StateFailure) as caught:
        store.load('demo/web-0')
    assert caught.value.code == 11 and 'writable by group or others' in caught.value.details


@pytest.mark.parametrize('how', [
    'file', 'writable', pytest.param('nobody', marks=needs_root)])
def test_unsafe_dir_names_what_is_wrong(tmp_path, how):
    d = tmp_path / 'd'
    if how == 'file':
        d.write_text('')
    else:
        d.mkdir(mode=0o700)
        if how == 'writable':
            os.chmod(d, 0o770)
        else:
            os.chown(d, 65534, 65534)
    expected = {'file': 'is not a directory', 'writable': 'writable by group or others (mode 770)',
                'nobody': 'belongs to uid 65534, not to root'}[how]
    assert expected in state.unsafe_dir(str(d))
    os.unlink(d) if how == 'file' else os.rmdir(d)
    d.mkdir(mode=0o700)
    assert state.unsafe_dir(str(d)) is None
