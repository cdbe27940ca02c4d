"""The one way tests wait for a condition that no event announces."""

import time


def until(predicate, timeout=10, what=None, interval=0.01):
    """Call ``predicate`` until it returns something true, and return that.

    Only for states a test can observe but not subscribe to (a file the
    daemon writes, a process title, a counter): anything with an event is
    waited for on the event. Raises AssertionError after ``timeout`` seconds,
    naming ``what`` was awaited.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError('timed out after %ss waiting for %s'
                                 % (timeout, what or getattr(predicate, '__name__', 'it')))
        time.sleep(interval)
