"""Recovery chores while the daemon runs, done from a thread of CNI worker 0.

Start-up recovery (:mod:`kuryr_cni.daemon.recovery`) runs once, before the
socket opens. Four of its steps are needed again later:

* replaying the DEL queue: a shim queues a DEL whenever it cannot reach the
  daemon, which also happens while the daemon runs (a DEL that timed out, one
  sent in the instant between the start-up replay and the socket opening);
  and a queued DEL whose replay failed is retried here, with back-off
  (:class:`kuryr_cni.daemon.recovery.Retries`);
* resyncing the registry's binding mirror: a CNI worker killed between writing
  a binding file and updating its mirror leaves the mirror behind the file.
  The parent asks for it after every CNI worker death
  (:meth:`kuryr_cni.registry.StatusTable.request_resync`);
* removing the temporary files of state writes that never finished: a
  worker's once it has died, a shim's once it is a minute old
  (:meth:`kuryr_cni.state.BindingStore.remove_temporaries`);
* removing the lock files nobody holds of pods without a binding, which a
  worker killed before its first record leaves
  (:meth:`kuryr_cni.podlock.PodLocks.remove_unused`).

Once, after the first replay, it applies the DELs of recorded sandboxes
whose namespace vanished while another CNI daemon had the node
(:func:`kuryr_cni.daemon.recovery.delete_vanished`). Once, as soon as the
watcher has synced (the pods' VIFs are known), it also runs the start-up
adoption of what kuryr-daemon plugged
(:meth:`kuryr_cni.adoption.Adopter.scan`), retried next round if it fails;
the replay of that round has applied the queued DELs that waited for the
pods' VIFs (:data:`kuryr_cni.ownership.DEFERRED`).

Every ``interval`` seconds the thread does all four, with the normal ownership
rules and pod locks, so it is idempotent and safe next to live requests. Only
worker 0 runs it (cotyledon gives a replacement the same worker id), so two
processes never replay one entry at once. It decides nothing itself.
"""

import threading

from oslo_log import log as logging

from kuryr_cni.daemon import recovery

LOG = logging.getLogger(__name__)

INTERVAL = 2.0                      # seconds between two rounds of chores


class Housekeeper:
    """Runs :meth:`tick` every ``interval`` seconds in a daemon thread until stopped."""

    def __init__(self, ownership, queue, interval=INTERVAL, retries=None):
        self.ownership = ownership
        self.queue = queue
        self.interval = interval
        # The back-off of failing queued DELs lives as long as this thread.
        self.retries = retries if retries is not None else recovery.Retries()
        self._stop = threading.Event()
        self._thread = None
        # Stand-ins for the rules may have no adopter: nothing to scan then.
        self._scanned = getattr(ownership, 'adopter', None) is None
        self._vanished_done = False

    def start(self):
        self._thread = threading.Thread(target=self._loop, name='housekeeping', daemon=True)
        self._thread.start()
        return self

    def stop(self):
        """Start no new chore; the one in progress finishes (see :meth:`join`)."""
        self._stop.set()

    def join(self, timeout):
        """Wait up to ``timeout`` seconds for the chore in progress (a queued DEL)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self):
        while not self._stop.wait(self.interval):
            try:
                self.tick()
            except (ConnectionError, EOFError) as exc:
                # The registry Manager is gone; the parent is stopping the daemon.
                LOG.warning('Housekeeping skipped: registry unavailable (%s)', exc)
            except Exception:       # a chore must never end the worker
                LOG.exception('Housekeeping failed; trying again in %s s', self.interval)

    def tick(self):
        """One round: resync the mirror if asked, tidy, then replay the DEL queue."""
        # Taken before resyncing: a death meanwhile asks again.
        if self.ownership.registry.status.take_resync_request():
            recovery.resync_mirror(self.ownership)
        # A killed writer's leftovers; a write in progress is never this old.
        self.ownership.store.remove_temporaries(while_running=True)
        self.ownership.locks.remove_unused(self.ownership.store.has_stem)
        self.queue.remove_temporaries()
        # One reading for the replay and the scan: a DEL the replay deferred for want
        # of the pods' VIFs is applied before the scan could adopt its sandbox.
        synced = self.ownership.registry.is_synced()
        replayed = recovery.replay_queue(self.ownership, self.queue, stop=self._stop,
                                         retries=self.retries, vifs_known=synced)
        if replayed:
            LOG.info('Replayed %d DELs the shim had queued', replayed)
        if not self._vanished_done:
            # Once, and a failure must not hold up the adoption scan below for ever:
            # logged, and whatever it missed waits for those sandboxes' pods to go.
            self._vanished_done = True
            try:
                recovery.delete_vanished(self.ownership)
            except (ConnectionError, EOFError):
                raise
            except Exception:
                LOG.exception('Applying the DELs of sandboxes whose namespace is gone failed')
        if not self._scanned and synced:
            # After the replay: a queued DEL of a sandbox is applied before its
            # devices could be adopted by the scan.
            self.ownership.adopter.scan(self.ownership)
            self._scanned = True
