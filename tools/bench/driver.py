"""The runtime-like driver: executes CNI plugins the way a container runtime does.

A plugin run is one exec with the ``CNI_*`` variables in its environment and
the network config on stdin, timed from just before the fork to just after
the exit (what a runtime waits for). The driver runs as its own small process
(``python -m tools.bench.driver``) started with ``ip netns exec`` inside a test
host's network namespace, so every plugin it starts lives in that namespace, as
a plugin started by a runtime lives in the node's: the machine's own namespace
is never where a plugin runs. The same driver code serves both systems under
test; only the namespace it was started in differs.

Protocol (one JSON document per line): the bench writes ``{"ops": [op, ...],
"concurrency": C}`` on the driver's stdin, where an op is ``{"argv", "env",
"stdin"}`` and optionally ``"timeout"`` (seconds, else ``OP_TIMEOUT``; a run
killed at it answers code -1); the driver runs the ops ``C`` at a time and answers
``{"wall": seconds, "cpu": seconds, "results": [{"code", "stdout", "stderr",
"seconds"}, ...]}`` on its stdout, results in the order of the ops; ``cpu`` is
the CPU time of the plugin processes of the batch. End of stdin ends the driver.

:class:`Driver` is the bench's side of that pipe.
"""

import concurrent.futures
import json
import os
import resource
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OP_TIMEOUT = 150        # seconds: above the shim's own default timeout (110)
STDERR_KEPT = 2000      # characters of a plugin's stderr sent back (for failures)


class DriverError(Exception):
    """The driver process died or answered nonsense."""


# --- the driver process --------------------------------------------------------

def execute(op):
    """Run one plugin exec; return its result with the seconds it took."""
    stdin = op.get('stdin', '').encode()
    timeout = op.get('timeout') or OP_TIMEOUT
    started = time.perf_counter()
    try:
        proc = subprocess.run(op['argv'], env=op['env'], input=stdin, capture_output=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        # One slow plugin is a failed operation, not a dead driver: the bench says which.
        return {'code': -1, 'seconds': time.perf_counter() - started,
                'stdout': (exc.stdout or b'').decode('utf-8', 'replace'),
                'stderr': 'killed by the driver after %d s' % timeout}
    seconds = time.perf_counter() - started
    return {'code': proc.returncode, 'seconds': seconds,
            'stdout': proc.stdout.decode('utf-8', 'replace'),
            'stderr': proc.stderr.decode('utf-8', 'replace')[-STDERR_KEPT:]}


def run_batch(ops, concurrency):
    """Run ``ops`` at most ``concurrency`` at a time; return the answer object."""
    cpu_before = children_cpu()
    started = time.perf_counter()
    if concurrency <= 1:
        results = [execute(op) for op in ops]
    else:
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            results = list(pool.map(execute, ops))
    return {'wall': time.perf_counter() - started, 'results': results,
            'cpu': children_cpu() - cpu_before}


def children_cpu():
    """CPU seconds (user + system) of every plugin run so far, and of what they ran.

    A plugin's own children (the reference's IPAM plugin) are counted in it
    once it has waited for them, as the kernel accounts reaped descendants.
    """
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def serve(stdin, stdout):
    for line in stdin:
        job = json.loads(line)
        stdout.write(json.dumps(run_batch(job['ops'], job.get('concurrency', 1))) + '\n')
        stdout.flush()


# --- the bench's side -----------------------------------------------------------

class Driver:
    """A driver process inside the network namespace ``netns_name``."""

    def __init__(self, netns_name):
        self.cpu = 0.0      # CPU seconds the plugin runs of the last batch took
        self.proc = subprocess.Popen(
            ['ip', 'netns', 'exec', netns_name, sys.executable, '-m', 'tools.bench.driver'],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONDONTWRITEBYTECODE='1'))

    def run(self, ops, concurrency=1):
        """Run ``ops``; returns ``(wall seconds, results)``."""
        if self.proc.poll() is not None:
            raise DriverError('the driver exited with status %s' % self.proc.returncode)
        self.proc.stdin.write(json.dumps({'ops': ops, 'concurrency': concurrency}) + '\n')
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise DriverError('the driver exited with status %s' % self.proc.wait(10))
        answer = json.loads(line)
        self.cpu = answer['cpu']
        return answer['wall'], answer['results']

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc.stdout.close()


if __name__ == '__main__':
    serve(sys.stdin, sys.stdout)
