"""No Python on the node: the shim alone in a chroot, against the real daemon (issue 12).

The chroot holds nothing but the executable. The daemon's socket directory and
its state directory are bind-mounted in it at their default paths
(``/run/kuryr-cni``, ``/var/lib/kuryr-cni``), inside a private mount namespace
that each shim run makes for itself (``unshare``), so no mount outlives the
run or reaches the machine. Everything else a node might offer (an
interpreter, a libc, /proc, /dev) is absent. The runtime emulator drives it
through a wrapper that enters the chroot, as a runtime would exec the shim.
"""

import os
import shutil

import pytest

from kuryr_cni.binding import owner_tag
from tools.testbed import runtime as testruntime

from tests.functional import conftest
from tests.functional import crash
from tests.functional import helpers

TOOLS = ('unshare', 'mount', 'chroot')
MISSING = [tool for tool in TOOLS if shutil.which(tool) is None]

pytestmark = [
    pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON),
    pytest.mark.skipif(bool(MISSING), reason='%s not installed (util-linux, coreutils)'
                       % ', '.join(MISSING)),
]

SOCKET_DIR = 'run/kuryr-cni'
STATE_DIR = 'var/lib/kuryr-cni'

# $1: the daemon's socket directory, $2: its state directory, $3: the chroot.
ENTER = '''#!/bin/sh
exec unshare --mount --propagation private sh -c '
    mount --bind "$1" "$3/%s" &&
    mount --bind "$2" "$3/%s" &&
    exec chroot "$3" /kuryr-cni' - "%%s" "%%s" "%%s"
''' % (SOCKET_DIR, STATE_DIR)


def _chroot_tree(root):
    return sorted(os.path.relpath(os.path.join(path, name), root)
                  for path, dirs, files in os.walk(root) for name in dirs + files)


def _mounts_under(path):
    with open('/proc/self/mountinfo') as f:
        return [line for line in f if ' %s' % path in line]


@pytest.fixture
def chroot(daemon, tmp_path, shim_binary):
    """The chroot (its path) and a runtime whose plugin runs inside it."""
    node = daemon
    root = tmp_path / 'root'
    for mount_point in (SOCKET_DIR, STATE_DIR):
        (root / mount_point).mkdir(parents=True)
    shutil.copy2(shim_binary, root / 'kuryr-cni')
    wrapper = tmp_path / 'kuryr-cni'
    wrapper.write_text(ENTER % (os.path.dirname(node.socket), node.state_dir, root))
    wrapper.chmod(0o755)
    runtime = testruntime.Runtime('/%s/%s' % (SOCKET_DIR, os.path.basename(node.socket)),
                                  '/' + STATE_DIR, str(tmp_path / 'cni-cache'),
                                  shim=str(wrapper))
    before = _chroot_tree(root)
    yield str(root), runtime
    assert _chroot_tree(root) == before       # the shim wrote only through the mounts
    assert _mounts_under(root) == []


def test_version_add_check_del_from_a_chroot_holding_only_the_shim(daemon, chroot):
    node = daemon
    root, runtime = chroot
    assert _chroot_tree(root) == ['kuryr-cni', 'run', SOCKET_DIR, 'var', 'var/lib', STATE_DIR]

    version = runtime.version()
    assert version.ok and version.output['supportedVersions'][-1] == '1.1.0', version
    sandbox = crash.make_pod(node, 21)
    added = runtime.add(sandbox)
    assert added.ok, added
    assert node.addresses(sandbox.netns, 'eth0') == {'10.10.0.21/24'}
    assert runtime.check(sandbox).ok
    assert runtime.delete(sandbox).ok
    assert set(node.links(sandbox.netns)) == {'lo'}
    assert helpers.leftovers(node) == helpers.NOTHING


def test_del_queued_from_a_chroot_is_replayed_when_the_daemon_returns(daemon, chroot):
    node = daemon
    _root, runtime = chroot
    sandbox = crash.make_pod(node, 22)
    assert runtime.add(sandbox).ok
    host_end = owner_tag.host_ifname(sandbox.container_id, 'eth0')
    assert node.stop_daemon() == 0

    assert runtime.delete(sandbox).ok           # the shim queues it and reports success
    [entry] = crash.queue_entries(node)
    assert entry.endswith('.json')
    assert host_end in node.links()             # nobody acted on it yet

    node.start_daemon()                         # replays the queue before its socket opens
    assert crash.queue_entries(node) == []
    assert host_end not in node.links()
    assert set(node.links(sandbox.netns)) == {'lo'}
    assert helpers.leftovers(node) == helpers.NOTHING
    assert helpers.metric(node, 'kuryr_cni_queued_del_replayed_total') == 1
