"""A steady stream of calls, as a busy node's kubelet makes them (the restart tiers)."""

import concurrent.futures
import dataclasses
import threading
import time


@dataclasses.dataclass
class Call:
    started: float
    ended: float
    outcome: object


class Stream:
    """Calls ``call(item)`` for each item at ``rate`` a second, each in a thread of its
    own, from a thread of its own until stopped or out of items."""

    def __init__(self, call, items, rate):
        self.call = call
        self.items = items
        self.rate = rate
        self.calls = []
        self._futures = []
        self._sent = threading.Condition()
        self._stop = threading.Event()
        self._pool = concurrent.futures.ThreadPoolExecutor(len(items))
        self._thread = threading.Thread(target=self._send, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def _timed(self, item):
        started = time.monotonic()
        outcome = self.call(item)
        self.calls.append(Call(started, time.monotonic(), outcome))

    def _send(self):
        start = time.monotonic()
        for i, item in enumerate(self.items):
            # Pacing, not waiting for a state: the next call is due at a fixed time.
            if self._stop.wait(max(0.0, start + i / self.rate - time.monotonic())):
                break
            with self._sent:
                self._futures.append(self._pool.submit(self._timed, item))
                self._sent.notify_all()

    def wait_sent(self, count, timeout=60):
        """Wait until ``count`` calls were sent (or all there are); returns how many."""
        count = min(count, len(self.items))
        with self._sent:
            assert self._sent.wait_for(lambda: len(self._futures) >= count, timeout), \
                'the stream sent %d calls in %ss, not %d' % (len(self._futures), timeout, count)
            return len(self._futures)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        for future in self._futures:
            future.result(timeout=200)     # the shim's own timeout is 110 s
        self._pool.shutdown()
