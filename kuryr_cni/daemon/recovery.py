"""Start-up recovery, run by the parent before the socket opens.

1. Tidy the state dir: remove the temporary files of writes that never
   finished, and move bindings of kuryr-cni 0.1.0 to their digest names.
2. Reload every valid persisted binding into the registry mirror; a file that
   is not a valid record is set aside, never fatal (:mod:`kuryr_cni.state`).
   Remove the lock files of pods without a binding, which a worker killed
   before its first record leaves (:meth:`kuryr_cni.podlock.PodLocks.remove_unused`).
3. Compare the kernel with them: a host device whose owner tag names a
   sandbox that no binding records is reported and left alone. Records are
   persisted before devices are made and dropped only after they are gone, so
   such a device means a record was lost (a file set aside, a wiped state
   dir), not that its sandbox is dead: its pod may well be running. The DEL of
   that sandbox removes it, by its tag.
4. Replay the DELs the shim queued while the daemon was down, with the normal
   ownership rules; an entry that is not a DEL is set aside, never fatal. The
   watcher has not listed the pods yet, so a DEL of a sandbox of a pod without
   binding waits in the queue (:data:`kuryr_cni.ownership.DEFERRED`): only
   the pod's VIFs prove what kuryr-daemon plugged for it, which its DEL must
   remove (:meth:`kuryr_cni.adoption.Adopter.adopt_for_delete`). Housekeeping
   applies it once the watcher has synced, before the adoption scan.
5. Once, from housekeeping after that replay (:func:`delete_vanished`): apply
   the DEL of each recorded sandbox whose network namespace file is gone from
   a directory that is still there. A runtime removes a sandbox's namespace
   only after its DEL, so such a DEL went to another CNI daemon: kuryr-daemon,
   run on the node for a while after kuryr-cni (going back, then forward
   again), whose DEL of a pod kuryr-cni plugged leaves our OVS row on br-int.

No request can see a half-rebuilt state because none is accepted yet.

While the daemon runs, :mod:`kuryr_cni.daemon.housekeeping` calls
:func:`replay_queue` again (DELs queued while it was briefly unreachable, and
those whose replay failed) and :func:`resync_mirror` after a CNI worker died
between writing a binding file and its registry mirror.

A queued DEL was answered "success" to the runtime by the shim: nothing else
will ever send it again. So whatever makes its replay fail (a kernel or OVSDB
refusal, a binding of a newer format, a pod lock held too long) keeps it in
the queue, retried with back-off (:class:`Retries`), counted
(``kuryr_cni_queued_del_failures_total``) and shown (``/ready``'s
``queued_dels_failing``, ``kuryr-cni-ctl queued-dels``). Only an entry that is
not a DEL at all is set aside at once; one that kept failing for
:data:`RETRY_AGE_LIMIT` is set aside too, loudly, and so is one deferred that
long (a watcher that never synced).
"""

import dataclasses
import os
import time

from oslo_log import log as logging

from kuryr_cni import errors
from kuryr_cni import metrics
from kuryr_cni import ownership as rules
from kuryr_cni.cni import request as cni_request

LOG = logging.getLogger(__name__)

REPLAY_TIMEOUT = 30      # seconds for one queued DEL
VANISHED_CNI_VERSION = '1.0.0'  # of the DELs of sandboxes whose namespace vanished
RESYNC_LOCK_TIMEOUT = 5  # seconds to wait for one pod's lock when resyncing the mirror

# A failed queued DEL is retried after RETRY_FIRST seconds (a housekeeping
# round), then after twice as long each time, at most RETRY_CAP apart: once
# what failed it passes (an OVSDB failover takes seconds, a refused device is
# let go), the DEL is applied within a minute, and a DEL that keeps failing
# costs one attempt and one log line a minute.
RETRY_FIRST = 2.0
RETRY_CAP = 60.0
# After failing without a break for a day it is set aside: longer than any
# passing cause (a failover, a node under maintenance, a downgrade and its
# upgrade back within a working day); past that, retrying for ever would hide
# a failure only an operator can fix. Set aside, it is logged as an error and
# counted, and moving it back into the queue replays it.
RETRY_AGE_LIMIT = 24 * 3600
LISTED = 100             # failing entries shown to operators, oldest first


def restore(ownership, queue, lock_dir):
    """Recover before serving; returns ``(bindings, unrecorded devices, replayed DELs)``."""
    store = ownership.store
    store.remove_temporaries()      # no daemon process writes yet: every one is dead
    queue.remove_temporaries()
    store.migrate_legacy_names(lock_dir)
    bindings = store.load_all()
    ownership.locks.remove_unused(store.has_stem)
    ownership.registry.bindings.replace({key: b.summary() for key, b in bindings.items()})
    unrecorded = find_unrecorded_devices(bindings, ownership.kernel)
    replayed = replay_queue(ownership, queue)
    LOG.info('Recovered %d pod bindings, found %d host devices of unrecorded sandboxes, '
             'replayed %d queued DELs', len(bindings), len(unrecorded), replayed)
    return len(bindings), len(unrecorded), replayed


def find_unrecorded_devices(bindings, kernel):
    """Tagged host devices of sandboxes no binding records: logged, never removed."""
    known = {cid for binding in bindings.values() for cid in binding.sandboxes}
    unrecorded = [(cid, ifname) for cid, ifname in kernel.tagged_host_devices()
                  if cid not in known]
    for cid, ifname in unrecorded:
        LOG.warning('A host device is tagged for %s of sandbox %s, which no binding records; '
                    'leaving it alone (its pod may be running; a DEL of that sandbox '
                    'removes it)', ifname, cid)
    return unrecorded


@dataclasses.dataclass
class _Failing:
    """A queued DEL whose replay failed, and when it is tried again."""

    pod: str | None
    container_id: str
    ifname: str
    first: float            # time.monotonic() of its first failure
    since: float            # time.time() of it, for people
    attempts: int = 0
    next_try: float = 0.0   # time.monotonic()
    error: str = ''


class Retries:
    """The back-off of the queued DELs whose replay failed, by entry name; in memory.

    A fresh one finds every entry due: the first pass at start, and the first
    round of a restarted housekeeper, try them all.
    """

    def __init__(self, first=RETRY_FIRST, cap=RETRY_CAP, age_limit=RETRY_AGE_LIMIT):
        self.first, self.cap, self.age_limit = first, cap, age_limit
        self._failing = {}      # entry name -> _Failing
        self._deferred = {}     # entry name -> time.monotonic() it was first deferred
        self._published = None

    def due(self, name):
        failing = self._failing.get(name)
        return failing is None or time.monotonic() >= failing.next_try

    def failed(self, name, req, error):
        """Note a failed replay; returns its :class:`_Failing`."""
        now = time.monotonic()
        failing = self._failing.get(name)
        if failing is None:
            failing = self._failing[name] = _Failing(
                req.pod.key if req.pod else None, req.container_id, req.ifname, now,
                time.time())
        failing.attempts += 1
        failing.next_try = now + min(self.cap, self.first * 2 ** (failing.attempts - 1))
        failing.error = _describe(error)
        return failing

    def expired(self, failing):
        return time.monotonic() - failing.first >= self.age_limit

    def deferred(self, name):
        """Note a DEL deferred until the watcher syncs (due again next round, no
        back-off: it waits for no failure to pass); returns ``(first time, waited
        age_limit)``."""
        first = name not in self._deferred
        since = self._deferred.setdefault(name, time.monotonic())
        return first, time.monotonic() - since >= self.age_limit

    def forget(self, name):
        self._failing.pop(name, None)
        self._deferred.pop(name, None)

    def publish(self, status, present):
        """Tell the registry which entries fail (forgetting those gone from ``present``)."""
        for name in set(self._failing) - set(present):
            del self._failing[name]
        for name in set(self._deferred) - set(present):
            del self._deferred[name]
        now, wall = time.monotonic(), time.time()
        listed = [{'entry': name, 'pod': f.pod, 'container_id': f.container_id,
                   'ifname': f.ifname, 'failing_since': f.since, 'attempts': f.attempts,
                   'next_try': wall + max(0.0, f.next_try - now), 'error': f.error}
                  for name, f in sorted(self._failing.items())[:LISTED]]
        view = (len(self._failing), min((f.first for f in self._failing.values()), default=None),
                [(e['entry'], e['attempts']) for e in listed])
        if view != self._published:     # one Manager call per change, not per round
            status.note_queued_dels(len(self._failing), view[1], listed)
            self._published = view


def replay_queue(ownership, queue, stop=None, retries=None, vifs_known=None):
    """Replay every complete queued DEL that is due, oldest first; returns how many were done.

    An entry is removed only once its DEL has been applied, so a replay cut
    short (the process killed) is repeated, which DEL's rules make harmless.
    A DEL that failed, for whatever reason, is kept and tried again when
    ``retries`` (a :class:`Retries`; None: one of its own) says; only an entry
    that is not a DEL, and one failing for ``retries.age_limit``, are set
    aside. ``stop`` (an Event) ends the replay between two entries. Until the
    watcher has synced (``vifs_known``; None: asked here), a DEL that needs the
    pod's VIFs is deferred (:data:`kuryr_cni.ownership.DEFERRED`): kept, due
    again next time.
    """
    retries = retries if retries is not None else Retries()
    if vifs_known is None:
        vifs_known = ownership.registry.is_synced()
    replayed = 0
    for path, body in queue.entries(due=retries.due):
        if stop is not None and stop.is_set():
            break
        name = os.path.basename(path)
        try:
            req = cni_request.parse(body, 'DEL')
        except errors.CNIError as exc:
            queue.set_aside(path, 'not a valid DEL: %s' % exc.msg)
            retries.forget(name)
            continue
        try:
            outcome = ownership.delete(req, time.monotonic() + REPLAY_TIMEOUT,
                                       vifs_known=vifs_known)
        except (ConnectionError, EOFError):
            raise           # the registry is gone: nothing more can be replayed
        except Exception as exc:    # never fatal, never dropped: the runtime was told success
            _failed(queue, path, req, exc, retries)
            continue
        if outcome == rules.DEFERRED:
            _deferred(queue, path, req, retries)
            continue
        LOG.info('Replayed queued DEL %s for %s: %s', path, req.container_id, outcome)
        metrics.del_replayed()
        queue.done(path)
        retries.forget(name)
        replayed += 1
    retries.publish(ownership.registry.status, queue.names())
    return replayed


def delete_vanished(ownership):
    """Apply the DEL of every recorded sandbox whose namespace is gone (step 5);
    returns how many sandboxes."""
    done = 0
    for pod_key, binding in sorted(ownership.store.load_all().items()):
        namespace, name = pod_key.split('/', 1)
        for cid, sandbox in sorted(binding.sandboxes.items()):
            path = sandbox.netns
            if not path or not ownership.kernel.netns_vanished(path):
                continue
            for attachment in list(sandbox.attachments.values()):
                req = cni_request.Request(
                    'DEL', VANISHED_CNI_VERSION, attachment.network, cid, None,
                    attachment.ifname, cni_request.PodRef(namespace, name, sandbox.uid), {})
                try:
                    outcome = ownership.delete(req, time.monotonic() + REPLAY_TIMEOUT)
                except errors.CNIError as exc:
                    LOG.warning('DEL of sandbox %s of pod %s, whose namespace %s is gone, '
                                'failed: %s', cid, pod_key, path, _describe(exc))
                    continue
                LOG.info('Sandbox %s of pod %s: its namespace %s is gone and its DEL never '
                         'came here (another CNI daemon had the node); applied: %s',
                         cid, pod_key, path, outcome)
            done += 1
    return done


def _deferred(queue, path, req, retries):
    first, expired = retries.deferred(os.path.basename(path))
    if expired:
        LOG.error('Giving up on the queued DEL %s of sandbox %s: the watcher has not listed '
                  'the pods for %d s, so what kuryr-daemon plugged for it cannot be proven. '
                  'Move it back into the queue to replay it', path, req.container_id,
                  retries.age_limit)
        _give_up(queue, path, 'the watcher never synced for %d s' % retries.age_limit,
                 retries)
    elif first:
        LOG.info('Queued DEL %s of sandbox %s (pod %s) waits for the watcher to list the '
                 'pods: the pod has no binding, and only its VIFs prove what kuryr-daemon '
                 'plugged for it', path, req.container_id, req.pod.key)


def _failed(queue, path, req, exc, retries):
    failing = retries.failed(os.path.basename(path), req, exc)
    metrics.queued_del_failed()
    what = 'queued DEL %s of sandbox %s (pod %s, %s)' % (
        path, req.container_id, failing.pod or 'unnamed', req.ifname)
    if retries.expired(failing):
        LOG.error('Giving up on the %s: it has failed %d times since %s, lastly with: %s. '
                  'Its devices and record stay; move it back into the queue to replay it',
                  what, failing.attempts, time.ctime(failing.since), failing.error)
        _give_up(queue, path, 'its DEL failed for %d s: %s'
                 % (retries.age_limit, failing.error), retries)
        return
    LOG.warning('The %s failed (attempt %d), keeping it and trying again in %.0f s: %s',
                what, failing.attempts, failing.next_try - time.monotonic(), failing.error,
                exc_info=not isinstance(exc, errors.CNIError))


def _give_up(queue, path, why, retries):
    """Set aside a queued DEL retried for ``retries.age_limit``: the operator's now."""
    queue.set_aside(path, why)
    retries.forget(os.path.basename(path))


def _describe(error):
    if isinstance(error, errors.CNIError):
        return '%s (code %d)%s' % (error.msg, error.code,
                                   ': %s' % error.details if error.details else '')
    return '%s: %s' % (type(error).__name__, error)


def resync_mirror(ownership):
    """Make the registry's binding mirror equal the binding files again, pod by pod.

    Each pod is compared under its lock, where no request is changing it; a
    pod whose lock stays busy is skipped (the request holding it rewrites the
    mirror itself). Returns the number of pods whose mirror entry was fixed.
    """
    store, mirror = ownership.store, ownership.registry.bindings
    files = store.load_all()
    fixed = 0
    for pod_key in sorted(set(files) | set(mirror.snapshot())):
        try:
            with ownership.locks.hold(pod_key, time.monotonic() + RESYNC_LOCK_TIMEOUT) \
                    as remove_lock:
                binding = store.load(pod_key)
                if binding is None:
                    remove_lock()       # the lock file of a pod without binding is a leftover
                summary = binding.summary() if binding else None
                if summary == mirror.get(pod_key):
                    continue
                if summary is None:
                    mirror.drop(pod_key)
                else:
                    mirror.put(pod_key, summary)
                fixed += 1
        except (errors.TryAgainLater, errors.UnreadableState):
            continue
    if fixed:
        LOG.info('Resynced the registry mirror of %d pod bindings with their files', fixed)
    return fixed
