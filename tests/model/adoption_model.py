"""An explicit-state model of the adoption of kuryr-daemon's devices (issue 32, item 1).

The adoption (:mod:`kuryr_cni.adoption`) landed after :mod:`tests.model.protocol`;
this models its durable steps beside it, with the same step names
(:data:`tests.model.protocol.STEPS`: each names the function that does it).
One pod; its sandbox ``K``, plugged by kuryr-daemon before the switch (its OVS
port on br-int with the VIF's iface-id and attached-mac, untagged, its veth's
pod end in K's namespace); a newer sandbox ``N`` of ours; a planted port that
names no pod's VIF. Every request holds the pod's lock for all its durable
steps (:meth:`kuryr_cni.podlock.PodLocks.hold`), so one worker runs at a time
and the others wait; what interleaves with it is the world: K's namespace
going (its veth with it: the port becomes an orphan), the daemon killed. A
worker may die after any of its steps (every durable call among them).

Workers and their plans, decided (as the code does) once the lock is held:

* ``DEL K`` (:meth:`Ownership.delete`): no binding → :meth:`Adopter.adopt_for_delete`:
  the port proven and its pod end here → ``adopt_record`` (the binding, durably),
  ``tag_foreign``, then the owner's DEL (``disconnect``: ``Finder.release``,
  ``remove``, ``release_remove``); an orphan → ``discard_orphan``; the binding
  K (a retry after a crash) → the owner's DEL; the binding N → a stale DEL.
  Before the watcher has listed the pods since the start, no binding → the
  lock only, and the DEL fails with code 11 (:meth:`CNIApp._delete`, which waits
  for the list until its deadline: a wait that ends in the list is the runtime's
  retry after it); the runtime sends it again.
* ``ADD N`` (:meth:`Ownership.add`): :meth:`Adopter.evict_foreign` (``evict_foreign``
  of the proven port), the claim (``save``), ``connect``, ``save_fast``; an
  adopted K is evicted as our own older sandbox (``disconnect``).
* ``scan`` (:meth:`Adopter.scan`, housekeeping once after each start, once the
  watcher has listed the pods): no binding, the port proven and K's namespace
  identified → ``adopt_record``, ``tag_foreign``.
* ``replay K`` (:func:`kuryr_cni.daemon.recovery.replay_queue`): the runtime's DEL K
  sent while the daemon was down, queued by the shim (answered success) and
  replayed at the restart, before the watcher's list: no binding → deferred (the
  lock only; the entry stays); else, and by housekeeping once the pods are
  listed, the plan of ``DEL K`` and then ``done`` (the entry removed).

Another pod may hold K's port (``held``): its record names the port (a hostile or
mistaken annotation) and its ADD was admitted while no pod's VIF proved
kuryr-daemon's port (:meth:`Adopter.held_elsewhere` refuses it otherwise), then lets
it go (its DEL). It takes the port only while K's pod has no binding and no worker
runs: the fence's reservation makes an adoption's check and record one step for
other pods. While it holds it, an adoption is refused: the scan leaves K's port,
``DEL K`` removes it unrecorded (``discard_beside``), ``ADD N`` is refused.

Invariants: never two pods holding K's port; a tag only on a port the binding
names (the record first);
the planted port never tagged, removed or changed; once ADD N answered, no
untagged proven port of its iface-id beside N's; after K's DEL answered and
recovery, nothing of K (port, record, temporary file, lock file of a pod
without binding) remains.
"""

import collections
import dataclasses
import resource
import time
import typing

from tests.model import protocol

SAVE = [('adopt_record', i) for i in range(len(protocol.STEPS['adopt_record'][1]))]
# This model's steps that make no durable call, by the code that takes them.
OWN_STEPS = {'try_again': 'CNIApp._delete', 'deferred': 'replay_queue'}


class St(typing.NamedTuple):
    port: str           # K's port: 'untagged' | 'tagged' | 'gone'
    pod_end: bool       # K's namespace (and the veth's pod end) still there
    planted: str        # 'untouched' (nothing may change it)
    binding: str        # the binding file: '' | 'K' | 'N'
    tmp: bool           # a binding.tmp a killed writer left
    lock: bool          # the pod's lock file exists
    ours: bool          # N's port plugged
    worker: tuple       # (name, remaining plan) of the lock holder, or ()
    del_k: str          # runtime: 'todo' | 'sent' | 'ok'
    add_n: str          # runtime: 'no' | 'sent' | 'ok'
    scanned: bool       # housekeeping's scan ran since the start
    crashes: int        # kills left
    held: bool          # another pod's binding holds K's port
    queued: bool        # the shim's queued DEL K is in the queue
    listed: bool        # the watcher has listed the pods since the start


@dataclasses.dataclass
class Bounds:
    crashes: int = 2            # worker or daemon kills
    add_n: bool = True          # a newer sandbox of the pod is added at some point
    orphan: bool = True         # K's namespace may go before its DEL
    # Each False is the code without that rule, to show the checker needs it:
    borrowed: bool = True       # another pod may hold K's port for a while
    queue: bool = True          # DEL K may come while the daemon is down (the shim queues it)
    record_first: bool = True   # Adopter._adopt saves the binding before it tags
    evict_at_add: bool = True   # Ownership.add calls Adopter.evict_foreign
    fence_at_adoption: bool = True  # Adopter._adopt asks the address fence first
    defer_until_listed: bool = True  # replay_queue keeps DEL K until the pods are listed
    fail_until_listed: bool = True   # a live DEL K fails until the pods are listed


def initial(bounds):
    return St('untagged', True, 'untouched', '', False, False, False, (), 'todo',
              'no' if bounds.add_n else 'none', False, bounds.crashes, False, False, True)


def _plan(st, name, bounds):
    """The steps the code takes once it holds the lock, from what it reads there."""
    adopt = SAVE + [('tag_foreign', 0)] if bounds.record_first else \
        [('tag_foreign', 0)] + SAVE
    refused = st.held and bounds.fence_at_adoption    # another pod holds the port
    hold_done = [('answer', 0)]
    if name == 'replay K':
        if st.binding == '' and not st.listed and bounds.defer_until_listed:
            return [('release_remove', 0), ('deferred', 0)]
        # Not the runtime's request: what it does is applied, or stays queued (above).
        own = dataclasses.replace(bounds, fail_until_listed=False)
        return [s for s in _plan(st, 'DEL K', own) if s[0] != 'answer'] + [('done', 0)]
    if name == 'DEL K':
        if st.binding == '':
            if not st.listed and bounds.fail_until_listed:
                return [('release_remove', 0), ('try_again', 0)]
            if st.port == 'untagged' and not st.listed:
                return [('release_remove', 0)] + hold_done      # no VIF: nothing proven
            if st.port == 'untagged' and st.pod_end and refused:
                return [('discard_beside', 0), ('release_remove', 0)] + hold_done
            if st.port == 'untagged' and st.pod_end:
                return adopt + [('disconnect', 0), ('remove', 0), ('release_remove', 0)] \
                    + hold_done
            if st.port == 'untagged':
                return [('discard_orphan', 0), ('release_remove', 0)] + hold_done
            return [('release_remove', 0)] + hold_done
        if st.binding == 'K':
            return [('disconnect', 0), ('remove', 0), ('release_remove', 0)] + hold_done
        return [('release', 0)] + hold_done           # stale: N owns the pod
    if name == 'ADD N':
        if st.held:                                   # the fence refuses it
            return [('release_remove', 0) if st.binding == '' else ('release', 0)]
        evict = [('evict_foreign', 0)] if st.port == 'untagged' and bounds.evict_at_add \
            else []
        if st.binding == 'K':
            evict += [('disconnect', 0)]              # K, adopted, evicted as our own
        return evict + [('save', 0), ('connect', 0), ('save_fast', 0), ('release', 0)] \
            + hold_done
    # scan
    # K identified by its running sandbox process: the runtime stops it before its DEL.
    if st.binding == '' and st.port == 'untagged' and st.pod_end and not refused \
            and st.del_k == 'todo':
        return adopt + [('release', 0), ('scanned', 0)]
    return [('release_remove', 0) if st.binding == '' else ('release', 0), ('scanned', 0)]


def _apply(st, name, step):
    """``st`` after ``name``'s worker took ``step``."""
    what, i = step
    if what == 'adopt_record':
        st = st._replace(tmp=i < 3)         # open, write, fsync tmp; then rename, fsync dir
        return st._replace(binding='K') if i >= 3 else st
    if what == 'save' or what == 'save_fast':
        return st._replace(binding='N')
    if what == 'tag_foreign':
        return st._replace(port='tagged')
    if what == 'disconnect':                # Finder.release: tagged K's or untagged
        return st._replace(port='gone', ours=False if name == 'DEL N' else st.ours)
    if what in ('evict_foreign', 'discard_orphan', 'discard_beside'):
        return st._replace(port='gone')
    if what == 'done':
        return st._replace(queued=False)
    if what == 'deferred':
        return st
    if what == 'try_again':                 # code 11: the runtime will send it again
        return st._replace(del_k='todo')
    if what == 'connect':
        return st._replace(ours=True)
    if what == 'remove':
        return st._replace(binding='')
    if what == 'release_remove':
        return st._replace(lock=False)
    if what == 'answer':
        return st._replace(**{'del_k' if name == 'DEL K' else 'add_n': 'ok'})
    if what == 'scanned':
        return st._replace(scanned=True)
    assert what == 'release'
    return st


def successors(st, bounds):
    """(action, state) pairs."""
    out = []
    if st.worker:
        name, plan = st.worker
        step, rest = plan[0], plan[1:]
        nxt = _apply(st, name, step)
        code = protocol.STEPS.get(step[0], (OWN_STEPS.get(step[0], 'Housekeeper.tick'),))[0]
        out.append(('%s: %s (%s)' % (name, step[0], code),
                    nxt._replace(worker=(name, rest) if rest else ())))
        if st.crashes:
            # Killed before this step: the lock drops, the lock file stays.
            out.append(('kill %s before %s' % (name, step[0]),
                        st._replace(worker=(), crashes=st.crashes - 1)))
    else:
        # A request or the scan takes the lock (hold: open, flock) and decides.
        # The socket opens before the watcher's list, so a DEL may come first; an
        # ADD waits for its pod's VIFs, which only the list brings.
        if st.del_k in ('todo', 'sent'):
            out.append(('runtime DEL K', _start(st, 'DEL K', bounds)._replace(del_k='sent')))
        if st.add_n in ('no', 'sent') and st.listed:
            out.append(('runtime ADD N', _start(st, 'ADD N', bounds)._replace(add_n='sent')))
        if not st.listed:
            out.append(('the watcher lists the pods', st._replace(listed=True)))
        if st.queued and st.listed:
            out.append(('housekeeping: replay_queue', _start(st, 'replay K', bounds)))
        elif not st.scanned and st.listed:
            out.append(('housekeeping: Adopter.scan', _start(st, 'scan', bounds)))
        if st.crashes and st.scanned:
            out.append(('restart daemon (recovery: remove_temporaries)',
                        _restarted(st)._replace(crashes=st.crashes - 1)))
        if bounds.queue and st.del_k == 'todo':
            # Down meanwhile: the shim answers success; the restart replays it.
            out.append(('runtime DEL K, queued by the shim; restart (recovery: replay_queue)',
                        _start(_restarted(st)._replace(del_k='ok', queued=True),
                               'replay K', bounds)))
        if bounds.borrowed and not st.held and st.binding == '' and st.port == 'untagged':
            out.append(("another pod's ADD takes K's port", st._replace(held=True)))
    if st.held:
        out.append(("the other pod lets K's port go (its DEL)", st._replace(held=False)))
    if bounds.orphan and st.pod_end and st.del_k != 'ok':
        out.append(("K's namespace goes (its veth with it)", st._replace(pod_end=False)))
    return out


def _restarted(st):
    return st._replace(tmp=False, scanned=False, listed=False)


def _start(st, name, bounds):
    return st._replace(lock=True, worker=(name, tuple(_plan(st, name, bounds))))


def check_state(st):
    problems = []
    if st.held and st.binding == 'K':
        problems.append("two pods hold K's port")
    if st.port == 'tagged' and st.binding != 'K' and not st.worker:
        problems.append('a tagged port no binding names (its adopter died)')
    if st.planted != 'untouched':
        problems.append('the planted port was changed')
    if st.add_n == 'ok' and st.port == 'untagged':
        problems.append("ADD N answered, kuryr-daemon's port of its iface-id still on br-int")
    return problems


def check_end(st):
    """The runtime is done and nothing runs: healed (restart, housekeeping), check K."""
    st = st._replace(tmp=False)             # recovery's remove_temporaries
    if st.binding == '' and st.lock:
        st = st._replace(lock=False)        # housekeeping's remove_unused
    left = []
    if st.port != 'gone':
        left.append("K's port (%s)" % st.port)
    if st.binding == 'K':
        left.append("K's record")
    if st.tmp or (st.lock and st.binding == ''):
        left.append('a temporary or lock file')
    return left


@dataclasses.dataclass
class Result:
    states: int
    transitions: int
    ends: int
    seconds: float
    cpu_seconds: float
    violation: str = None
    trace: list = None


def explore(bounds=None):
    """Breadth first, every reachable state once; the first violation with its trace."""
    bounds = bounds or Bounds()
    started, cpu = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF).ru_utime
    start = initial(bounds)
    parent = {start: None}
    frontier = collections.deque([start])
    transitions = ends = 0
    violation = trace = None
    while frontier and violation is None:
        st = frontier.popleft()
        problems = check_state(st)
        nexts = successors(st, bounds)
        if not problems and not st.worker and st.del_k == 'ok' and st.add_n in ('ok', 'none') \
                and not st.queued:
            ends += 1
            left = check_end(st)
            if left:
                problems = ['after K\'s DEL answered and recovery, left: ' + ', '.join(left)]
        if problems:
            violation, trace = '; '.join(problems), _trace(parent, st)
            break
        for action, nxt in nexts:
            transitions += 1
            if nxt not in parent:
                parent[nxt] = (st, action)
                frontier.append(nxt)
    return Result(len(parent), transitions, ends, round(time.monotonic() - started, 2),
                  round(resource.getrusage(resource.RUSAGE_SELF).ru_utime - cpu, 2),
                  violation, trace)


def _trace(parent, st):
    actions = []
    while parent[st] is not None:
        st, action = parent[st]
        actions.append(action)
    return list(reversed(actions))
