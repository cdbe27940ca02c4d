"""kuryr_cni.state: atomic writes, the binding store and the shim's DEL queue.

A reader must only ever see a complete file; whatever does not parse is set
aside to ``*.corrupt`` (kept for the operator), never fatal and never retried.
"""

import json
import os
import stat

import pytest

from kuryr_cni import state

BINDING = {'pod': 'demo/web-0', 'owner': 'c1', 'uid': 'u1',
           'sandboxes': {'c1': {'netns': '/var/run/netns/x', 'uid': 'u1', 'attachments': {}}}}


def listing(directory):
    return sorted(os.listdir(directory))


def dead_pid():
    """A pid no process can have: above the kernel's pid_max."""
    with open('/proc/sys/kernel/pid_max') as f:
        return int(f.read()) + 1


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


def test_write_atomically_failure_leaves_the_old_file(tmp_path):
    (tmp_path / 'a.json').write_bytes(b'old')
    with pytest.raises(TypeError):
        state.write_atomically(str(tmp_path), 'a.json', 'not bytes')
    assert (tmp_path / 'a.json').read_bytes() == b'old'


def test_ensure_dir_is_private(tmp_path):
    old_umask = os.umask(0)
    try:
        path = state.ensure_dir(str(tmp_path / 'a' / 'b'))
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert state.ensure_dir(path) == path     # idempotent


# -- BindingStore -----------------------------------------------------------

def test_binding_round_trip(tmp_path):
    store = state.BindingStore(str(tmp_path))
    store.save('demo/web-0', BINDING)
    assert store.load('demo/web-0') == BINDING
    assert listing(tmp_path / 'bindings') == ['demo_web-0.json']
    assert store.files() == ['demo_web-0.json']
    mode = os.stat(tmp_path / 'bindings' / 'demo_web-0.json').st_mode
    assert stat.S_IMODE(mode) == 0o600


def test_binding_save_overwrites(tmp_path):
    store = state.BindingStore(str(tmp_path))
    store.save('demo/web-0', BINDING)
    store.save('demo/web-0', dict(BINDING, owner='c2'))
    assert store.load('demo/web-0')['owner'] == 'c2'
    assert listing(tmp_path / 'bindings') == ['demo_web-0.json']


def test_binding_load_missing_is_none(tmp_path):
    assert state.BindingStore(str(tmp_path)).load('demo/nothing') is None


def test_binding_remove(tmp_path):
    store = state.BindingStore(str(tmp_path))
    store.save('demo/web-0', BINDING)
    store.remove('demo/web-0')
    assert store.load('demo/web-0') is None
    assert listing(tmp_path / 'bindings') == []
    store.remove('demo/web-0')       # a second remove is harmless
    assert listing(tmp_path / 'bindings') == []


@pytest.mark.parametrize('content', [
    b'{"pod": "demo/web-0", "owner": "c1"',       # truncated
    b'',                                          # empty
    b'\x00' * 64,                                 # zeroed blocks after a crash
    b'\xff\xfe{}',                                # not UTF-8
    b'[1, 2]',                                    # JSON, but not a binding object
    b'null',
    b'"demo/web-0"',
])
def test_corrupt_binding_is_set_aside(tmp_path, content):
    store = state.BindingStore(str(tmp_path))
    (tmp_path / 'bindings' / 'demo_web-0.json').write_bytes(content)
    assert store.load('demo/web-0') is None
    assert listing(tmp_path / 'bindings') == ['demo_web-0.json.corrupt']
    assert (tmp_path / 'bindings' / 'demo_web-0.json.corrupt').read_bytes() == content
    # once set aside it is no longer seen, and a new binding can be saved
    assert store.load('demo/web-0') is None
    store.save('demo/web-0', BINDING)
    assert store.load('demo/web-0') == BINDING


def test_load_all_skips_corrupt_and_removes_temp_leftovers(tmp_path):
    store = state.BindingStore(str(tmp_path))
    other = dict(BINDING, pod='kube-system/dns_1x', owner='c9')
    store.save('demo/web-0', BINDING)
    store.save('kube-system/dns_1x', other)    # '_' only in the name, never the namespace
    bindings = tmp_path / 'bindings'
    (bindings / 'demo_broken.json').write_bytes(b'{"pod": ')
    (bindings / 'demo_list.json').write_bytes(b'[]')
    # a write whose worker died (its pid runs no more), and one in progress right now
    (bindings / ('.demo_web-1.json.%d.tmp' % dead_pid())).write_bytes(b'{"pod": "demo/w')
    (bindings / ('.demo_web-2.json.%d.tmp' % os.getpid())).write_bytes(b'{"pod": "demo/w')
    (bindings / 'demo_old.json.corrupt').write_bytes(b'kept for the operator')
    (bindings / 'README').write_bytes(b'not a binding')

    assert store.load_all() == {'demo/web-0': BINDING, 'kube-system/dns_1x': other}
    assert listing(bindings) == ['.demo_web-2.json.%d.tmp' % os.getpid(),
                                 'README', 'demo_broken.json.corrupt',
                                 'demo_list.json.corrupt', 'demo_old.json.corrupt',
                                 'demo_web-0.json', 'kube-system_dns_1x.json']


def test_load_all_of_an_empty_store(tmp_path):
    assert state.BindingStore(str(tmp_path)).load_all() == {}


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
    # in-progress writes of the shim: never read
    live_tmp = '.1733140000000000000-%d.tmp' % os.getpid()
    queue_entry(d, live_tmp, {'CNI_CONTAINERID': 'tmp'})
    queue_entry(d, '.1733140000000000001-5.json', {'CNI_CONTAINERID': 'hidden'})
    queue_entry(d, '1733140000000000002-5.json.corrupt', {'CNI_CONTAINERID': 'old'})
    got = [(os.path.basename(p), b['CNI_CONTAINERID']) for p, b in queue.entries()]
    assert got == [('1733140000100000000-99.json', 'c1'),
                   ('1733140000200000000-12.json', 'c2'),
                   ('1733140000300000000-77.json', 'c3')]
    # reading does not consume, and the temporary files are left to their writer
    assert len(list(queue.entries())) == 3
    assert live_tmp in listing(d)
    assert '.1733140000000000001-5.json' in listing(d)


@pytest.mark.parametrize('content', [b'{"CNI_COMMAND": "DEL", ', b'[]', b'7', b'\xff'])
def test_del_queue_sets_aside_a_corrupt_entry_and_goes_on(tmp_path, content):
    queue = state.DelQueue(str(tmp_path))
    d = tmp_path / 'del-queue'
    queue_entry(d, '1-1.json', {'CNI_CONTAINERID': 'c1'})
    queue_entry(d, '2-1.json', content)
    queue_entry(d, '3-1.json', {'CNI_CONTAINERID': 'c3'})
    got = [b['CNI_CONTAINERID'] for _, b in queue.entries()]
    assert got == ['c1', 'c3']
    assert listing(d) == ['1-1.json', '2-1.json.corrupt', '3-1.json']
    assert (d / '2-1.json.corrupt').read_bytes() == content


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


def test_del_queue_set_aside(tmp_path):
    queue = state.DelQueue(str(tmp_path))
    d = tmp_path / 'del-queue'
    path = queue_entry(d, '1-1.json', {'CNI_COMMAND': 'ADD'})
    queue.set_aside(path)
    assert listing(d) == ['1-1.json.corrupt']
    assert list(queue.entries()) == []


def test_del_queue_entry_written_atomically_is_read_whole(tmp_path):
    queue = state.DelQueue(str(tmp_path))
    body = {'CNI_COMMAND': 'DEL', 'CNI_CONTAINERID': 'c1', 'config': {'x': 'y' * 100000}}
    state.write_atomically(queue.directory, '5-5.json', json.dumps(body).encode())
    assert [b for _, b in queue.entries()] == [body]


def test_del_queue_removes_what_a_killed_shim_left(tmp_path):
    queue = state.DelQueue(str(tmp_path))
    d = tmp_path / 'del-queue'
    old = queue_entry(d, '.1733140000000000000-%d.tmp' % dead_pid(), b'{"CNI_COMMAND": "D')
    an_hour_ago = os.stat(old).st_mtime - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    # Its writer's pid runs no more, but the shim may live in another pid
    # namespace: only an old file is surely abandoned.
    recent = queue_entry(d, '.1733140000200000000-%d.tmp' % dead_pid(), b'{"CNI_COMM')
    queue_entry(d, '1733140000100000000-99.json', {'CNI_CONTAINERID': 'c1'})
    assert [b['CNI_CONTAINERID'] for _, b in queue.entries()] == ['c1']
    assert listing(d) == [os.path.basename(recent), '1733140000100000000-99.json']
