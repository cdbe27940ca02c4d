"""Which pod sandbox lives in a network namespace, read from the node's processes.

A sandbox's network namespace is held by its sandbox (pause) process, and
the runtimes name that process's cgroup after the pod and the sandbox::

    containerd, systemd driver  .../kubepods-besteffort-pod<uid_>.slice/cri-containerd-<id>.scope
    CRI-O, systemd driver       .../kubepods-burstable-pod<uid_>.slice/crio-<id>.scope
    cgroupfs driver             /kubepods/besteffort/pod<uid>/<id>

(``<uid_>``: the pod UID with ``_`` for ``-``). For containerd and CRI-O the
sandbox ID the CNI requests carry is the pause container's ID. So a
namespace is known to be sandbox ``<id>`` of pod ``<uid>`` when a process in
it sits in such a cgroup naming that pod; the pause process (``comm`` is
``pause``) is preferred, else the one started first (the sandbox process is
started before the pod's containers join its namespace). A namespace whose
processes name no sandbox (CRI-O without infra container, a runtime of other
conventions) is not identified: adoption then waits for a CNI request that
names the sandbox and its namespace (:mod:`kuryr_cni.adoption`).

The path recorded for a namespace is the runtime's bind mount of it
(``/run/netns/<name>`` for containerd and CRI-O; ``netns_dirs``) when there is
one, since that is what its CNI requests carry, else ``/proc/<pid>/ns/net``.
Only reads ``/proc`` and the netns directories.
"""

import dataclasses
import os
import re

NETNS_DIRS = ('/run/netns', '/var/run/netns')
MAX_PROCESSES = 100000       # bounds a scan of /proc
_ID = r'([0-9a-f]{64})'
_POD = re.compile(r'pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})')
_SANDBOX = re.compile(r'(?:cri-containerd-|crio-|docker-)?' + _ID + r'(?:\.scope)?\Z')


@dataclasses.dataclass
class Namespace:
    """One network namespace of the node: a path to it and the processes in it."""

    key: tuple                  # (st_dev, st_ino) of the namespace
    path: str
    pids: list = dataclasses.field(default_factory=list)


def namespaces(exclude=(), netns_dirs=NETNS_DIRS, proc='/proc'):
    """Every network namespace with a bind mount in ``netns_dirs`` or a process,
    by key; ``exclude``: paths of namespaces to leave out (the host's)."""
    skip = {_key(path) for path in exclude} - {None}
    found = {}
    for directory in netns_dirs:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            path = os.path.join(directory, name)
            key = _key(path)
            if key is not None and key not in skip:
                found.setdefault(key, Namespace(key, path))
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()][:MAX_PROCESSES]
    except OSError:
        pids = []
    for pid in pids:
        path = '%s/%s/ns/net' % (proc, pid)
        key = _key(path)
        if key is None or key in skip:
            continue
        found.setdefault(key, Namespace(key, path)).pids.append(int(pid))
    return found


def sandboxes_in(namespace, proc='/proc'):
    """``{pod UID: container ID}`` of the sandboxes whose processes are in ``namespace``.

    Per pod, the pause process's sandbox (``comm`` is ``pause``) is preferred,
    else the one started first.
    """
    candidates = {}
    for pid in namespace.pids:
        found = _sandbox_in_cgroup(_read('%s/%d/cgroup' % (proc, pid)))
        if found is None:
            continue
        uid, cid = found
        comm = _read('%s/%d/comm' % (proc, pid)).strip()
        candidates.setdefault(uid, []).append((comm != 'pause', _start_time(proc, pid), cid))
    return {uid: min(found)[2] for uid, found in candidates.items()}


def _sandbox_in_cgroup(text):
    """``(pod UID, container ID)`` a cgroup file names, or None."""
    for line in text.splitlines():
        parts = line.split(':', 2)
        if len(parts) != 3:
            continue
        components = [c for c in parts[2].split('/') if c]
        if not components:
            continue
        match = _SANDBOX.match(components[-1])
        pods = [m.group(1) for c in components[:-1] for m in [_POD.search(c)] if m]
        if match and pods:
            return pods[-1].replace('_', '-'), match.group(1)
    return None


def _start_time(proc, pid):
    stat = _read('%s/%d/stat' % (proc, pid))
    try:
        return int(stat.rsplit(')', 1)[1].split()[19])
    except (IndexError, ValueError):
        return 0


def _read(path):
    try:
        with open(path, encoding='utf-8', errors='replace') as f:
            return f.read(65536)
    except OSError:
        return ''


def _key(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)
