"""The ownership rules of DESIGN §3: which sandbox may touch a pod's network.

A pod's :class:`kuryr_cni.records.Binding` (persisted per pod by
:class:`kuryr_cni.state.BindingStore`) names the owner sandbox and keeps a
record of every sandbox whose devices may still exist. Rules, all applied
under the pod's flock (:mod:`kuryr_cni.podlock`):

* ADD(B) waits (unlocked) until the watcher shows the pod's incarnation with
  its VIFs, active or not; then, in one hold of the lock, records B as owner
  and persists that before anything is plugged, evicts every other sandbox's
  devices (by their records, which stay persisted until the devices are gone),
  records the attachment as ``plugging``, plugs, and records it ``ready``; and
  only then waits (unlocked) until every VIF is active, as upstream kuryr does:
  Neutron marks a port ACTIVE only once it sees the host side just plugged (or,
  per ``ready_signal``, until ovn-controller has installed the port's flows:
  :mod:`kuryr_cni.readiness`). The two waits share ``vif_timeout``; the plug
  between them does not count. A timeout leaves what was plugged recorded for
  the runtime's DEL; a DEL of B while it waits unplugs it and fails the ADD.
  A DEL of B before the claim (while B's ADD waits for its VIFs) finds
  nothing to remove, and the ADD fails having changed nothing: at once when
  it waits, else at its claim. A sandbox's namespace is fixed by its first
  ADD: an ADD naming another one is refused (code 4) and changes nothing.
* DEL(A) from the owner unplugs A and clears the binding. DEL(A) from anyone
  else touches nothing of the owner's: it removes only what is provably A's and
  is counted as a rejected stale DEL. An unknown A is a successful no-op.
  "No owner recorded" never matches everything.

This module decides; every effect on the kernel goes through the port it is
given (:class:`kuryr_cni.kernel.Kernel` in the daemon).
"""

import dataclasses
import time
import uuid

from oslo_log import log as logging

from kuryr_cni import errors
from kuryr_cni import metrics
from kuryr_cni import readiness
from kuryr_cni import records
from kuryr_cni import vif as vif_model
from kuryr_cni.binding.base import Plug
from kuryr_cni.cni import prevresult
from kuryr_cni.cni import result as cni_result

LOG = logging.getLogger(__name__)

PRIMARY_IFNAME = 'eth0'     # the annotation's key for the interface named by CNI_IFNAME
DEFERRED = 'deferred'       # a DEL's outcome when it waits for the pod's VIFs (see delete)


class Ownership:
    """The rules, over a registry, a binding store, pod locks and a kernel port."""

    def __init__(self, registry, store, locks, kernel, vif_timeout, events=None,
                 adopter=None, ready_signal=readiness.ACTIVE):
        self.registry = registry
        # kuryr_cni.adoption.Adopter: takes over what kuryr-daemon plugged; None: never
        self.adopter = adopter
        self.store = store
        self.locks = locks
        self.kernel = kernel        # kuryr_cni.kernel.Kernel, or a stand-in with its methods
        self.vif_timeout = vif_timeout
        self.events = events     # kuryr_cni.events.EventPoster, or None: no Kubernetes Events
        self.ready_signal = ready_signal    # one of readiness.SIGNALS

    # ADD ------------------------------------------------------------------

    def add(self, req, deadline):
        self.kernel.check_netns(req.netns)
        pod = req.pod
        bindings = self.registry.bindings
        # This ADD's own name in the registry: the runtime may retry an ADD of the
        # sandbox while this one runs, and each ends only its own mark.
        token = uuid.uuid4().hex
        try:
            started = time.monotonic()
            # The ADD's registration brings back its first look at the pod's record.
            vifs = self._wait(pod, min(deadline, started + self.vif_timeout), 'published',
                              published_vifs, first_look=lambda: bindings.add_started(
                                  req.container_id, started, pod.key, token),
                              look=lambda: self._look_unless_deleted(req, token))
            waited = time.monotonic() - started
            result = self._claim_and_plug(req, vifs, deadline, token)
            # Plugged before ACTIVE, as upstream does: Neutron marks a port ACTIVE
            # only once it sees the port's host side, which the plug just made.
            watched = self._watched(vifs)
            if watched or not _all_active(vifs):
                started = time.monotonic()
                # vif_timeout bounds the two waits together, not the plug between
                # them: on a node busy starting pods, the plug's wait for the rtnl
                # lock and the disk is not time the control plane had.
                self._wait_ready(req, vifs, watched,
                                 min(deadline, started + self.vif_timeout - waited))
                waited += time.monotonic() - started
            metrics.vif_waited(waited)
            return result
        finally:
            bindings.add_finished(token)

    def _claim_and_plug(self, req, vifs, deadline, token):
        """Claim the pod for ``req``'s sandbox, evict the others and plug ``vifs``.

        One hold of the pod's lock; the claim is persisted before anyone is
        evicted (DESIGN §3). With nothing to evict, the 'plugging' write of
        :meth:`_plug` persists it.
        """
        with self.locks.hold(req.pod.key, deadline) as remove_lock:
            binding = self._load(req.pod.key)
            try:
                self._admit(req, vifs, deadline, token)
                self._refuse_moved_sandbox(binding, req)
                free_names = self._refuse_foreign_ifname(binding, req)
            except errors.CNIError:
                if not binding.sandboxes:
                    remove_lock()   # a refused first ADD leaves no trace
                raise
            evicting = len(binding.sandboxes) > (req.container_id in binding.sandboxes)
            self._claim(binding, req, save=evicting)
            self._evict_others(binding, req.container_id)
            if self.adopter is not None:
                # No iface-id on two ports: what kuryr-daemon plugged for the pod goes first.
                self.adopter.evict_foreign(req, vifs)
            try:
                return self._plug(binding, req, vifs, free_names)
            except errors.CNIError:
                if self.store.load(req.pod.key) is None:
                    remove_lock()   # refused before anything was written
                raise

    def _admit(self, req, vifs, deadline, token):
        """Refuse VIFs the node's binding policy forbids, an ADD overtaken by a newer
        sandbox's, and VIFs whose port, MAC or IP another pod of the node holds (by
        its binding, its ADD in flight, or kuryr-daemon's devices proven its VIF);
        else reserve those addresses for this ADD.

        Asked before the claim, so a refused ADD changes nothing (DESIGN §4.3).
        Claims follow the order ADDs arrived in, not the order they get the
        lock: an older ADD still waiting for its VIFs (one the runtime gave up
        on) must not take the pod from the sandbox the runtime moved on to.
        The reservation makes the address check and the recording of the
        attachment one step for other pods' ADDs (they see one or the other);
        it ends when this ADD does. Order and addresses are one registry call.
        """
        try:
            for vif in vifs.values():
                self.kernel.admit(vif)
        except errors.VIFNotAllowed as exc:
            LOG.warning('Refused ADD of pod %s, sandbox %s: %s (%s)',
                        req.pod.key, req.container_id, exc.msg, exc.details)
            raise
        addresses = {a for vif in vifs.values() for a in records.vif_addresses(vif)}
        deleted, newest, taken = self.registry.bindings.admit_add(
            req.container_id, req.pod.key, addresses, deadline, token)
        if deleted:
            raise _deleted_meanwhile(req)
        if newest not in (None, req.container_id):
            raise errors.TryAgainLater('sandbox %s of pod %s was superseded by sandbox %s, '
                                       'whose ADD came later' % (req.container_id, req.pod.key,
                                                                 newest))
        if not taken and self.adopter is not None:
            # kuryr-daemon's devices proven another pod's VIF hold their port as that
            # pod's binding would (the adoption's own fence covers the other order).
            taken = self.adopter.held_elsewhere(req.pod.key, vifs)
        if taken:
            # The error reaches the pod's Events: it names no other pod.
            LOG.warning('Pod %s: %s', req.pod.key, ', '.join(
                '%s is bound to pod %s' % item for item in sorted(taken.items())))
            raise errors.AddressTaken('%s bound to another pod of this node'
                                      % ', '.join(sorted(taken)))

    def _look_unless_deleted(self, req, token):
        """The pod's record, for an ADD waiting for its VIFs; fails once a DEL of the
        sandbox came (:meth:`_admit` would refuse it anyway: no need to wait)."""
        deleted, record = self.registry.bindings.add_look(token, req.pod.key)
        if deleted:
            raise _deleted_meanwhile(req)
        return record

    def _watched(self, vifs):
        """The names of ``vifs`` whose ovn-installed to watch, per ``ready_signal``.

        With ``first``, only while some VIF is inactive: an ADD whose VIFs are
        all active already answers at once, as it always did.
        """
        if self.ready_signal == readiness.ACTIVE or (
                self.ready_signal == readiness.FIRST and _all_active(vifs)):
            return frozenset()
        return frozenset(name for name, vif in vifs.items()
                         if self.kernel.has_installed_signal(vif))

    def _wait_ready(self, req, plugged, watched, deadline):
        """Wait until every VIF plugged for ``req`` works: active, or (``watched``
        ones) installed by OVN, as ``ready_signal`` says; unlocked.

        What was plugged stays recorded whatever happens here, so the runtime's
        DEL removes it. Fails at once when the sandbox stops owning the pod (a
        DEL of it, or a newer sandbox) or when the VIFs change under it.
        """
        plugs = {name: (vif, _plug_of(req.container_id, req.netns, records.Interface(
                    req.ifname if name == PRIMARY_IFNAME else name, vif, False)))
                 for name, vif in plugged.items() if name in watched}
        with readiness.InstalledWatch(self.kernel, plugs,
                                      max(0.0, deadline - time.monotonic())) as watch:
            self._wait_active(req, plugged, deadline, watched, watch)

    def _wait_active(self, req, plugged, deadline, watched=frozenset(), watch=None):
        """Wait until every VIF plugged for ``req`` is ready (see :meth:`_wait_ready`)."""
        cid = req.container_id
        if self.events is not None:
            self.events.waiting_for_active(req.pod, {n: v.to_dict() for n, v in plugged.items()})

        def look():
            summary, record = self.registry.bindings.summary_and_record(req.pod.key)
            if summary is None or summary.owner != cid:
                raise errors.TryAgainLater(
                    'sandbox %s of pod %s was %s while waiting for its VIFs to be active'
                    % (cid, req.pod.key, 'replaced by %s' % summary.owner
                       if summary and summary.owner else 'deleted'))
            return record

        def active(record):
            vifs = published_vifs(record)
            if vifs is None or not all(readiness.is_ready(self.ready_signal, n, v,
                                                          n in watched, watch)
                                       for n, v in vifs.items()):
                return None
            if ({n: dataclasses.replace(v, active=True) for n, v in plugged.items()}
                    != {n: dataclasses.replace(v, active=True) for n, v in vifs.items()}):
                raise errors.TryAgainLater('the VIFs of pod %s changed while waiting for them '
                                           'to be active; retry to plug the new ones'
                                           % req.pod.key)
            return vifs

        what = ('active' if not watched else 'installed by OVN'
                if self.ready_signal == readiness.OVN_INSTALLED else 'active or installed by OVN')
        self._wait(req.pod, deadline, what, active, look,
                   wake=watch.wake if watch is not None else None)

    def _wait(self, pod, deadline, what, ready, look, first_look=None, wake=None):
        """Read ``pod``'s record until it satisfies ``ready``, each time its rows change.

        ``look()`` reads the record (and may refuse to wait on);
        ``first_look()``, when given, instead of the first ``look()``;
        ``wake``, a ``threading.Event``: read again when it is set, too.

        The registry's change counters (:class:`kuryr_cni.registry.Changes`,
        shared memory) say when to read again, not a Manager Condition: a
        worker killed while holding a Manager-side lock would wedge every
        waiter. A record without UID (a static pod's KuryrPort) matches any
        UID; a ``gone`` record (the pod was deleted before its VIFs were
        published) fails at once. A timeout is also reported as a Kubernetes
        Event on the pod (``events``, best effort, never waited for).
        """
        changes = self.registry.changes
        next_look = first_look or look
        started = time.monotonic()
        while True:
            if wake is not None:
                wake.clear()    # before the read: a later signal sets it again
            seen = changes.version(pod.key)     # before the read: a later change moves it
            record, next_look = next_look(), look
            # A record without UID is a static pod's (KuryrPort source): no UID fence.
            if record and not (pod.uid is None or record['uid'] in (None, pod.uid)):
                record = None       # another incarnation of the name
            if record:
                if record.get('gone'):
                    raise errors.TryAgainLater('pod %s%s was deleted before its VIFs were '
                                               'published' % (pod.key, _uid_note(pod)))
                if record.get('error') and not record.get('deleting'):
                    raise errors.InvalidVIF('pod %s: %s' % (pod.key, record['error']))
                outcome = None if record.get('deleting') else ready(record)
                if outcome:
                    return outcome
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if self.events is not None:
                    self.events.vif_timeout(pod, (record or {}).get('vifs'),
                                            round(time.monotonic() - started, 1))
                raise errors.TryAgainLater('timed out waiting for the VIFs of pod %s%s to be %s%s'
                                           % (pod.key, _uid_note(pod), what,
                                              vif_model.inactive_note((record or {}).get('vifs'))))
            changes.wait(pod.key, seen, remaining, wake)

    def _refuse_moved_sandbox(self, binding, req):
        """Refuse an ADD naming another namespace than its sandbox's record.

        A sandbox's namespace never changes: the same container ID with another
        CNI_NETNS is a runtime's mistake (or worse), and following it would
        plug into, and evict from, someone else's pod.
        """
        sandbox = binding.sandboxes.get(req.container_id)
        if sandbox is not None and sandbox.netns != req.netns:
            raise errors.InvalidEnvironment(
                'sandbox %s of pod %s lives in %s, not in %s'
                % (req.container_id, binding.pod, sandbox.netns, req.netns),
                'a sandbox\'s network namespace cannot change; nothing was touched')

    def _claim(self, binding, req, save=True):
        """Record ``req``'s sandbox as the owner; ``save=False``: the caller persists it."""
        cid = req.container_id
        binding.sandboxes.setdefault(cid, records.Sandbox(cid, req.netns, req.pod.uid))
        if binding.owner == cid:
            return
        if binding.owner is not None:
            LOG.info('Pod %s: sandbox %s replaces %s', binding.pod, cid, binding.owner)
        binding.owner, binding.uid = cid, req.pod.uid
        if save:
            self._save(binding)

    def _evict_others(self, binding, owner):
        for cid in [c for c in binding.sandboxes if c != owner]:
            self._unplug_sandbox(binding, cid)
            metrics.sandbox_evicted()
            LOG.info('Pod %s: evicted the devices of previous sandbox %s', binding.pod, cid)

    def _plug(self, binding, req, vifs, free_names=frozenset()):
        """Plug ``vifs``; ``free_names``: pod interface names found free in this lock hold.

        Eviction, the only change since, frees names and takes none, so they
        need not be listed again (each listing enters the namespace).
        """
        sandbox = binding.sandboxes[req.container_id]
        key = (req.network, req.ifname)
        interfaces = pod_interfaces(vifs, req.ifname)
        previous = sandbox.attachments.get(key)
        recorded = {i.ifname for i in previous.interfaces} if previous else set()
        unchecked = [i for i in interfaces
                     if i.ifname not in free_names and i.ifname not in recorded]
        if unchecked:
            self._refuse_taken_names(req, [i.ifname for i in unchecked])
        if previous is not None:
            wanted = {i.ifname for i in interfaces}
            self._unplug_interfaces(req.container_id, sandbox.netns,
                                    [i for i in previous.interfaces if i.ifname not in wanted])
        # added_at lets a GC that began earlier spare it (see collect).
        attachment = records.Attachment(req.network, req.ifname, interfaces,
                                        added_at=time.time())
        sandbox.attachments[key] = attachment
        self._save(binding)
        try:
            self._connect_all(req, interfaces)
        except _NotRolledBack as exc:
            # Some device of the attachment may remain: its 'plugging' record stays,
            # so the owner's DEL (which the runtime sends after a failed ADD) finds it.
            raise exc.error from exc.__cause__
        except Exception:
            del sandbox.attachments[key]
            self._save(binding)
            raise
        plugged = [(i.ifname, i.vif, i.default_route) for i in interfaces]
        attachment.result = cni_result.build(req.cni_version, req.netns, plugged,
                                             req.prev_result)
        attachment.state = records.READY
        # Atomic but not fsynced: the 'plugging' write named every device before
        # it existed, and what this one adds (ready, the result CHECK compares)
        # matters only while those devices exist, which a power loss takes too.
        # In bursts of pod starts its fsyncs waited up to 0.2 s behind
        # containerd's. The registry's summary is the 'plugging' write's.
        self.store.save(binding, durable=False)
        return attachment.result

    def _refuse_foreign_ifname(self, binding, req):
        """Refuse CNI_IFNAME taken in the netns by anything but this attachment.

        Checked before the claim, so a refused ADD changes nothing (no owner
        recorded, no older sandbox evicted). A retried ADD of the same
        attachment is not refused: its record says the name is its own.
        Returns the names found free (none when nothing was checked).
        """
        sandbox = binding.sandboxes.get(req.container_id)
        if sandbox is not None and (req.network, req.ifname) in sandbox.attachments:
            return frozenset()
        self._refuse_taken_names(req, [req.ifname])
        return frozenset([req.ifname])

    def _refuse_taken_names(self, req, names):
        """Refuse when any of the interface ``names`` exists in the pod netns.

        An interface tagged for this very sandbox and name is no obstacle: it is
        what an earlier ADD of it left, which plugging replaces.
        """
        taken = {name for name in self.kernel.link_names(req.netns) & set(names)
                 if self.kernel.link_owner(req.netns, name) != (req.container_id, name)}
        if taken:
            raise errors.InvalidEnvironment(
                'interface %s already exists in %s for another attachment'
                % (', '.join(sorted(taken)), req.netns))

    def _connect_all(self, req, interfaces):
        """Connect every interface, or none: on failure, remove what was connected.

        Raises the failure; :class:`_NotRolledBack` wraps it when removing
        failed too, and devices may remain.
        """
        done = []
        try:
            for interface in interfaces:
                plug = _plug_of(req.container_id, req.netns, interface)
                done.append((interface, plug))
                self.kernel.connect(interface.vif, plug)
        except Exception as error:
            try:
                for interface, plug in reversed(done):
                    self.kernel.disconnect(interface.vif.kind, plug)
            except Exception as rollback_error:
                LOG.warning('ADD of pod %s, sandbox %s failed (%s) and removing what it '
                            'plugged failed too (%s); its record stays for the DEL',
                            req.pod.key, req.container_id, error, rollback_error)
                raise _NotRolledBack(error) from rollback_error
            raise

    # DEL ------------------------------------------------------------------

    def delete(self, req, deadline, vifs_known=None):
        """Apply DEL; returns the outcome counted: success, noop or stale.

        A DEL of a sandbox of a pod without binding, which only the pod's VIFs
        can prove kuryr-daemon's devices of, changes nothing and returns
        :data:`DEFERRED` while they are not known, to be applied once they
        are: ``vifs_known`` says whether they are (False: a queued DEL replayed
        before the watcher synced); None asks the registry (:meth:`vifs_listed`).
        """
        if req.netns and self.kernel.netns_exists(req.netns):   # it may be gone already
            self.kernel.check_netns(req.netns)
        # From here on no ADD of the sandbox in flight may claim the pod; one that
        # claimed already holds the pod's lock until its claim is recorded, so the
        # binding read under that lock below sees it.
        adding_to = self.registry.bindings.cancel_adds(req.container_id)
        pod_key = req.pod.key if req.pod else (self._find_container(req.container_id)
                                               or min(adding_to, default=None))
        if pod_key is None:
            self._remove_tagged(req)
            return 'noop'
        with self.locks.hold(pod_key, deadline) as remove_lock:
            binding = self.store.load(pod_key)
            if binding is None and self.adopter is not None and req.pod is not None:
                if not (self.vifs_listed(req.pod) if vifs_known is None else vifs_known):
                    remove_lock()
                    return DEFERRED
                # Devices kuryr-daemon made for this very sandbox: adopted (recorded
                # first), then removed below as the owner's.
                binding = self.adopter.adopt_for_delete(req, self._save)
            if binding is None:
                self._remove_tagged(req)
                remove_lock()
                return 'noop'
            outcome = self._judge_delete(binding, req)
            if not binding.sandboxes:
                self._forget(binding, remove_lock)
            return outcome

    def vifs_listed(self, pod):
        """Whether the watcher's view holds ``pod``'s VIFs, or all pods are listed (a
        pod not among them has none). Only after a start, until the first list, is
        neither true: an outage later keeps the view it had."""
        return self.registry.pods.get(pod.key) is not None or self.registry.is_synced()

    def wait_vifs_listed(self, pod, deadline):
        """Until :meth:`vifs_listed` (True) or ``deadline`` (False)."""
        changes = self.registry.changes
        while True:
            seen = changes.version(pod.key)     # before the look: a later list moves it
            if self.vifs_listed(pod):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            changes.wait(pod.key, seen, remaining)

    def _judge_delete(self, binding, req):
        cid = req.container_id
        sandbox = binding.sandboxes.get(cid)
        if binding.owner == cid:
            if not _records_ifname(sandbox, req.ifname):
                self._remove_tagged(req)    # devices its record lost: their tag proves them
            self._unplug_attachment(binding, cid, _attachment_key(sandbox, req))
            if not sandbox.attachments:
                binding.owner = None
                for other in list(binding.sandboxes):
                    self._unplug_sandbox(binding, other, save=False)
            # A record is dropped only once its devices are gone, so one write at
            # the end is as safe as one per sandbox; an emptied binding is not
            # written at all: delete() removes its file.
            if binding.sandboxes:
                self._save(binding)
            return 'success'
        if binding.owner is None:
            if sandbox is None:
                self._remove_tagged(req)
                return 'noop'
            self._unplug_sandbox(binding, cid)
            return 'success'
        reason = _stale_reason(binding, req)
        LOG.warning('Rejected stale DEL of pod %s from sandbox %s: owner is %s (%s)',
                    binding.pod, cid, binding.owner, reason)
        if sandbox is not None:
            self._unplug_sandbox(binding, cid)    # an earlier eviction that did not finish
        else:
            self._remove_tagged(req)
        metrics.stale_del_rejected(reason)
        self.registry.stale_dels.record({
            'time': time.time(), 'pod': binding.pod, 'container_id': cid,
            'ifname': req.ifname, 'owner': binding.owner, 'reason': reason})
        return 'stale'

    def _find_container(self, container_id):
        key = self.registry.bindings.find_container(container_id)
        if key is None:
            # The mirror lags the files only if a worker died between the two
            # writes; DELs without pod identity are rare, so scan the files.
            for binding in self.store.load_all().values():
                if container_id in binding.sandboxes:
                    return binding.pod
        return key

    def _remove_tagged(self, req):
        """Remove host devices provably of ``req``'s sandbox: named and tagged for it."""
        if req.ifname:
            self.kernel.remove_tagged(req.container_id, req.ifname)

    # CHECK ----------------------------------------------------------------

    def check(self, req, deadline):
        """CHECK: owner state, then the kernel against the VIFs and against prevResult."""
        self.kernel.check_netns(req.netns)
        if not req.prev_result:
            raise errors.InvalidConfig('CHECK needs prevResult, the result of the ADD')
        pod_key = req.pod.key if req.pod else self._find_container(req.container_id)
        if pod_key is None:
            raise errors.UnknownContainer('container %s has no attachment here' % req.container_id)
        with self.locks.hold(pod_key, deadline):
            attachment = self._owned_attachment(self.store.load(pod_key), req)
            for interface in attachment.interfaces:
                self.kernel.check(interface.vif,
                                  _plug_of(req.container_id, req.netns, interface))
            view = self.kernel.observe(req.netns)
        problems = prevresult.differences(
            req.prev_result, req.netns, [i.ifname for i in attachment.interfaces], view)
        if problems:
            raise errors.CheckFailed('the pod network differs from prevResult',
                                     '; '.join(problems))

    def _owned_attachment(self, binding, req):
        """The ready attachment ``req`` names, held by its sandbox as the pod's owner.

        Code 3 (unknown container: nothing to clean up) only when no record of
        the sandbox or attachment exists; a record that is not in order is a
        failed CHECK, which a DEL must follow.
        """
        cid = req.container_id
        if binding is None or cid not in binding.sandboxes:
            raise errors.UnknownContainer('container %s has no attachment here' % cid)
        if binding.owner != cid:
            raise errors.CheckFailed('sandbox %s no longer owns pod %s' % (cid, binding.pod),
                                     'owner: %s' % binding.owner)
        sandbox = binding.sandboxes[cid]
        attachment = sandbox.attachments.get((req.network, req.ifname))
        if attachment is None:
            raise errors.UnknownContainer('no attachment %s/%s for container %s'
                                          % (req.network, req.ifname, cid))
        if attachment.state != records.READY:
            raise errors.CheckFailed('attachment %s/%s of container %s was never completed'
                                     % (req.network, req.ifname, cid))
        if sandbox.netns != req.netns:
            raise errors.CheckFailed('attachment lives in %s, not %s'
                                     % (sandbox.netns, req.netns))
        return attachment

    # GC -------------------------------------------------------------------

    def stale_attachments(self, network, valid, max_add_age):
        """Attachments of ``network`` absent from ``valid`` {(cid, ifname)}, as
        ``(pod, cid, ifname, added_at)``.

        An attachment whose ADD is in flight is never stale: ADD registers
        itself before it records anything, and a registration older than
        ``max_add_age`` seconds is one whose worker died.
        """
        in_flight = self._adds_in_flight(max_add_age)
        stale = []
        for binding in self.store.load_all().values():
            for cid, sandbox in binding.sandboxes.items():
                if cid in in_flight:
                    continue
                for net, ifname in sandbox.attachments:
                    if net == network and (cid, ifname) not in valid:
                        stale.append((binding.pod, cid, ifname,
                                      sandbox.attachments[(net, ifname)].added_at))
        return stale

    def collect(self, req, deadline, listed_added_at, max_add_age):
        """GC one stale attachment (``req``: a DEL built by the GC) by DEL's rules.

        Judged again under the pod's lock, where an ADD cannot be plugging: an
        attachment whose ADD is in flight now, or that was (re)made since
        :meth:`stale_attachments` listed it (its ``added_at`` is not
        ``listed_added_at`` any more), is spared. Compared for equality, not
        against a clock: the wall clock may be stepped back between the two.
        Returns the outcome: 'spared', 'noop' (gone meanwhile) or DEL's.
        """
        pod_key = req.pod.key
        with self.locks.hold(pod_key, deadline) as remove_lock:
            binding = self.store.load(pod_key)
            if binding is None:
                remove_lock()
                return 'noop'
            sandbox = binding.sandboxes.get(req.container_id)
            attachment = sandbox.attachments.get((req.network, req.ifname)) if sandbox else None
            if attachment is None:
                return 'noop'
            if (req.container_id in self._adds_in_flight(max_add_age)
                    or attachment.added_at != listed_added_at):
                LOG.info('GC spares %s/%s of pod %s: its ADD is in flight or newer than the GC',
                         req.container_id, req.ifname, pod_key)
                return 'spared'
            LOG.info('GC removes stale attachment %s/%s of pod %s',
                     req.container_id, req.ifname, pod_key)
            outcome = self._judge_delete(binding, req)
            if not binding.sandboxes:
                self._forget(binding, remove_lock)
            return outcome

    def _adds_in_flight(self, max_age):
        return self.registry.bindings.adds_since(time.monotonic() - max_age)

    # Shared steps ----------------------------------------------------------

    def _load(self, pod_key):
        return self.store.load(pod_key) or records.Binding(pod_key)

    def _save(self, binding):
        self.store.save(binding)
        self.registry.bindings.put(binding.pod, binding.summary())

    def _forget(self, binding, remove_lock):
        self.store.remove(binding.pod)
        self.registry.bindings.drop(binding.pod)
        remove_lock()

    def _unplug_attachment(self, binding, cid, key):
        sandbox = binding.sandboxes[cid]
        attachment = sandbox.attachments.get(key)
        if attachment is not None:
            self._unplug_interfaces(cid, sandbox.netns, attachment.interfaces)
            del sandbox.attachments[key]
        if not sandbox.attachments and binding.owner != cid:
            del binding.sandboxes[cid]

    def _unplug_sandbox(self, binding, cid, save=True):
        """Remove every device of sandbox ``cid``; drop its record only after.

        ``save=False`` leaves persisting the smaller binding to the caller.
        """
        sandbox = binding.sandboxes[cid]
        for attachment in sandbox.attachments.values():
            self._unplug_interfaces(cid, sandbox.netns, attachment.interfaces)
        del binding.sandboxes[cid]
        if save:
            self._save(binding)

    def _unplug_interfaces(self, cid, sandbox_netns, interfaces):
        if sandbox_netns and not self.kernel.netns_exists(sandbox_netns):
            # Gone, or no namespace any more (a runtime unmounted it and left
            # the file): there is no pod side to reach, and refusing would make
            # the runtime retry a DEL that can never succeed.
            sandbox_netns = ''
        for interface in interfaces:
            self.kernel.disconnect(interface.vif.kind, _plug_of(cid, sandbox_netns, interface))


class _NotRolledBack(Exception):
    """A plug failed with ``error``, and removing what it had made failed too."""

    def __init__(self, error):
        super().__init__(error)
        self.error = error


def _deleted_meanwhile(req):
    # The runtime was told the sandbox is gone; it tears down a sandbox whose ADD
    # failed, so failing is right, and plugging would leave devices no DEL will
    # ever come for.
    return errors.TryAgainLater('sandbox %s of pod %s was deleted while its ADD waited '
                                'for the VIFs' % (req.container_id, req.pod.key))


def published_vifs(record):
    """The pod's VIFs once the record holds its primary interface's, active or not."""
    vifs = record.get('vifs') or {}
    if PRIMARY_IFNAME in vifs:
        return {name: vif_model.VIF.from_dict(v) for name, v in vifs.items()}
    return None


def _all_active(vifs):
    return all(v.active for v in vifs.values())


def pod_interfaces(vifs, cni_ifname):
    """Map the annotation's interfaces to names in the pod (eth0 → CNI_IFNAME)."""
    named = {(cni_ifname if name == PRIMARY_IFNAME else name): vif for name, vif in vifs.items()}
    if len(named) != len(vifs):
        raise errors.InvalidVIF('CNI_IFNAME %s collides with another VIF of the pod' % cni_ifname)
    default = next((n for n, v in named.items() if v.default), cni_ifname)
    return [records.Interface(name, vif, name == default)
            for name, vif in sorted(named.items(), key=lambda item: item[0] != cni_ifname)]


def _records_ifname(sandbox, ifname):
    """Whether any attachment of ``sandbox`` records an interface named ``ifname``."""
    return any(interface.ifname == ifname for attachment in sandbox.attachments.values()
               for interface in attachment.interfaces)


def _attachment_key(sandbox, req):
    """The attachment ``req`` names; an adopted one by its interface alone, since
    the start-up adoption guessed the network name (kuryr-daemon recorded none)."""
    key = (req.network, req.ifname)
    if key not in sandbox.attachments:
        for other, attachment in sandbox.attachments.items():
            if other[1] == req.ifname and any(i.adopted for i in attachment.interfaces):
                return other
    return key


def _plug_of(cid, sandbox_netns, interface):
    return Plug(cid, sandbox_netns or '', interface.ifname, interface.default_route,
                interface.vif.mac, interface.adopted)


def _stale_reason(binding, req):
    owner = binding.owner_sandbox
    owner_uid = (owner.uid if owner else None) or binding.uid
    if req.pod and req.pod.uid and owner_uid and req.pod.uid != owner_uid:
        return 'pod_uid_mismatch'
    return 'container_id_mismatch'


def _uid_note(pod):
    return ' (UID %s)' % pod.uid if pod.uid else ''
