"""The daemon's memory: PSS of each of its processes, from /proc/<pid>/smaps_rollup.

PSS (proportional set size) charges each page shared by ``n`` processes as
``1/n`` to each, so the sum over the daemon's processes (parent, registry
Manager, watcher, CNI workers, ops) is what the daemon as a whole costs the
node, without counting the pages a fork shares twice.
"""

KIB_PER_MIB = 1024


def pss_kib(pid):
    """PSS of process ``pid`` in KiB, or None when it is gone."""
    try:
        with open('/proc/%d/smaps_rollup' % pid) as f:
            for line in f:
                if line.startswith('Pss:'):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def role(title):
    """A process's role from its title (``kuryr-cni-daemon: cni-worker`` → cni-worker)."""
    name = title.split(':', 1)[1].strip() if ':' in title else title
    return 'parent' if name.startswith('master process') else name


def daemon_pss(host):
    """``{'total_mib', 'processes': [{pid, role, pss_mib}]}`` for the host's daemon."""
    processes = []
    for pid, title in sorted(host.processes().items()):
        kib = pss_kib(pid)
        if kib is not None:
            processes.append({'pid': pid, 'role': role(title),
                              'pss_mib': round(kib / KIB_PER_MIB, 2)})
    return {'total_mib': round(sum(p['pss_mib'] for p in processes), 2),
            'processes': processes}
