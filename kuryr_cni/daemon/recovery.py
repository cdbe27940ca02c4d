"""Start-up recovery, run by the parent before the socket opens.

1. Reload every persisted binding into the registry mirror.
2. Reconcile the kernel with it: a host device tagged with a container ID that
   no binding knows is a leftover (records are persisted before devices are
   made, and dropped only after they are gone), so it is removed.
3. Replay the DELs the shim queued while the daemon was down, with the normal
   ownership rules; a corrupt entry is set aside, never fatal.

No request can see a half-rebuilt state because none is accepted yet.
"""

import time

from oslo_log import log as logging

from kuryr_cni import binding as drivers
from kuryr_cni import errors
from kuryr_cni import metrics
from kuryr_cni.cni import request as cni_request

LOG = logging.getLogger(__name__)

REPLAY_TIMEOUT = 30      # seconds for one queued DEL


def restore(ownership, store, queue, host_netns=None):
    bindings = store.load_all()
    ownership.registry.bindings.replace(bindings)
    removed = reconcile(bindings, host_netns)
    replayed = replay_queue(ownership, queue)
    LOG.info('Recovered %d pod bindings, removed %d leftover host devices, '
             'replayed %d queued DELs', len(bindings), removed, replayed)
    return len(bindings), removed, replayed


def reconcile(bindings, host_netns=None):
    known = {cid for binding in bindings.values() for cid in binding['sandboxes']}
    removed = 0
    for container_id, ifname in drivers.tagged_host_devices(host_netns):
        if container_id not in known:
            LOG.info('Removing leftover host device of unknown sandbox %s (%s)',
                     container_id, ifname)
            drivers.remove_tagged_host_device(container_id, ifname, host_netns)
            removed += 1
    return removed


def replay_queue(ownership, queue):
    replayed = 0
    for path, body in queue.entries():
        try:
            req = cni_request.parse(body, 'DEL')
            outcome = ownership.delete(req, time.monotonic() + REPLAY_TIMEOUT)
        except errors.CNIError as exc:
            if exc.retry:
                LOG.warning('Queued DEL %s failed, keeping it for the next start: %s',
                            path, exc.msg)
                continue
            LOG.error('Setting aside invalid queued DEL %s: %s', path, exc.msg)
            queue.set_aside(path)
            continue
        LOG.info('Replayed queued DEL %s for %s: %s', path, req.container_id, outcome)
        metrics.del_replayed()
        queue.done(path)
        replayed += 1
    return replayed
