"""The health judgement: is the daemon alive, is it ready? From the registry alone.

Read by ``/alive`` and ``/ready`` (:mod:`kuryr_cni.daemon.ops`), by STATUS
(:mod:`kuryr_cni.daemon.api`), by the systemd notifier
(:mod:`kuryr_cni.daemon.sdnotify`) and by ``kuryr-cni-ctl status``; each
shutting-down process waits here for the CNI workers to drain. No I/O but one
registry call, ``/proc`` reads and one interface-index lookup per required
bridge.

* alive: the registry Manager answers, and at least one CNI worker's accept
  loop and the watcher process beat within ``[health] heartbeat_timeout``
  (:mod:`kuryr_cni.daemon.heartbeat`);
* ready: alive, the watcher has synced with the API server, which keeps
  within the watcher's limits (:mod:`kuryr_cni.listwatch`: a server sending
  too much, or for too long, is named here until it stops), the CNI socket
  can take work (not every serving worker has its connections at their cap,
  :mod:`kuryr_cni.daemon.server`), every bridge of ``[binding]
  required_bridges`` exists in the daemon's network namespace (kuryr-daemon
  checked its ``ovs_bridge`` before each plug; without the check a missing
  ``br-int`` showed only as failing ADDs), and the daemon is not shutting down;
* serves ADDs (what CNI STATUS answers): ready but for a saturated socket.
  A saturated socket takes a kubelet's probe out of service, but an ADD
  arriving then waits in the listen backlog until a worker takes it (the
  oldest incomplete connection makes room), and succeeds: STATUS failing
  would make the runtime stop starting pods for nothing.

Queued DELs whose replay fails are reported (``queued_dels_failing`` and a
line in ``warnings``) but fail neither probe: they are leftovers of dead
sandboxes, new pods still get their network, and a probe failing until an
operator repairs OVSDB or the kernel would take every pod of the node out
of service for one leftover, and restarting the daemon would not help.
"""

import socket
import time

DEFAULT_HEARTBEAT_TIMEOUT = 30      # [health] heartbeat_timeout, when the parent set none
SATURATED = 'CNI socket saturated'


def judge(registry):
    """Judge the daemon's health: returns a dict of facts.

    ``problems`` says in words what keeps ``alive`` or ``ready`` false.
    """
    try:
        facts = registry.status.facts()
    except (ConnectionError, EOFError, OSError):
        return {'alive': False, 'ready': False, 'serves_adds': False, 'registry': False,
                'problems': ['registry unavailable'], 'add_problems': ['registry unavailable']}
    stopping = facts.shutting_down
    # Draining workers have left their accept loops and beat no more.
    limit = None if stopping else (facts.heartbeat_timeout or DEFAULT_HEARTBEAT_TIMEOUT)
    now = time.monotonic()
    workers = _serving(facts.of_role('cni-worker'), limit, now)
    watchers = _serving(facts.of_role('watcher'), limit, now)
    problems = []
    if not workers:
        problems.append('no CNI worker serving')
    if not watchers:
        problems.append('watcher stuck or dead')
    if not facts.synced:
        problems.append('watcher not synced with the API server')
    problems.extend('API server over a limit: %s' % limit for limit in facts.api_limits)
    saturated = bool(workers) and all(('cni-worker', worker_id) in facts.saturated
                                      for worker_id in workers)
    if saturated:
        problems.append(SATURATED)
    missing = [name for name in facts.required_bridges if not interface_exists(name)]
    problems.extend('bridge %s missing' % name for name in missing)
    if stopping:
        problems.append('shutting down')
    warnings = []
    if facts.queued_dels_failing:
        warnings.append('%d queued DELs failing for up to %d s, retried with back-off '
                        '(kuryr-cni-ctl queued-dels)' % (
                            facts.queued_dels_failing,
                            now - (facts.queued_dels_failing_since or now)))
    alive = bool(workers) and bool(watchers)
    serves_adds = alive and facts.synced and not facts.api_limits and not missing and not stopping
    return {'alive': alive,
            'ready': serves_adds and not saturated,
            'serves_adds': serves_adds,
            'add_problems': [p for p in problems if p != SATURATED],
            'registry': True, 'workers': len(workers), 'watcher_synced': facts.synced,
            'api_limits': list(facts.api_limits),
            'socket_saturated': saturated, 'bridges_missing': missing,
            'shutting_down': stopping, 'problems': problems,
            'queued_dels_failing': facts.queued_dels_failing, 'warnings': warnings}


def _serving(processes, limit, now):
    """Ids of the processes that live and beat within ``limit`` s (None: live suffices)."""
    return [worker_id for worker_id, proc in processes.items()
            if proc.pid is not None and running(proc.pid)
            and (limit is None or now - proc.beat <= limit)]


def interface_exists(name):
    """Whether a network interface ``name`` exists in this process's network namespace.

    An ioctl, not netlink: the unprivileged ops process may make it, and it
    costs no library import there.
    """
    try:
        socket.if_nametoindex(name)
    except OSError:
        return False
    return True


def running(pid):
    """Whether ``pid`` runs: exists and is no zombie (exited, not yet reaped).

    During shutdown cotyledon reaps its children one after the other, so an
    exited worker may stay a zombie while its parent waits for another child.
    """
    try:
        with open('/proc/%d/stat' % pid) as f:
            state = f.read().rpartition(')')[2].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != 'Z'


def wait_for_cni_workers_to_exit(registry, timeout, poll=0.1):
    """During shutdown: return once no CNI worker process runs, or after ``timeout`` s.

    Polls the pids the workers registered: the only other way to learn of
    their exit would be to be their parent.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            workers = registry.status.facts().of_role('cni-worker')
        except (ConnectionError, EOFError, OSError):
            return
        if not any(proc.pid is not None and running(proc.pid) for proc in workers.values()):
            return
        time.sleep(poll)
