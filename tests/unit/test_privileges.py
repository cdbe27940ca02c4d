"""kuryr_cni.daemon.privileges: whom the watcher and ops become, and that they stay so.

The daemon's own processes are read from /proc in
tests/functional/test_privileges.py; here the parts, in a forked child.
"""

import multiprocessing
import multiprocessing.managers
import os
import pwd

import pytest

from kuryr_cni.daemon import privileges

NOBODY = pwd.getpwnam('nobody')


def test_a_user_is_a_name_with_its_group_or_a_number():
    assert privileges.identity('nobody') == (NOBODY.pw_uid, NOBODY.pw_gid, 'nobody')
    assert privileges.identity('4242') == (4242, 4242, '4242')


@pytest.mark.parametrize('user, problem', [('root', 'is root'), ('0', 'is root'),
                                           ('no-such-user-here', 'no such user')])
def test_root_and_unknown_users_are_refused(user, problem):
    with pytest.raises(privileges.PrivilegeError, match=problem):
        privileges.identity(user)


def _drop_and_report(who, answers):
    try:
        privileges.drop(who)
        fields = privileges.status()
        try:
            os.setuid(0)
            regained = True
        except PermissionError:
            regained = False
        answers.put((privileges.dropped_problems(fields, who.uid, who.gid),
                     fields['CapBnd'], regained))
    except Exception as exc:     # reported to the test, not lost in the child
        answers.put(repr(exc))


@pytest.mark.skipif(os.geteuid() != 0, reason='needs root to drop it')
def test_a_dropped_process_has_no_privilege_left_nor_a_way_back():
    answers = multiprocessing.get_context('fork').Queue()
    child = multiprocessing.get_context('fork').Process(
        target=_drop_and_report, args=(privileges.identity('nobody'), answers))
    child.start()
    try:
        problems, bounding, regained = answers.get(timeout=30)
    finally:
        child.join(10)
    assert problems == []
    assert int(bounding, 16) == 0 or not _holds(privileges.CAP_SETPCAP)
    assert not regained


def _holds(cap):
    return bool(int(privileges.status()['CapEff'], 16) & (1 << cap))


def test_what_a_status_file_must_say_once_dropped():
    fields = {'Uid': '65534\t65534\t65534\t65534', 'Gid': '65534\t65534\t65534\t65534',
              'Groups': '', 'CapInh': '0' * 16, 'CapPrm': '0' * 16, 'CapEff': '0' * 16,
              'CapAmb': '0' * 16, 'NoNewPrivs': '1'}
    assert privileges.dropped_problems(fields, 65534, 65534) == []
    root = dict(fields, Uid='0\t0\t0\t0', CapEff='000001ffffffffff', NoNewPrivs='0',
                Groups='0 ')
    assert privileges.dropped_problems(root, 65534, 65534) == [
        'Uid 0\t0\t0\t0', 'Groups 0 ', 'CapEff 000001ffffffffff', 'NoNewPrivs 0']


class _RunsInTheUnpickler:
    """A request argument whose unpickling makes a directory: code run by the receiver."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


def test_the_registry_runs_no_code_a_request_carries(registry, tmp_path):
    """Before: the Manager (root in the daemon) made the directory while unpickling."""
    planted = tmp_path / 'ran-in-the-manager'
    with pytest.raises(multiprocessing.managers.RemoteError, match='the registry refuses '
                       'posix.mkdir in a request'):
        registry.stale_dels.record(_RunsInTheUnpickler(str(planted)))
    assert not planted.exists()
    # The connection and the Manager serve on.
    registry.stale_dels.record({'pod': 'default/web-0'})
    assert registry.stale_dels.recent() == [{'pod': 'default/web-0'}]
