"""Start-up recovery, run by the parent before the socket opens.

1. Reload every persisted binding into the registry mirror.
2. Reconcile the kernel with it: a host device tagged with a container ID that
   no binding knows is a leftover (records are persisted before devices are
   made, and dropped only after they are gone), so it is removed.
3. Replay the DELs the shim queued while the daemon was down, with the normal
   ownership rules; a corrupt entry is set aside, never fatal.

No request can see a half-rebuilt state because none is accepted yet.

While the daemon runs, :mod:`kuryr_cni.daemon.housekeeping` calls
:func:`replay_queue` again (DELs queued while it was briefly unreachable) and
:func:`resync_mirror` after a CNI worker died between writing a binding file
and its registry mirror.
"""

import time

from oslo_log import log as logging

from kuryr_cni import binding as drivers
from kuryr_cni import errors
from kuryr_cni import metrics
from kuryr_cni.cni import request as cni_request

LOG = logging.getLogger(__name__)

REPLAY_TIMEOUT = 30      # seconds for one queued DEL
RESYNC_LOCK_TIMEOUT = 5  # seconds to wait for one pod's lock when resyncing the mirror


def restore(ownership, store, queue, host_netns=None):
    bindings = store.load_all()
    ownership.registry.bindings.replace(bindings)
    removed = reconcile(bindings, host_netns, ownership.binding_options)
    replayed = replay_queue(ownership, queue)
    LOG.info('Recovered %d pod bindings, removed %d leftover host devices, '
             'replayed %d queued DELs', len(bindings), removed, replayed)
    return len(bindings), removed, replayed


def reconcile(bindings, host_netns=None, binding_options=None):
    known = {cid for binding in bindings.values() for cid in binding['sandboxes']}
    removed = 0
    for container_id, ifname in drivers.tagged_host_devices(host_netns):
        if container_id not in known:
            LOG.info('Removing leftover host device of unknown sandbox %s (%s)',
                     container_id, ifname)
            drivers.remove_tagged_host_device(container_id, ifname, host_netns,
                                              binding_options)
            removed += 1
    return removed


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
            LOG.error('Setting aside invalid queued DEL %s: %s', path, exc.msg)
            queue.set_aside(path)
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
                if binding == mirror.get(pod_key):
                    continue
                if binding is None:
                    mirror.drop(pod_key)
                else:
                    mirror.put(pod_key, binding)
                fixed += 1
        except errors.TryAgainLater:
            continue
    if fixed:
        LOG.info('Resynced the registry mirror of %d pod bindings with their files', fixed)
    return fixed
