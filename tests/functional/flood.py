"""A flood of slow clients, from a process of its own inside the test host's namespace.

:class:`Flood` starts ``python -m tests.functional.flood`` under ``ip netns
exec``; that process opens ``count`` connections to its targets (TCP
``host:port`` or a unix socket path), half of them silent, half trickling a
request head one byte every ``interval`` seconds, and never completes a
request. With ``reconnect`` it replaces every connection the server drops, so
the pressure lasts; without, dropped connections stay gone. It reports on
stdout, one JSON line each: ``{"connected": n, "failed": n}`` once all
connections are opened, then ``{"dropped": n}`` when told to stop (stdin
closed), after closing everything.
"""

import argparse
import json
import os
import resource
import selectors
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEAD = b'GET /alive HTTP/1.1\r\nHost: flood\r\nX-Slow: ' + b'a' * 4000


class Flood:
    """The flooding process, as a context manager: started on entry, stopped on exit."""

    def __init__(self, node, targets, count, reconnect=True, interval=0.5):
        self.proc = subprocess.Popen(
            ['ip', 'netns', 'exec', node.ns, sys.executable, '-m', 'tests.functional.flood',
             '--count', str(count), '--interval', str(interval)]
            + (['--reconnect'] if reconnect else []) + [str(t) for t in targets],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.opened = None

    def __enter__(self):
        self.opened = self._report()
        return self

    def stop(self):
        """Close every connection and end the process; returns how many the server dropped."""
        if self.proc.poll() is not None:
            return None
        self.proc.stdin.close()
        dropped = self._report()['dropped']
        self.proc.wait(60)
        return dropped

    def __exit__(self, *exc):
        try:
            self.stop()
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)

    def _report(self):
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError('the flood process ended with %s' % self.proc.wait(60))
        return json.loads(line)


# --- the flooding process ------------------------------------------------------

class _Client:
    def __init__(self, target, trickle):
        self.target = target
        self.trickle = trickle
        self.sent = 0
        if isinstance(target, tuple):
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        else:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        try:
            self.sock.connect(target)
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)

    def send_byte(self):
        if self.trickle and self.sent < len(HEAD):
            self.sock.send(HEAD[self.sent:self.sent + 1])
            self.sent += 1


def _parse_target(text):
    host, colon, port = text.rpartition(':')
    return (host, int(port)) if colon and port.isdigit() else text


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument('--count', type=int, required=True)
    parser.add_argument('--interval', type=float, default=0.5)
    parser.add_argument('--reconnect', action='store_true')
    parser.add_argument('targets', nargs='+')
    args = parser.parse_args(argv)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    targets = [_parse_target(t) for t in args.targets]
    selector = selectors.DefaultSelector()
    selector.register(sys.stdin, selectors.EVENT_READ)
    failed = 0
    dropped = 0

    def open_one(number):
        nonlocal failed
        try:
            client = _Client(targets[number % len(targets)], trickle=number % 2 == 0)
        except OSError:
            failed += 1
            return
        selector.register(client.sock, selectors.EVENT_READ, client)

    def clients():
        return [key.data for key in list(selector.get_map().values()) if key.data is not None]

    for number in range(args.count):
        open_one(number)
    print(json.dumps({'connected': args.count - failed, 'failed': failed}), flush=True)
    number = args.count
    next_trickle = time.monotonic()
    while True:
        for key, _ in selector.select(max(0.0, next_trickle - time.monotonic())):
            if key.fileobj is sys.stdin:        # told to stop
                for client in clients():
                    client.sock.close()
                print(json.dumps({'dropped': dropped}), flush=True)
                return 0
            client = key.data
            try:
                data = client.sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b''
            if not data:                # closed by the server, unanswered
                dropped += 1
                selector.unregister(client.sock)
                client.sock.close()
                if args.reconnect:
                    open_one(number)
                    number += 1
        if time.monotonic() >= next_trickle:
            next_trickle = time.monotonic() + args.interval
            for client in clients():
                try:
                    client.send_byte()
                except OSError:
                    pass        # a full buffer, or dropped: its end is read next turn


if __name__ == '__main__':
    sys.exit(main())
