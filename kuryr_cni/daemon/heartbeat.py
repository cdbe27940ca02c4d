"""Heartbeats: proof that a process's serving loop still turns.

A process that is alive but stuck (stopped, deadlocked, blocked forever in a
system call) keeps its pid, so pids alone cannot tell a stuck worker pool from
a working one. Each CNI worker's accept loop and the watcher process write
a ``time.monotonic()`` reading (one clock for every process of the machine)
into the registry's status table at most once per interval;
:func:`kuryr_cni.daemon.health.judge` treats a beat older
than ``[health] heartbeat_timeout`` as stuck. No I/O beyond one registry write
per interval: cheap enough to call from every turn of a loop.
"""

import threading
import time

# Beats per timeout: one late beat (a busy machine) must not look stuck.
BEATS_PER_TIMEOUT = 3


def interval(timeout):
    """Seconds between two beats for a stuck-after ``timeout``."""
    return max(0.2, timeout / BEATS_PER_TIMEOUT)


class Heartbeat:
    """Beats for one process; ``beat()`` writes only when the last write is due."""

    def __init__(self, status, role, worker_id, timeout):
        self.status = status
        self.role = role
        self.worker_id = worker_id
        self.interval = interval(timeout)
        self._last = None

    def beat(self):
        now = time.monotonic()
        if self._last is None or now - self._last >= self.interval:
            self.status.beat(self.role, self.worker_id, now)
            self._last = now

    def run_in_thread(self, stop_event):
        """Beat from a thread until ``stop_event`` is set; returns the thread.

        For a process whose main loop may legitimately block for minutes (the
        watcher reading a quiet watch stream, bounded by its read timeout): the
        beat then proves the process runs and reaches the registry.
        """
        def loop():
            while not stop_event.is_set():
                self.beat()
                stop_event.wait(self.interval)

        thread = threading.Thread(target=loop, name='heartbeat', daemon=True)
        thread.start()
        return thread
