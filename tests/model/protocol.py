"""An explicit-state model of the ownership protocol (issue 32), small enough to read.

The state is what survives or matters: the binding files (``bindings/``,
with each sandbox's attachment ``plugging`` or ``ready``), leftover temporary
files, pod lock files, the DEL queue (and what was set aside), the host
devices (a tagged veth and its OVS row: one per sandbox), the registry (the
binding mirror, ADDs in flight, their reservations, each pod's newest ADD),
the watcher's view of each pod's VIF (published, active), the runtime's
progress per sandbox, and the daemon's running requests.

Each running request is a :class:`Worker` whose ``plan`` is the list of steps
the real code takes from where it is: computed by the planners below
(:func:`plan_add`, :func:`plan_delete`, ...), which follow
:mod:`kuryr_cni.ownership` line by line, at the moment the code reads the
state it decides on (under the pod's lock nobody else changes the pod's
binding or devices, so deciding once there is what the code does). One
transition executes one step; a worker, the whole daemon or a shim can be
killed between any two. Steps are named as the code names them
(:data:`STEPS` maps each to its function and its filesystem calls).

Two variants: ``2c4a2fa`` (replay sets a queued DEL aside on a non-retryable
error; ``_plug`` drops the ``plugging`` record whatever the rollback did) and
``fixed``, with each of :data:`FIXES` (the entry is kept and retried; the
record is kept until the rollback completed; the owner's DEL removes tagged
devices it has no record of; housekeeping removes lock files of pods with no
binding; a DEL cancels its sandbox's ADDs in flight, ``cancel_adds``, which
``admit_add`` and ``add_look`` check). The explorer may store a state and
its renamings as one (:meth:`Model._symmetry` says when that is sound). The
invariants are at the end (:func:`check_state`, :func:`check_step`,
:func:`check_quiescent`).
"""

import dataclasses
import itertools
import typing

VARIANTS = ('2c4a2fa', 'fixed')

# What the ``fixed`` variant changes in 2c4a2fa, each on its own (``Bounds.without``
# leaves one out, to show the checker needs it).
FIXES = {
    'replay_keeps_entry': 'replay_queue keeps a queued DEL that failed, whatever the error '
                          '(issue 31 hole 2)',
    'plug_keeps_record': '_plug keeps the plugging record when _connect_all\'s rollback '
                         'failed (issue 31 hole 5)',
    'owner_del_removes_tagged': 'the owner\'s DEL removes its tagged devices when it has no '
                                'record of them (issue 31 hole 5)',
    'tick_removes_orphan_locks': 'Housekeeper.tick removes the free lock files of pods '
                                 'with no binding (found by this model: a GC killed in its '
                                 'hold, or a DEL finding no binding whose _remove_tagged '
                                 'failed, leaves one for good)',
    'del_cancels_adds': 'a DEL marks its sandbox\'s ADDs in flight cancelled before it looks '
                        'for the binding (BindingTable.cancel_adds), and an ADD so marked '
                        'claims nothing (admit_add) and stops waiting for its VIFs (add_look) '
                        '(found by the real-code state machine: the ADD of a sandbox the '
                        'runtime had given up on and deleted plugged it afterwards)',
}

# What each step is in the real code, and the filesystem calls it makes, in
# order (the calls a crash can fall between). ``save`` is write_atomically
# with fsyncs; ``save_fast`` the ``durable=False`` write of a completed ADD.
STEPS = {
    'add_started': ('registry.BindingTable.add_started', ()),
    'hold': ('podlock.PodLocks.hold', (('open', 'lock'), ('flock', 'lock'))),
    'admit_add': ('registry.BindingTable.admit_add', ()),
    'add_look': ('registry.BindingTable.add_look', ()),
    'cancel_adds': ('registry.BindingTable.cancel_adds', ()),
    'save': ('state.BindingStore.save', (('open', 'binding.tmp'), ('write', 'binding.tmp'),
                                         ('fsync', 'binding.tmp'), ('rename', 'binding'),
                                         ('fsync', 'bindings/'))),
    'save_fast': ('state.BindingStore.save(durable=False)',
                  (('open', 'binding.tmp'), ('write', 'binding.tmp'), ('rename', 'binding'))),
    'mirror_put': ('registry.BindingTable.put', ()),
    'mirror_drop': ('registry.BindingTable.drop', ()),
    'remove': ('state.BindingStore.remove', (('unlink', 'binding'), ('fsync', 'bindings/'))),
    'release': ('podlock.PodLocks.hold (exit)', ()),
    'release_remove': ('podlock.PodLocks.hold (exit, remove_lock)', (('unlink', 'lock'),)),
    'connect': ('kernel.Kernel.connect', ()),
    'disconnect': ('kernel.Kernel.disconnect', ()),
    'remove_tagged': ('kernel.Kernel.remove_tagged', ()),
    'add_finished': ('registry.BindingTable.add_finished', ()),
    'answer': ('daemon.api.CNIHandler (the HTTP answer)', ()),
    'queue_del': ('shim queue.go queueDel', (('open', 'queue.tmp'), ('write', 'queue.tmp'),
                                             ('fsync', 'queue.tmp'), ('rename', 'queue entry'),
                                             ('fsync', 'del-queue/'))),
    'done': ('state.DelQueue.done', (('unlink', 'queue entry'),)),
    'set_aside': ('state.DelQueue.set_aside', (('rename', 'queue entry'),)),
    'remove_temporaries': ('state.BindingStore.remove_temporaries', (('unlink', 'tmp'),)),
    'restore_mirror': ('daemon.recovery.restore (BindingStore.load_all, BindingTable.replace)',
                       ()),
    'replay': ('daemon.recovery.replay_queue (DelQueue.entries)', ()),
    'resync_mirror': ('daemon.recovery.resync_mirror', ()),
    # Housekeeper.tick calls it, and so does recovery.restore before the socket opens:
    # the model has housekeeping only, which may run right after the restart, before
    # any request, as the restore's call does; or later.
    'remove_orphan_locks': ('podlock.PodLocks.remove_unused',
                            (('flock', 'lock'), ('unlink', 'lock'))),
    'up': ('daemon.main (the socket opens)', ()),
    # The adoption of kuryr-daemon's devices (kuryr_cni.adoption): the record first,
    # durable, then the tags; a crash between leaves a record naming untagged devices,
    # which Finder.release removes as the record's (its tag check lets untagged ones go).
    'find_foreign': ('kernel.Kernel.find_foreign (Adopter.adopt_for_delete, '
                     'Adopter.evict_foreign, Adopter._scan_pod)', ()),
    'adopt_record': ('adoption.Adopter._adopt (save before any tag)',
                     (('open', 'binding.tmp'), ('write', 'binding.tmp'), ('fsync', 'binding.tmp'),
                      ('rename', 'binding'), ('fsync', 'bindings/'))),
    'tag_foreign': ('kernel.Kernel.tag_foreign (Adopter._adopt)', ()),
    'evict_foreign': ('kernel.Kernel.discard_foreign (Adopter.evict_foreign)', ()),
    'discard_orphan': ('kernel.Kernel.discard_foreign (Adopter.adopt_for_delete, orphan)', ()),
    # Another pod of the node holds the port: the DEL of the sandbox kuryr-daemon
    # plugged removes its proven devices unrecorded, as an orphan's.
    'discard_beside': ('kernel.Kernel.discard_foreign (Adopter.adopt_for_delete, '
                       'address_taken)', ()),
    'scan': ('adoption.Adopter.scan (Housekeeper.tick, once synced)', ()),
}

KERNEL_STEPS = ('connect', 'disconnect', 'remove_tagged', 'tag_foreign', 'evict_foreign',
                'discard_orphan', 'discard_beside')

# Transitions that are not a worker's step, and the code (or world) they stand for.
EVENTS = {
    'runtime ADD': 'containerd RunPodSandbox: the shim posts /addNetwork',
    'runtime DEL': 'containerd StopPodSandbox / RunPodSandbox cleanup: the shim posts /delNetwork',
    'runtime GC': 'the runtime posts /gc (Ownership.stale_attachments, collect)',
    'shim queueIfUnanswered': 'shim: the daemon did not answer a DEL: queue it, answer success',
    'shim times out': 'shim: the DEL outlived its timeout while the daemon works on it',
    'runtime gives up on ADD': 'the shim\'s timeout, or containerd cancelling RunPodSandbox '
                               '(killing the shim): the runtime sees the ADD fail and DELs '
                               'the sandbox while the daemon\'s worker goes on',
    'watcher publishes VIF': 'kuryr-controller annotates the pod; ListWatch puts its record',
    'neutron activates VIF': 'Neutron marks the port ACTIVE once its host side exists',
    'kill worker': 'a CNI worker SIGKILLed (cotyledon starts another; resync requested)',
    'kill daemon': 'the whole daemon killed (registry and every worker gone)',
    'restart daemon': 'systemd starts the daemon: recovery.restore before the socket opens',
    'housekeeping.tick': 'Housekeeper.tick: resync_mirror, remove_temporaries, replay_queue',
    'reservation expires': 'an ADD whose worker died: its reservation and in-flight mark age out',
    'kernel refuses': 'OVSDB or the kernel starts refusing (a failover): kernel calls raise',
    'kernel heals': 'the refusal ends',
}

# The stages a worker waits in, with the code that waits.
WAITS = {
    'wait_vifs': 'ownership.Ownership._wait',
    'hold': 'podlock.PodLocks._acquire',
    'wait_active': 'ownership.Ownership._wait_active',
}

# The planners, and the code each follows.
PLANNERS = {
    'Model.plan_add': ('ownership.Ownership._claim_and_plug', 'ownership.Ownership._admit',
                       'ownership.Ownership._claim', 'ownership.Ownership._evict_others',
                       'ownership.Ownership._plug', 'ownership.Ownership._connect_all'),
    'Model.plan_delete': ('ownership.Ownership.delete', 'ownership.Ownership._judge_delete',
                          'ownership.Ownership.collect', 'ownership.Ownership._forget',
                          'ownership.Ownership._unplug_sandbox'),
    'Model._answer': ('daemon.recovery.replay_queue',),
    'Model._resync': ('daemon.recovery.resync_mirror',),
    'Model._chore': ('daemon.recovery.restore', 'daemon.housekeeping.Housekeeper.tick'),
}


@dataclasses.dataclass(frozen=True)
class Pod:
    name: str
    port: str                   # its Neutron port; two pods share one when it is recycled
    incarnations: tuple         # per sandbox, the pod's UID it is started for


@dataclasses.dataclass(frozen=True)
class Bounds:
    pods: tuple
    dels_per_sandbox: int = 2   # kubelet sends 4-5; 2 shows a repeated DEL
    disruptions: int = 1        # worker kills, daemon kills, shim kills and timeouts per run
    refusals: int = 1           # windows in which the kernel refuses
    gcs: int = 0                # GC requests per run
    variant: str = 'fixed'
    without: frozenset = frozenset()    # FIXES the fixed variant leaves out


class Worker(typing.NamedTuple):
    job: str        # ADD, DEL, GC, SHIM, RECOVERY, HOUSEKEEPING
    sid: str        # the sandbox its request is for ('' for the chores)
    stage: str      # 'run' (execute plan[0]) or one of WAITS
    plan: tuple     # the steps left
    via_shim: bool  # a runtime waits for its answer
    holds: int      # the pod whose lock it holds, or -1
    # ADD: ('active',) when the VIFs were active at its first look;
    # replay: the queue entries left (the first is being replayed).
    note: tuple


class State(typing.NamedTuple):
    daemon: str             # up, down, starting
    bindings: tuple         # per pod: None or (owner, ((sid, '' | plugging | ready), ...))
    mirror: tuple           # per pod: None or (owner, holds addresses)
    locks: frozenset        # pods whose lock file exists
    tmp: frozenset          # leftover temporary files: ('bindings', pod) or ('del-queue', sid)
    queue: tuple            # queued DELs (their sandbox), oldest first
    set_aside: frozenset    # queued DELs moved to *.corrupt-*
    devices: frozenset      # sandboxes whose tagged host device (and OVS row) exists
    adds: frozenset         # registry: ADDs in flight (a dead worker's until it ages out)
    cancelled: frozenset    # registry: those of them a DEL of their sandbox cancelled
    reserved: frozenset     # registry: sandboxes whose ADD holds an address reservation
    newest: tuple           # registry: per pod, the sandbox of its newest ADD, or ''
    vifs: tuple             # watcher: per pod (incarnation, published, active)
    workers: tuple          # the running requests and chores, sorted
    runtime: tuple          # per sandbox (add: ''|sent|ok|failed, DELs left, busy, DEL sent)
    resync: bool            # a CNI worker died: resync_mirror asked for
    budget: tuple           # (disruptions, refusals, gcs) left
    refusing: bool          # the kernel refuses now


class Model:
    """The transitions of one bounded configuration."""

    def __init__(self, bounds):
        assert bounds.variant in VARIANTS
        self.bounds = bounds
        assert bounds.without <= set(FIXES)
        self.fixes = set(FIXES) - bounds.without if bounds.variant == 'fixed' else set()
        self.sandboxes = []     # sid, in runtime order
        self.pod_of = {}
        self.incarnation = {}
        self.previous = {}      # sid -> the pod's sandbox before it, or None
        for p, pod in enumerate(bounds.pods):
            before = None
            for i, inc in enumerate(pod.incarnations):
                sid = '%s%d' % (pod.name, i + 1)
                self.sandboxes.append(sid)
                self.pod_of[sid], self.incarnation[sid], self.previous[sid] = p, inc, before
                before = sid
        self.index = {sid: i for i, sid in enumerate(self.sandboxes)}
        self.ports = [pod.port for pod in bounds.pods]
        self.renamings = self._symmetry()

    def _symmetry(self):
        """The renamings of pods (and with each its sandboxes, in order) that map every
        behaviour of the model to one of its behaviours: the explorer stores a state
        and its renamings as one.

        Two pods are interchangeable when they have the same incarnations and each
        has a port of its own. Nothing then tells them apart: every transition and
        check treats each pod, and each sandbox by its pod and place, alike. A pod
        sharing a port is not: the second (in order) starts only once the first is
        deleted (:meth:`_port_free`). Sandboxes of one pod are never interchangeable:
        the runtime starts them one after the other. Renaming changes the order in
        which successors are listed (workers are sorted by name), not which exist.
        """
        pods = self.bounds.pods
        alike = [p for p, pod in enumerate(pods) if self.ports.count(pod.port) == 1]
        groups = {}
        for p in alike:
            groups.setdefault(pods[p].incarnations, []).append(p)
        renamings = [tuple(range(len(pods)))]
        for group in groups.values():
            renamings = [_permuted(perm, group, order) for perm in renamings
                         for order in itertools.permutations(group)]
        return [self._renaming(perm) for perm in renamings[1:]]

    def _renaming(self, perm):
        """``perm`` (pod p becomes pod perm[p]) as a function of states."""
        names = {sid: '%s%d' % (self.bounds.pods[perm[self.pod_of[sid]]].name, self._place(sid))
                 for sid in self.sandboxes}
        inverse = [perm.index(p) for p in range(len(perm))]
        slots = [self.index[names[sid]] for sid in self.sandboxes]
        unslot = [slots.index(k) for k in range(len(slots))]
        return _Renaming(perm, inverse, names, unslot)

    def _place(self, sid):
        p = self.pod_of[sid]
        return [s for s in self.sandboxes if self.pod_of[s] == p].index(sid) + 1

    def canonical(self, st):
        """``st`` as the explorer stores it: of it and its renamings, the one whose
        hash is least (see :meth:`_symmetry`)."""
        if not self.renamings:
            return st
        return min([st] + [rename(st) for rename in self.renamings], key=hash)

    def initial(self):
        n = len(self.bounds.pods)
        b = self.bounds
        return State(
            daemon='up', bindings=(None,) * n, mirror=(None,) * n, locks=frozenset(),
            tmp=frozenset(), queue=(), set_aside=frozenset(), devices=frozenset(),
            adds=frozenset(), cancelled=frozenset(), reserved=frozenset(), newest=('',) * n,
            vifs=tuple((pod.incarnations[0], False, False) for pod in b.pods),
            workers=(), runtime=(('', b.dels_per_sandbox, False, False),) * len(self.sandboxes),
            resync=False, budget=(b.disruptions, b.refusals, b.gcs), refusing=False)

    # Planners: what the code does from the point where it decides ----------------

    def plan_add(self, st, sid, note):
        """Ownership._claim_and_plug after the lock: _admit, _claim, _evict_others, _plug."""
        p = self.pod_of[sid]
        owner, sbs = _unpack(st.bindings[p])
        refused = (('release_remove' if not sbs else 'release', p), ('add_finished', sid),
                   ('answer', 'error'))
        if sid in st.cancelled:
            return refused, False       # deleted meanwhile: admit_add says so first
        newest = st.newest[p]
        if newest not in ('', sid):
            return refused, False       # superseded by a newer sandbox's ADD
        if self._address_taken(st, p):
            return refused, False       # AddressTaken, code 7
        unwind = (('release', p), ('add_finished', sid), ('answer', 'error'))
        plan = []
        evicting = len(sbs) > (sid in sbs)
        sbs.setdefault(sid, '')
        if owner != sid:
            owner = sid
            if evicting:
                plan += _save(p, owner, sbs)
        for other in sorted(s for s in sbs if s != sid):
            if sbs[other]:
                plan.append(('disconnect', other, unwind))
            del sbs[other]
            plan += _save(p, owner, sbs)
        sbs[sid] = 'plugging'
        plan += _save(p, owner, sbs)
        without = dict(sbs, **{sid: ''})
        dropped = (*_save(p, owner, without), *unwind)
        # _connect_all's rollback; 2c4a2fa drops the record even when it failed.
        kept = unwind if 'plug_keeps_record' in self.fixes else dropped
        plan.append(('connect', sid, (('disconnect', sid, kept), *dropped)))
        sbs[sid] = 'ready'
        plan.append(('save_fast', p, _pack(owner, sbs)))
        plan.append(('release', p))
        if note:
            plan += [('add_finished', sid), ('answer', 'ok')]
        else:
            plan.append(('wait_active',))
        return tuple(plan), True

    def plan_delete(self, st, sid, gc=False):
        """Ownership.delete (or collect) after the lock: _judge_delete and _forget."""
        p = self.pod_of[sid]
        unwind = (('release', p), ('answer', 'error'))
        if st.bindings[p] is None:
            if gc:
                return (('release_remove', p), ('answer', 'noop'))
            # The lock file's removal is asked for only after _remove_tagged: when
            # that fails the file stays.
            return (('remove_tagged', sid, unwind), ('release_remove', p), ('answer', 'noop'))
        owner, sbs = _unpack(st.bindings[p])
        if gc:
            if not sbs.get(sid):
                return (('release', p), ('answer', 'noop'))
            if sid in st.adds:
                return (('release', p), ('answer', 'spared'))
        plan = []
        if owner == sid:
            if sbs[sid]:
                plan.append(('disconnect', sid, unwind))
            elif 'owner_del_removes_tagged' in self.fixes:
                plan.append(('remove_tagged', sid, unwind))
            # One attachment per sandbox: its last gone, every sandbox goes.
            plan += [('disconnect', o, unwind) for o in sorted(sbs) if o != sid and sbs[o]]
            sbs, outcome = {}, 'success'
        elif sid in sbs:
            if sbs[sid]:
                plan.append(('disconnect', sid, unwind))
            del sbs[sid]
            plan += _save(p, owner, sbs)
            outcome = 'success' if owner is None else 'stale'
        else:
            plan.append(('remove_tagged', sid, unwind))
            outcome = 'noop' if owner is None else 'stale'
        if not sbs:
            plan += [('remove', p), ('mirror_drop', p), ('release_remove', p)]
        else:
            plan.append(('release', p))
        plan.append(('answer', outcome))
        return tuple(plan)

    def _address_taken(self, st, p):
        port = self.ports[p]
        for q, summary in enumerate(st.mirror):
            if q != p and self.ports[q] == port and summary is not None and summary[1]:
                return True
        return any(self.pod_of[s] != p and self.ports[self.pod_of[s]] == port
                   for s in st.reserved)

    # Transitions ---------------------------------------------------------------------

    def successors(self, st, healing=False):
        """``(action, next state, worker or None)`` of every transition enabled in ``st``;
        ``healing``: no runtime, no faults, no watcher (see :func:`heal`)."""
        out = []
        for i, w in enumerate(st.workers):
            out += [(action, nxt, w) for action, nxt in self._worker_steps(st, i, w)]
        if not healing:
            out += [(action, nxt, None) for action, nxt in self._runtime(st) + self._faults(st)]
        out += [(action, nxt, None) for action, nxt in self._world(st, healing)]
        return out

    def _worker_steps(self, st, i, w):
        name = '%s %s' % (w.job, w.sid) if w.sid else w.job
        st = st._replace(workers=st.workers[:i] + st.workers[i + 1:])
        if w.stage == 'run':
            if not w.plan:      # a chore between two queue entries
                return [(name + ': replay_queue next', self._next_entry(st, w))]
            label, step = [], None
            # A step that is not durable and only ends what the step before it did
            # (releasing the flock, answering after add_finished) runs with it: a
            # kill between the two leaves what a kill before the first leaves.
            while w is not None and w.stage == 'run' and w.plan and (
                    step is None or _joins(step, w.plan[0])):
                step = w.plan[0]
                label.append(_step_name(step))
                st, w = self._execute(st, w._replace(plan=w.plan[1:]), step)
            return [('%s: %s' % (name, ', '.join(label)), _put(st, st.workers, w))]
        p = self.pod_of[w.sid]
        failed = (('add_finished', w.sid), ('answer', 'error'))
        if w.stage == 'wait_vifs':
            inc, published, active = st.vifs[p]
            if w.sid in st.cancelled:
                return [(name + ': _wait ends, add_look: deleted',
                         _put(st, st.workers, w._replace(stage='run', plan=failed)))]
            if inc == self.incarnation[w.sid] and published:
                w = w._replace(stage='hold', note=('active',) if active else ())
                if any(o.holds == p for o in st.workers):
                    return [(name + ': _wait(published) returns', _put(st, st.workers, w))]
                name += ': _wait(published) returns;'     # and takes the free lock at once
            else:
                return [(name + ': _wait(published) times out',
                         _put(st, st.workers, w._replace(stage='run', plan=failed)))]
        if w.stage == 'hold':
            if any(o.holds == p for o in st.workers):
                fail = failed if w.job == 'ADD' else (('answer', 'error:retry'),)
                return [(name + ': locks.hold times out',
                         _put(st, st.workers, w._replace(stage='run', plan=fail)))]
            st = st._replace(locks=st.locks | {p})
            if w.job != 'ADD':
                plan = self.plan_delete(st, w.sid, w.job == 'GC')
                return [('%s%s locks.hold' % (name, '' if name.endswith(';') else ':'),
                         _put(st, st.workers, w._replace(stage='run', holds=p, plan=plan)))]
            # _admit's registry call comes first in the hold: a kill between the two
            # leaves the lock file, as a kill after it does once the reservation ages out.
            plan, admitted = self.plan_add(st, w.sid, w.note)
            if admitted:
                st = st._replace(reserved=st.reserved | {w.sid})
            return [('%s%s locks.hold, _admit (%s)' % (
                name, '' if name.endswith(';') else ':', 'admitted' if admitted else 'refused'),
                     _put(st, st.workers, w._replace(stage='run', holds=p, plan=plan)))]
        assert w.stage == 'wait_active'
        inc, _published, active = st.vifs[p]
        summary = st.mirror[p]
        if summary is None or summary[0] != w.sid:
            what, plan = 'no longer the owner', failed
        elif active and inc == self.incarnation[w.sid]:
            what, plan = 'returns', (('add_finished', w.sid), ('answer', 'ok'))
        else:
            what, plan = 'times out', failed
        return [('%s: _wait_active %s' % (name, what),
                 _put(st, st.workers, w._replace(stage='run', plan=plan)))]

    def _execute(self, st, w, step):
        """One step of worker ``w`` (not in ``st.workers``): ``(state, worker or None)``."""
        kind = step[0]
        if kind in KERNEL_STEPS:
            sid = step[1]
            if st.refusing:
                devices = st.devices | {sid} if kind == 'connect' else st.devices
                return st._replace(devices=devices), w._replace(plan=step[2])
            devices = st.devices | {sid} if kind == 'connect' else st.devices - {sid}
            return st._replace(devices=devices), w
        if kind in ('save', 'save_fast'):
            return st._replace(bindings=_set(st.bindings, step[1], step[2])), w
        if kind == 'mirror_put':
            return st._replace(mirror=_set(st.mirror, step[1], step[2])), w
        if kind == 'mirror_drop':
            return st._replace(mirror=_set(st.mirror, step[1], None)), w
        if kind == 'remove':
            return st._replace(bindings=_set(st.bindings, step[1], None)), w
        if kind == 'release':
            return st, w._replace(holds=-1)
        if kind == 'release_remove':
            return st._replace(locks=st.locks - {step[1]}), w._replace(holds=-1)
        if kind == 'add_finished':
            return _add_ended(st, step[1]), w
        if kind == 'cancel_adds':
            return (st._replace(cancelled=st.cancelled | (st.adds & {step[1]})),
                    w._replace(stage='hold'))
        if kind == 'wait_active':
            return st, w._replace(stage='wait_active')
        if kind == 'answer':
            return self._answer(st, w, step[1])
        if kind == 'queue_del':
            return st._replace(queue=st.queue + (w.sid,)), w
        if kind == 'done':
            return st._replace(queue=_without(st.queue, step[1])), w
        if kind == 'set_aside':
            return st._replace(queue=_without(st.queue, step[1]),
                               set_aside=st.set_aside | {step[1]}), w
        if kind == 'remove_temporaries':
            keep = {t for t in st.tmp if t[0] == 'del-queue'} if step[1] == 'bindings' else ()
            return st._replace(tmp=frozenset(keep)), w
        if kind == 'restore_mirror':
            return st._replace(mirror=tuple(_summary(b) for b in st.bindings)), w
        if kind == 'remove_orphan_locks':
            return st._replace(locks=st.locks - self._orphan_locks(st)), w
        if kind == 'resync_mirror':
            return self._resync(st), w
        if kind == 'replay':
            return st, w._replace(note=st.queue, plan=())
        if kind == 'up':
            return st._replace(daemon='up'), None
        raise AssertionError(step)

    def _resync(self, st):
        """recovery.resync_mirror: each pod whose lock is free, mirror := file."""
        mirror, locks = list(st.mirror), set(st.locks)
        for p, binding in enumerate(st.bindings):
            if any(o.holds == p for o in st.workers) or (binding is None and mirror[p] is None):
                continue
            if binding is None:
                locks.discard(p)
            mirror[p] = _summary(binding)
        return st._replace(mirror=tuple(mirror), locks=frozenset(locks), resync=False)

    def _answer(self, st, w, outcome):
        if w.job in ('RECOVERY', 'HOUSEKEEPING'):
            # The outcome of the queued DEL being replayed (recovery.replay_queue).
            entry = w.note[0]
            if outcome == 'error:retry' or (outcome == 'error'
                                            and 'replay_keeps_entry' in self.fixes):
                after = ()      # kept for the next replay
            elif outcome == 'error':
                after = (('set_aside', entry),)     # BindingFailed: retry is False
            else:
                after = (('done', entry),)
            return st, w._replace(stage='run', sid='', plan=after, note=w.note[1:])
        if not w.via_shim:
            return st, None
        k = self.index[w.sid]
        add, left, _busy, sent = st.runtime[k]
        if w.job == 'ADD':
            entry = ('ok' if outcome == 'ok' else 'failed', left, False, sent)
        elif outcome.startswith('error'):
            entry = (add, left, False, sent)        # the runtime will send it again
        else:
            entry = (add, left - 1, False, sent)
        return st._replace(runtime=_set(st.runtime, k, entry)), None

    def _next_entry(self, st, w):
        """replay_queue: the next complete entry, or the chore's end."""
        entries = tuple(e for e in w.note if e in st.queue)
        if not entries:
            if w.job == 'RECOVERY':
                return _put(st, st.workers, w._replace(plan=(('up',),), note=()))
            return st
        return _put(st, st.workers, w._replace(sid=entries[0], note=entries,
                                               **self._del_starts(st, entries[0])))

    def _del_starts(self, st, sid):
        """Where Ownership.delete starts: cancel_adds, then the lock. Without the fix, or
        when no worker runs an ADD of the sandbox, the lock at once: the mark is read
        by that ADD only, and the runtime sends no ADD of a sandbox after its DEL (a
        dead ADD's registration, until it ages out, is read by no one), so the step
        would change nothing anyone sees, and leaving it out spares a state per DEL."""
        if 'del_cancels_adds' in self.fixes and any(
                w.job == 'ADD' and w.sid == sid for w in st.workers):
            return dict(stage='run', plan=(('cancel_adds', sid),))
        return dict(stage='hold', plan=())

    def _runtime(self, st):
        out = []
        b = self.bounds
        for k, sid in enumerate(self.sandboxes):
            add, left, busy, sent = st.runtime[k]
            p = self.pod_of[sid]
            if busy:
                continue
            if add == '':
                before = self.previous[sid]
                if before is not None:
                    # kubelet (node.rst): a new sandbox of the same pod only once the
                    # old one's ADD ended and its first DEL was answered (containerd's
                    # cleanup of a failed RunPodSandbox, or StopPodSandbox); later DELs
                    # of it may come at any time. A re-created pod's first sandbox
                    # may start while the old incarnation's ADD still runs.
                    prev_add, prev_left, _, _ = st.runtime[self.index[before]]
                    if self.incarnation[before] == self.incarnation[sid]:
                        ready = prev_add in ('ok', 'failed') and prev_left < b.dels_per_sandbox
                    else:
                        ready = prev_add != ''
                    if not ready:
                        continue
                elif not self._port_free(st, p):
                    # A pod given a recycled port exists (and is started) only once
                    # the port's old pod was deleted; its ADD before that would
                    # only wait, touching nothing of the old pod's.
                    continue
                st2 = st
                if st.vifs[p][0] != self.incarnation[sid]:      # the pod was re-created
                    st2 = st._replace(vifs=_set(st.vifs, p, (self.incarnation[sid], False, False)))
                if st.daemon == 'up':     # its first call, add_started, registers it
                    w = Worker('ADD', sid, 'wait_vifs', (), True, -1, ())
                    st2 = st2._replace(runtime=_set(st.runtime, k, ('sent', left, True, sent)),
                                       adds=st.adds | {sid}, newest=_set(st.newest, p, sid))
                    st2 = _put(st2, st.workers, w)
                else:   # the socket is not open: code 11
                    st2 = st2._replace(runtime=_set(st.runtime, k, ('failed', left, False, sent)))
                how = ', add_started' if st.daemon == 'up' else ': daemon away, code 11'
                out.append(('runtime ADD %s%s' % (sid, how), st2))
            elif add in ('ok', 'failed') and left > 0:
                runtime = _set(st.runtime, k, (add, left, True, True))
                if st.daemon == 'up':
                    w = Worker(job='DEL', sid=sid, via_shim=True, holds=-1, note=(),
                               **self._del_starts(st, sid))
                else:
                    w = Worker('SHIM', sid, 'run', (('queue_del',), ('answer', 'success')),
                               True, -1, ())
                out.append(('runtime DEL %s' % sid, _put(st._replace(runtime=runtime),
                                                         st.workers, w)))
            if add in ('ok', 'failed') and st.budget[2] and st.daemon == 'up' and sent:
                budget = (st.budget[0], st.budget[1], st.budget[2] - 1)
                w = Worker('GC', sid, 'hold', (), False, -1, ())
                out.append(('runtime GC %s' % sid, _put(st._replace(budget=budget),
                                                        st.workers, w)))
        return out

    def _faults(self, st):
        out = []
        disruptions, refusals, gcs = st.budget
        # Whether the kernel refuses matters only to a kernel step: it changes only
        # when one is next (sound: the toggle commutes with every other step).
        if refusals and not st.refusing and self._kernel_next(st):
            out.append(('kernel refuses', st._replace(refusing=True,
                                                      budget=(disruptions, refusals - 1, gcs))))
        if not disruptions:
            return out
        spent = st._replace(budget=(disruptions - 1, refusals, gcs))
        for i, w in enumerate(st.workers):
            rest = st.workers[:i] + st.workers[i + 1:]
            if w.job == 'RECOVERY':
                continue            # the parent: that is 'kill daemon'
            label = '%s %s' % (w.job, w.sid) if w.sid else w.job
            for leftover in self._leftovers(w):
                out.append(('kill %s%s' % (label, ' (leaving %s)' % leftover[0] if leftover
                                           else ''), self._killed(spent, rest, w, leftover)))
            if w.job == 'ADD' and w.via_shim:
                k = self.index[w.sid]
                _add, left, _busy, sent = st.runtime[k]
                gave_up = ('failed', left, False, sent)
                failed = spent._replace(runtime=_set(spent.runtime, k, gave_up))
                out.append(('runtime gives up on ADD %s' % w.sid,
                            _put(failed, rest, w._replace(via_shim=False))))
            if w.job == 'DEL' and w.via_shim:
                shim = Worker('SHIM', w.sid, 'run', (('queue_del',), ('answer', 'success')),
                              True, -1, ())
                detached = _put(spent, rest, w._replace(via_shim=False))
                out.append(('shim times out on DEL %s' % w.sid,
                            _put(detached, detached.workers, shim)))
        if st.daemon != 'down':
            killed = spent._replace(daemon='down', mirror=(None,) * len(st.mirror),
                                    adds=frozenset(), cancelled=frozenset(),
                                    reserved=frozenset(),
                                    newest=('',) * len(st.newest), resync=False,
                                    workers=tuple(w for w in st.workers if w.job == 'SHIM'))
            for w in st.workers:
                if w.job != 'SHIM':
                    killed = self._orphaned(killed, w)
            out.append(('kill daemon', killed))
        return out

    @staticmethod
    def _leftovers(w):
        """A kill before a write's rename may leave its temporary file behind."""
        nxt = w.plan[0][0] if w.stage == 'run' and w.plan else None
        if nxt in ('save', 'save_fast'):
            return [None, ('bindings', w.plan[0][1])]
        if nxt == 'queue_del':
            return [None, ('del-queue', w.sid)]
        return [None]

    def _killed(self, st, rest, w, leftover):
        st = st._replace(workers=rest, tmp=st.tmp | {leftover} if leftover else st.tmp)
        if w.job != 'SHIM':
            st = st._replace(resync=True)
        return self._orphaned(st, w)

    def _orphaned(self, st, w):
        """The shim of a request whose worker died sees no answer."""
        if not w.via_shim:
            return st
        k = self.index[w.sid]
        add, left, _busy, sent = st.runtime[k]
        if w.job == 'ADD':
            return st._replace(runtime=_set(st.runtime, k, ('failed', left, False, sent)))
        if w.job == 'DEL':
            shim = Worker('SHIM', w.sid, 'run', (('queue_del',), ('answer', 'success')),
                          True, -1, ())
            return _put(st, st.workers, shim)
        return st._replace(runtime=_set(st.runtime, k, (add, left, False, sent)))  # SHIM

    def _world(self, st, healing):
        out = []
        # The VIF record is read only by an ADD's waits: it changes only while one of
        # the pod waits (sound: the change commutes with every other step).
        waits = {(self.pod_of[w.sid], w.stage) for w in st.workers if w.job == 'ADD'}
        for p, (inc, published, active) in enumerate(st.vifs):
            if healing:
                break
            if not published and (p, 'wait_vifs') in waits and self._port_free(st, p):
                out.append(('watcher publishes VIF of %s' % self.bounds.pods[p].name,
                            st._replace(vifs=_set(st.vifs, p, (inc, True, False)))))
            elif published and not active and (
                    (p, 'wait_vifs') in waits or (p, 'wait_active') in waits) and any(
                    self.pod_of[s] == p and self.incarnation[s] == inc for s in st.devices):
                out.append(('neutron activates VIF of %s' % self.bounds.pods[p].name,
                            st._replace(vifs=_set(st.vifs, p, (inc, True, True)))))
        if st.refusing and (healing or self._kernel_next(st)):
            out.append(('kernel heals', st._replace(refusing=False)))
        if st.daemon == 'down':
            out.append(('restart daemon: recovery.restore (remove_temporaries, load_all, '
                        'replay_queue)', self._chore(st._replace(daemon='starting'), 'RECOVERY', (
                            ('remove_temporaries', 'bindings'), ('restore_mirror',)))))
        elif st.daemon == 'up' and not any(w.job == 'HOUSEKEEPING' for w in st.workers) and (
                st.resync or st.tmp or st.queue or self._orphan_locks(st)):
            plan = ((('resync_mirror',),) if st.resync else ()) + (
                (('remove_temporaries', 'all'),) if st.tmp else ()) + (
                (('remove_orphan_locks',),) if self._orphan_locks(st) else ())
            out.append(('housekeeping.tick: %s' % ', '.join(
                [_step_name(step) for step in plan] + ['replay_queue']),
                self._chore(st, 'HOUSEKEEPING', plan)))
        # A dead ADD's registration is read only by an admission or a GC about to lock.
        live = {w.sid for w in st.workers if w.job == 'ADD'}
        readers = healing or any(w.stage == 'hold' and w.job in ('ADD', 'GC') for w in st.workers)
        for sid in sorted((st.adds | st.reserved) - live) if readers else ():
            out.append(('reservation of %s expires' % sid, _add_ended(st, sid)))
        return out

    def _chore(self, st, job, plan):
        """A chore's first steps, then replay_queue's look at the queue, in one step: none
        of them is seen by a request (recovery runs before the socket opens;
        housekeeping's tidying touches only what dead processes left)."""
        w = Worker(job, '', 'run', (), False, -1, ())
        for step in plan + (('replay',),):
            st, w = self._execute(st, w, step)
        return _put(st, st.workers, w)

    def _orphan_locks(self, st):
        """Free lock files of pods with no binding (only with that fix)."""
        if 'tick_removes_orphan_locks' not in self.fixes:
            return frozenset()
        held = {w.holds for w in st.workers}
        return frozenset(p for p in st.locks if st.bindings[p] is None and p not in held)

    @staticmethod
    def _kernel_next(st):
        return any(w.stage == 'run' and w.plan and w.plan[0][0] in KERNEL_STEPS
                   for w in st.workers)

    def _port_free(self, st, p):
        """A recycled port is published for its new pod once the old pod is deleted."""
        for q, pod in enumerate(self.bounds.pods):
            if q < p and pod.port == self.ports[p]:
                if any(st.runtime[self.index[s]][1] == self.bounds.dels_per_sandbox
                       for s in self.sandboxes if self.pod_of[s] == q):
                    return False
        return True


def _unpack(binding):
    if binding is None:
        return None, {}
    owner, sandboxes = binding
    return owner, dict(sandboxes)


def _pack(owner, sandboxes):
    return (owner, tuple(sorted(sandboxes.items())))


def _summary(binding):
    """The registry's Summary of a binding: its owner, and whether it holds addresses."""
    if binding is None:
        return None
    return (binding[0], any(att for _sid, att in binding[1]))


def _save(p, owner, sandboxes):
    """Ownership._save: the durable write, then its registry mirror."""
    binding = _pack(owner, sandboxes)
    return [('save', p, binding), ('mirror_put', p, _summary(binding))]


def _permuted(perm, group, order):
    """``perm`` followed by sending ``group``'s pods to ``order``."""
    moved = dict(zip(group, order))
    return tuple(moved.get(q, q) for q in perm)


# Steps whose second item is a pod's index; the others' is a sandbox (or nothing).
_POD_STEPS = frozenset({'save', 'save_fast', 'mirror_put', 'mirror_drop', 'remove', 'release',
                        'release_remove'})


class _Renaming:
    """A state with its pods renamed (see Model._symmetry): every pod index and sandbox
    name in it, down to the steps workers have left."""

    def __init__(self, perm, inverse, names, unslot):
        self.perm, self.inverse, self.names, self.unslot = perm, inverse, names, unslot

    def __call__(self, st):
        sid, pod = self.sid, self.perm.__getitem__
        return st._replace(
            bindings=self.per_pod(tuple(self.binding(b) for b in st.bindings)),
            mirror=self.per_pod(tuple(m and (sid(m[0]), m[1]) for m in st.mirror)),
            locks=frozenset(map(pod, st.locks)),
            tmp=frozenset((t[0], pod(t[1]) if t[0] == 'bindings' else sid(t[1]))
                          for t in st.tmp),
            queue=tuple(map(sid, st.queue)), set_aside=self.sids(st.set_aside),
            devices=self.sids(st.devices), adds=self.sids(st.adds),
            cancelled=self.sids(st.cancelled), reserved=self.sids(st.reserved),
            newest=self.per_pod(tuple(map(sid, st.newest))), vifs=self.per_pod(st.vifs),
            workers=tuple(sorted(self.worker(w) for w in st.workers)),
            runtime=tuple(st.runtime[k] for k in self.unslot))

    def sid(self, name):
        return self.names.get(name, name)       # '' and None stay

    def sids(self, names):
        return frozenset(map(self.sid, names))

    def per_pod(self, values):
        return tuple(values[q] for q in self.inverse)

    def binding(self, binding):
        if binding is None:
            return None
        owner, sandboxes = binding
        return (self.sid(owner), tuple(sorted((self.sid(s), a) for s, a in sandboxes)))

    def worker(self, w):
        note = w.note if w.note == ('active',) else tuple(map(self.sid, w.note))
        return w._replace(sid=self.sid(w.sid), plan=self.plan(w.plan), note=note,
                          holds=w.holds if w.holds < 0 else self.perm[w.holds])

    def plan(self, plan):
        return tuple(map(self.step, plan))

    def step(self, step):
        if len(step) < 2:
            return step
        kind, what, *rest = step
        if kind in _POD_STEPS:
            if kind in ('save', 'save_fast'):
                rest = [self.binding(rest[0])]
            elif kind == 'mirror_put':
                rest = [rest[0] and (self.sid(rest[0][0]), rest[0][1])]
            return (kind, self.perm[what], *rest)
        if kind in KERNEL_STEPS:
            return (kind, self.sid(what), self.plan(rest[0]))
        return (kind, self.sid(what), *rest)


def _add_ended(st, sid):
    """BindingTable.add_finished (or a dead ADD aged out): its marks and reservation go."""
    return st._replace(adds=st.adds - {sid}, cancelled=st.cancelled - {sid},
                       reserved=st.reserved - {sid})


def _without(queue, entry):
    i = queue.index(entry)
    return queue[:i] + queue[i + 1:]


def _set(values, i, value):
    return values[:i] + (value,) + values[i + 1:]


def _put(st, rest, worker):
    """``st`` with workers ``rest`` plus ``worker`` (None: it ended), kept sorted."""
    workers = rest if worker is None else tuple(sorted(rest + (worker,)))
    return st._replace(workers=workers)


def _joins(before, step):
    return step[0] == 'release' or (
        before[0] in ('add_finished', 'queue_del') and step[0] == 'answer')


def _step_name(step):
    kind = step[0]
    if kind in ('connect', 'disconnect', 'remove_tagged'):
        return '%s %s' % (kind, step[1])
    if kind in ('save', 'save_fast'):
        return '%s %s' % (kind, _describe(step[2]))
    if kind == 'answer':
        return 'answer %s' % step[1]
    if kind in ('done', 'set_aside'):
        return '%s %s' % (kind, step[1])
    return kind


def _describe(binding):
    owner, sandboxes = binding
    return 'owner=%s %s' % (owner, ','.join('%s:%s' % (s, a or '-') for s, a in sandboxes))


def durable_steps(plan):
    """The filesystem calls ``plan`` makes when nothing fails, in order."""
    calls = []
    for step in plan:
        calls += STEPS[step[0]][1]
    return calls


# Invariants -------------------------------------------------------------------------

def protected(model, st):
    """Sandboxes whose ADD answered success and that must still be connected: no DEL
    of them and no ADD of a newer sandbox of their pod was sent since."""
    out = []
    for k, sid in enumerate(model.sandboxes):
        add, _left, _busy, del_sent = st.runtime[k]
        if add != 'ok' or del_sent:
            continue
        later = [s for s in model.sandboxes[k + 1:] if model.pod_of[s] == model.pod_of[sid]]
        if all(st.runtime[model.index[s]][0] == '' for s in later):
            out.append(sid)
    return out


def check_state(model, st):
    """Safety in every state: an answered ADD left its pod connected; no request is stuck."""
    for sid in protected(model, st):
        binding = st.bindings[model.pod_of[sid]]
        if sid not in st.devices or binding is None or binding[0] != sid:
            return 'ADD %s answered success but its pod is no longer connected' % sid
    return None


def check_step(model, before, after, worker):
    """Safety of one step of ``worker``: a DEL from a non-owner changes nothing of the
    owner's (its device, OVS row, record, ownership)."""
    if worker is None or worker.job in ('ADD', 'SHIM') or not worker.sid:
        return None
    p = model.pod_of[worker.sid]
    binding = before.bindings[p]
    owner = binding[0] if binding else None
    if owner in (None, worker.sid):
        return None
    kept = after.bindings[p]
    record = dict(binding[1]).get(owner)
    if (kept is None or kept[0] != owner or dict(kept[1]).get(owner) != record
            or (owner in before.devices) != (owner in after.devices)):
        return 'a DEL of %s (not the owner) changed owner %s\'s network' % (worker.sid, owner)
    return None


def runtime_done(st):
    """Every ADD answered, every DEL of every sandbox answered or queued."""
    return all(add in ('ok', 'failed') and left == 0 and not busy
               for add, left, busy, _sent in st.runtime)


HEAL_LIMIT = 400    # steps; more is a livelock


def healing(st):
    """``st`` with its faults over: the kernel answers, no more kills, refusals or GCs."""
    return st._replace(refusing=False, budget=(0, 0, 0))


def heal(model, st):
    """From a state where the runtime is done: faults healed (:func:`healing`), time
    passes (waits end, dead ADDs age out), the daemon restarts if it is down and
    housekeeping runs until it has nothing left to do. One fair schedule: the first
    enabled transition each time, workers first. Returns the healed state and the
    actions taken."""
    st, trace = healing(st), []
    for _ in range(HEAL_LIMIT):
        steps = model.successors(st, healing=True)
        if not steps:
            return st, trace
        action, st, _worker = steps[0]
        trace.append(action)
    raise AssertionError('no quiescence after %d healing steps: %s'
                         % (HEAL_LIMIT, trace[-20:]))


def check_quiescent(model, st):
    """After healing: a DEL answered success was applied, and nothing of a deleted
    sandbox remains (device, OVS row, record, lock, temporary file, reservation)."""
    lost = ['queued DEL of %s answered success but set aside, never applied' % sid
            for sid in sorted(st.set_aside)]
    left = []
    if st.devices:
        left.append('devices of %s' % ','.join(sorted(st.devices)))
    if any(st.bindings):
        left.append('bindings %s' % [_describe(b) for b in st.bindings if b])
    if st.locks:
        left.append('lock files of pods %s' % sorted(st.locks))
    if st.tmp:
        left.append('temporary files %s' % sorted(st.tmp))
    if st.queue:
        left.append('queued DELs %s' % list(st.queue))
    if st.adds or st.reserved:
        left.append('reservations of %s' % sorted(st.adds | st.reserved))
    if left:
        lost.append('after every DEL and recovery, left: ' + '; '.join(left))
    return '; '.join(lost) or None


# The filesystem calls of each path of the real code when nothing fails, in order,
# from the model's own plans: the real-code state machine counts the wrapped calls
# of each path and compares (issue 32 item 3).

def _durable_steps():
    a = Pod('a', 'x', (0, 0))
    model = Model(Bounds(pods=(a,), variant='2c4a2fa'))
    empty = model.initial()
    one = empty._replace(bindings=(('a1', (('a1', 'ready'),)),))
    two = empty._replace(bindings=(('a2', (('a1', 'ready'), ('a2', 'ready'))),))
    newer = empty._replace(bindings=(('a2', (('a2', 'ready'),)),))
    hold = list(STEPS['hold'][1])

    def add(st, sid, active=True):
        return hold + durable_steps(model.plan_add(st, sid, ('active',) if active else ())[0])

    def delete(st, sid, gc=False):
        return hold + durable_steps(model.plan_delete(st, sid, gc))

    return {
        'Ownership.add: first sandbox of a pod': add(empty, 'a1'),
        'Ownership.add: a new sandbox evicts the plugged one': add(one, 'a2'),
        'Ownership.delete: the owner': delete(one, 'a1'),
        'Ownership.delete: the owner, an older sandbox recorded': delete(two, 'a2'),
        'Ownership.delete: stale, its sandbox recorded': delete(two, 'a1'),
        'Ownership.delete: stale, its sandbox not recorded': delete(newer, 'a1'),
        'Ownership.delete: no binding': delete(empty, 'a1'),
        'Ownership.collect: a stale attachment': delete(one, 'a1', gc=True),
        'recovery.replay_queue: one queued DEL of the owner':
            delete(one, 'a1') + list(STEPS['done'][1]),
        'shim queueDel': list(STEPS['queue_del'][1]),
        # Adoption (kuryr_cni.adoption): the pod has no binding, kuryr-daemon's port
        # of its VIF is on br-int. A DEL adopts (the record, then the tag) and goes on
        # as the owner's; an orphan is discarded with no record; an ADD evicts the port
        # before its own claim; the start-up scan adopts under the pod's lock.
        'Adopter.adopt_for_delete: the DEL of a sandbox kuryr-daemon plugged':
            hold + list(STEPS['adopt_record'][1]) + delete(one, 'a1')[len(hold):],
        'Adopter.adopt_for_delete: an orphan of kuryr-daemon removed': delete(empty, 'a1'),
        'Adopter.evict_foreign: a new sandbox evicts kuryr-daemon\'s port': add(empty, 'a1'),
        # The shim queued the DEL of a sandbox kuryr-daemon plugged: the start-up replay,
        # before the watcher's list, only looks (no binding, no VIF to prove anything
        # with) and keeps it; housekeeping's first replay once listed adopts and applies.
        'recovery.replay_queue: a queued DEL of kuryr-daemon\'s sandbox waits for the pods':
            delete(empty, 'a1'),
        'recovery.replay_queue: housekeeping applies it once the pods are listed':
            hold + list(STEPS['adopt_record'][1]) + delete(one, 'a1')[len(hold):]
            + list(STEPS['done'][1]),
        # CHECK and the mirror's resync read the binding under the pod's lock.
        'Ownership.check: the owner': hold,
        'recovery.resync_mirror: housekeeping after a worker died': hold,
        'Adopter.scan: at start-up, a sandbox kuryr-daemon plugged':
            hold + list(STEPS['adopt_record'][1]),
    }


DURABLE_STEPS = _durable_steps()
