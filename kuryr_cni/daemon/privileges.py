"""Privilege separation: the processes that parse untrusted input give up root.

The watcher parses whatever the API server (or whoever stands in its place)
sends, and the ops process answers HTTP on the node's network. Neither needs
root once what it uses is open, so each drops, in its main thread before its
service starts (:func:`drop`), to ``[cni_daemon] unprivileged_user``: every
capability set emptied (bounding set too, where the daemon holds
CAP_SETPCAP), no supplementary groups, and ``PR_SET_NO_NEW_PRIVS``. Only the
parent, the registry Manager and the CNI workers keep root
(doc/source/security.rst says what an exploit of each process gets).

What the dropped processes still reach, they reach through descriptors
opened before the fork, never by walking the root-only run dir:
:func:`shared_dir` makes a subdirectory of it reachable as
``/proc/self/fd/N/...`` from every daemon process and from no other
(the dropped processes are not dumpable, so no other process of their uid may
open their ``/proc/<pid>/fd``).
"""

import ctypes
import os
import pwd
import typing

from oslo_log import log as logging

PR_SET_KEEPCAPS = 8
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
CAP_CHOWN = 0
CAP_KILL = 5
CAP_SETGID = 6
CAP_SETUID = 7
CAP_SETPCAP = 8

# /proc/<pid>/status fields that must read "nothing" once dropped.
CAP_FIELDS = ('CapInh', 'CapPrm', 'CapEff', 'CapAmb')


class PrivilegeError(Exception):
    """A drop that did not, or could not, happen; the message says which part."""


class Identity(typing.NamedTuple):
    """Whom the dropped processes run as."""

    uid: int
    gid: int
    user: str


def identity(user):
    """The :class:`Identity` of ``user``, a name in the user database or a number.

    A name gets its primary group; a bare number (for images without that
    user in /etc/passwd) gets the group of the same number. Root, by any name,
    is refused.
    """
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        if not user.isdigit():
            raise PrivilegeError('[cni_daemon] unprivileged_user %r: no such user' % user) \
                from None
        uid = gid = int(user)
    else:
        uid, gid = entry.pw_uid, entry.pw_gid
    if uid == 0 or gid == 0:
        raise PrivilegeError('[cni_daemon] unprivileged_user %r is root (uid %d, gid %d)'
                             % (user, uid, gid))
    return Identity(uid, gid, user)


def check_can_drop():
    """Raise :class:`PrivilegeError` unless this process can change its uid and gid,
    give the directories the dropped processes share to their group (:func:`shared_dir`),
    and signal the dropped processes, which are no longer its uid, when it stops them.

    Checked at start so that a unit whose bounding set lacks them is refused in
    one line, not by children failing one after another, by a traceback, or (without
    CAP_KILL) by every stop failing and running into systemd's stop timeout.
    """
    effective = int(status()['CapEff'], 16)
    needed = (('CAP_SETUID', CAP_SETUID), ('CAP_SETGID', CAP_SETGID), ('CAP_CHOWN', CAP_CHOWN),
              ('CAP_KILL', CAP_KILL))
    missing = [name for name, cap in needed if not effective & (1 << cap)]
    if missing:
        raise PrivilegeError('the watcher and ops processes could not drop root and be '
                             'stopped: the daemon lacks %s (add them to the unit\'s '
                             'CapabilityBoundingSet= or the container\'s capabilities)'
                             % ' and '.join(missing))


def forbid_new_privileges():
    """``PR_SET_NO_NEW_PRIVS`` for this process and all it forks from now on.

    Set once in the parent before any thread or child exists: the flag is per
    thread, and a dropped process has threads made before its drop
    (cotyledon's). The daemon executes no program, so nothing here loses
    anything (under systemd ``NoNewPrivileges=yes`` sets it anyway).
    """
    _prctl(PR_SET_NO_NEW_PRIVS, 1)


def shared_dir(path, gid):
    """Open ``path`` (a directory the daemon made) to ``gid`` through a descriptor.

    The directory gets group ``gid`` and mode 0750: a dropped process may
    look up and read what is in it, never add or remove anything. The returned
    ``/proc/self/fd/N`` path names it in every process forked from this one,
    whatever the modes of the directories above it; the descriptor is never
    closed.
    """
    os.chown(path, 0, gid)
    os.chmod(path, 0o750)
    fd = os.open(path, os.O_PATH | os.O_DIRECTORY)
    return '/proc/self/fd/%d' % fd


def keep_log_files_open():
    """Write on to the log files already open, never reopening or rotating them.

    oslo.log's ``WatchedFileHandler`` looks its file up at every line to
    reopen it once rotated, and its size and interval handlers rename files:
    a process without root can do neither in a root-only directory (the first
    would raise at every line). Here the lookup is of the open file itself;
    rotate with ``copytruncate`` or log to the journal (doc/source/security.rst).
    """
    for handler in logging.getLogger().logger.handlers:
        if hasattr(handler, 'reopenIfNeeded'):      # WatchedFileHandler
            handler.baseFilename = '/proc/self/fd/%d' % handler.stream.fileno()
        if hasattr(handler, 'shouldRollover'):      # RotatingFileHandler, TimedRotating...
            handler.shouldRollover = lambda record: False


def drop(who):
    """Become ``who`` with no capability in any set; raise :class:`PrivilegeError` otherwise.

    Call it from the process's main thread before its service's threads
    start: they inherit the bounding set from it. Setting the uid from 0 to
    another with ``PR_SET_KEEPCAPS`` off empties the permitted, effective and
    ambient sets of every thread; the inheritable one is emptied here, and the
    result read back from ``/proc``.
    """
    _prctl(PR_SET_KEEPCAPS, 0)
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    if int(status()['CapEff'], 16) & (1 << CAP_SETPCAP):
        for cap in range(last_capability() + 1):
            _prctl(PR_CAPBSET_DROP, cap)
    os.setgroups([])
    os.setresgid(who.gid, who.gid, who.gid)
    os.setresuid(who.uid, who.uid, who.uid)
    _clear_capabilities()
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    problems = dropped_problems(status(), who.uid, who.gid)
    if problems:
        raise PrivilegeError('still privileged after the drop: %s' % '; '.join(problems))


def dropped_problems(fields, uid, gid):
    """What in ``fields`` (of a ``/proc/.../status``) is not "uid/gid only, no privilege"."""
    problems = []
    for name, want in (('Uid', uid), ('Gid', gid)):
        if fields[name].split() != [str(want)] * 4:
            problems.append('%s %s' % (name, fields[name]))
    if fields['Groups'].strip():
        problems.append('Groups %s' % fields['Groups'])
    problems.extend('%s %s' % (name, fields[name]) for name in CAP_FIELDS
                    if int(fields[name], 16))
    if fields['NoNewPrivs'] != '1':
        problems.append('NoNewPrivs %s' % fields['NoNewPrivs'])
    return problems


def status(path='/proc/thread-self/status'):
    """The fields of a ``/proc/.../status`` file, as strings."""
    with open(path) as f:
        return dict(line.rstrip('\n').split(':\t', 1) for line in f if ':\t' in line)


def last_capability():
    with open('/proc/sys/kernel/cap_last_cap') as f:
        return int(f.read())


class _CapHeader(ctypes.Structure):
    _fields_ = [('version', ctypes.c_uint32), ('pid', ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [('effective', ctypes.c_uint32), ('permitted', ctypes.c_uint32),
                ('inheritable', ctypes.c_uint32)]


def _clear_capabilities():
    """capset(2) every set of this thread to empty (lowering needs no privilege)."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc().capset(ctypes.byref(header), data) != 0:
        errno = ctypes.get_errno()
        raise PrivilegeError('capset: %s' % os.strerror(errno))


def _prctl(option, arg2=0):
    libc = _libc()
    if libc.prctl(option, ctypes.c_ulong(arg2), ctypes.c_ulong(0), ctypes.c_ulong(0),
                  ctypes.c_ulong(0)) != 0:
        errno = ctypes.get_errno()
        raise PrivilegeError('prctl(%d, %d): %s' % (option, arg2, os.strerror(errno)))


_libc_handle = None


def _libc():
    global _libc_handle
    if _libc_handle is None:
        _libc_handle = ctypes.CDLL(None, use_errno=True)
    return _libc_handle
