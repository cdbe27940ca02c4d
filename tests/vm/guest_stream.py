"""A runtime's stream of ADDs while the daemon's unit is acted on, in the ``systemd`` guest.

``python -m tests.vm.guest_stream SPEC_JSON``, run as :mod:`tests.vm.guest_cni`
is (the daemon's virtualenv, the checkout on ``PYTHONPATH``), prints one JSON
line: every ADD attempt and every action with its times.

SPEC holds ``pods`` (``[name, uid]`` each, in the order they are started),
``threads`` (ADDs in flight at once), ``before`` (pods plugged before the
first action), ``actions`` (run one after the other, while the stream goes
on), ``after`` (pods plugged after the last action, then no new pod starts:
the pods left over are never used), ``pause`` (seconds between a thread's
ADDs) and ``deadline`` (seconds). As kubelet does, an ADD that fails is
retried with a new sandbox (container ID and network namespace
``<pod>-<attempt>``); the failed sandbox's namespace is kept, for the test to
see that nothing was left in it. An action is either a shell line or:

``["dels", N]``
    DEL, through the shim, the first N pods plugged (their ``deleted`` entries).
``["failures", N]``
    Wait until N ADDs answered after this action began failed (the daemon is
    away), or no pod is left to start.
"""

import json
import queue
import subprocess
import sys
import threading
import time

from tests.vm import guest_cni
from tools.testbed import runtime as testruntime

POLL = 0.05


class Stream:
    def __init__(self, spec):
        self.spec = spec
        self.runtime = testruntime.Runtime(guest_cni.SOCKET, guest_cni.STATE_DIR,
                                           guest_cni.CACHE_DIR, shim=guest_cni.SHIM)
        self.started = time.monotonic()
        self.deadline = self.started + spec['deadline']
        self.pods = queue.Queue()
        for name, uid in spec['pods']:
            self.pods.put((name, uid))
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.attempts = []
        self.plugged = []       # (name, uid, sandbox), in the order their ADDs succeeded
        self.deleted = []
        self.plugged_when_done = None   # len(plugged) once the last action ended
        self.feeding = spec['threads']

    def now(self):
        return round(time.monotonic() - self.started, 3)

    def add_until_plugged(self, name, uid):
        for attempt in range(1000):
            sandbox = testruntime.Sandbox('%s-%d' % (name, attempt),
                                          '/run/netns/%s-%d' % (name, attempt), name,
                                          pod_uid=uid)
            subprocess.run(['ip', 'netns', 'add', '%s-%d' % (name, attempt)], check=True)
            began = self.now()
            try:
                outcome = self.runtime.add(sandbox)
                code, output = outcome.code, outcome.output
            except subprocess.TimeoutExpired:
                code, output = None, None       # never answered: the test fails on it
            record = {'pod': name, 'uid': uid, 'sandbox': sandbox.container_id,
                      'began': began, 'seconds': round(self.now() - began, 3),
                      'code': code, 'output': output}
            with self.changed:
                self.attempts.append(record)
                if code == 0:
                    self.plugged.append((name, uid, sandbox.container_id))
                self.changed.notify_all()
            # The pace of the stream; after a failure, kubelet's back-off, shortened.
            time.sleep(self.spec['pause'])
            if code == 0 or time.monotonic() > self.deadline:
                return

    def next_pod(self):
        with self.lock:
            if (self.plugged_when_done is not None
                    and len(self.plugged) - self.plugged_when_done >= self.spec['after']):
                return None
            try:
                return self.pods.get_nowait()
            except queue.Empty:
                return None

    def feed(self):
        try:
            while (pod := self.next_pod()) is not None:
                self.add_until_plugged(*pod)
        finally:
            with self.changed:
                self.feeding -= 1
                self.changed.notify_all()

    def wait_for(self, predicate):
        with self.changed:
            while not predicate():
                if not self.changed.wait(max(0.0, self.deadline - time.monotonic())):
                    raise TimeoutError('the stream ran out of time')

    def act(self, action):
        began = self.now()
        record = {'action': action, 'began': began}
        if isinstance(action, str):
            proc = subprocess.run(action, shell=True, capture_output=True, text=True,
                                  timeout=max(1, self.deadline - time.monotonic()))
            record.update(rc=proc.returncode, output=proc.stdout + proc.stderr)
        elif action[0] == 'dels':
            with self.lock:
                targets = self.plugged[:action[1]]
            for name, uid, container_id in targets:
                sandbox = testruntime.Sandbox(container_id, '/run/netns/' + container_id,
                                              name, pod_uid=uid)
                outcome = self.runtime.delete(sandbox)
                self.deleted.append({'pod': name, 'sandbox': container_id,
                                     'code': outcome.code, 'output': outcome.output})
        elif action[0] == 'failures':
            with self.lock:
                seen = len(self.attempts)

            def failed_since():
                return (sum(1 for a in self.attempts[seen:] if a['code'] != 0) >= action[1]
                        or not self.feeding)
            self.wait_for(failed_since)
        else:
            raise ValueError('unknown action %r' % (action,))
        record['seconds'] = round(self.now() - began, 3)
        return record

    def run(self):
        threads = [threading.Thread(target=self.feed, daemon=True)
                   for _ in range(self.spec['threads'])]
        for thread in threads:
            thread.start()
        self.wait_for(lambda: len(self.plugged) >= self.spec['before'])
        actions = [self.act(action) for action in self.spec['actions']]
        with self.lock:
            self.plugged_when_done = len(self.plugged)
        for thread in threads:
            thread.join(max(0.0, self.deadline - time.monotonic()))
        with self.lock:
            return {'attempts': self.attempts, 'actions': actions, 'deleted': self.deleted,
                    'plugged': [sandbox for _n, _u, sandbox in self.plugged],
                    'unfinished': sum(thread.is_alive() for thread in threads)}


def main(argv):
    print(json.dumps(Stream(json.loads(argv[0])).run()))


if __name__ == '__main__':
    main(sys.argv[1:])
