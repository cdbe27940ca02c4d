"""Start-up recovery, run by the parent before the socket opens.

1. Tidy the state dir: remove the temporary files of writes that never
   finished, and move bindings of kuryr-cni 0.1.0 to their digest names.
2. Reload every valid persisted binding into the registry mirror; a file that
   is not a valid record is set aside, never fatal (:mod:`kuryr_cni.state`).
3. Compare the kernel with them: a host device whose owner tag names a
   sandbox that no binding records is reported and left alone. Records are
   persisted before devices are made and dropped only after they are gone, so
   such a device means a record was lost (a file set aside, a wiped state
   dir), not that its sandbox is dead: its pod may well be running. The DEL of
   that sandbox removes it, by its tag.
4. Replay the DELs the shim queued while the daemon was down, with the normal
   ownership rules; a corrupt entry is set aside, never fatal.

No request can see a half-rebuilt state because none is accepted yet.

While the daemon runs, :mod:`kuryr_cni.daemon.housekeeping` calls
:func:`replay_queue` again (DELs queued while it was briefly unreachable) and
:func:`resync_mirror` after a CNI worker died between writing a binding file
and its registry mirror.
"""

import time

from oslo_log import log as logging

from kuryr_cni import errors
from kuryr_cni import metrics
from kuryr_cni.cni import request as cni_request

LOG = logging.getLogger(__name__)

REPLAY_TIMEOUT = 30      # seconds for one queued DEL
RESYNC_LOCK_TIMEOUT = 5  # seconds to wait for one pod's lock when resyncing the mirror


def restore(ownership, queue, lock_dir):
    """Recover before serving; returns ``(bindings, unrecorded devices, replayed DELs)``."""
    store = ownership.store
    store.remove_temporaries()      # no daemon process writes yet: every one is dead
    queue.remove_temporaries()
    store.migrate_legacy_names(lock_dir)
    bindings = store.load_all()
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


def replay_queue(ownership, queue, stop=None):
    """Replay every complete queued DEL, oldest first; returns how many were done.

    An entry is removed only once its DEL has been applied, so a replay cut
    short (the process killed) is repeated, which DEL's rules make harmless.
    A DEL that failed for a passing reason is kept for the next replay; one
    that can never succeed is set aside. ``stop`` (an Event) ends the replay
    between two entries.
    """
    replayed = 0
    for path, body in queue.entries():
        if stop is not None and stop.is_set():
            break
        try:
            req = cni_request.parse(body, 'DEL')
            outcome = ownership.delete(req, time.monotonic() + REPLAY_TIMEOUT)
        except errors.CNIError as exc:
            if exc.retry:
                LOG.warning('Queued DEL %s failed, keeping it for the next replay: %s',
                            path, exc.msg)
                continue
            queue.set_aside(path, 'an invalid DEL: %s' % exc.msg)
            continue
        except (ConnectionError, EOFError):
            raise           # the registry is gone: nothing more can be replayed
        except Exception:   # never fatal: the daemon must start, the entry stays for later
            LOG.exception('Queued DEL %s failed unexpectedly, keeping it for the next replay',
                          path)
            continue
        LOG.info('Replayed queued DEL %s for %s: %s', path, req.container_id, outcome)
        metrics.del_replayed()
        queue.done(path)
        replayed += 1
    return replayed


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
