"""Observations the functional tests make of a running test host."""

import contextlib
import functools
import json
import os
import re
import select
import signal
import subprocess
import threading
import time
import uuid

import pytest

from prometheus_client import parser

from kuryr_cni import state
from kuryr_cni.binding import owner_tag
from tools.testbed import host as testhost
from tools.testbed import runtime as testruntime

from tests import conftest
from tests import wait

PROMETHEUS_PORT = 9655


def scrape(node):
    """Every sample of /metrics as ``{(name, frozenset(labels)): value}``."""
    status, text = node.http_get(PROMETHEUS_PORT, '/metrics')
    assert status == 200, '%s\n%s' % (text, node.log_tail())
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in parser.text_string_to_metric_families(text)
            for sample in family.samples}


def metric(node, name, **labels):
    return scrape(node).get((name, frozenset(labels.items())), 0)


def stale_dels(node):
    samples = scrape(node)
    return {reason: samples.get(('kuryr_cni_stale_del_rejected_total',
                                 frozenset({('reason', reason)})), 0)
            for reason in ('container_id_mismatch', 'pod_uid_mismatch')}


def binding(node, pod_key):
    path = os.path.join(node.state_dir, 'bindings', state.file_stem(pod_key) + '.json')
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def make_pods(node, indexes, active=True):
    """Pods numbered ``indexes`` in the API stand-in, their VIFs published (and
    ``active``); returns a sandbox of each, in a network namespace of its own."""
    sandboxes = []
    for index in indexes:
        name = 'pod-%d' % index
        node.api.create_pod('default', name, testhost.NODE, uid='uid-%d' % index,
                            annotations={'kuryr.openstack.org/vifs':
                                         json.dumps(node.vifs(index, active))})
        sandboxes.append(testruntime.Sandbox('cid-%d' % index, node.pod_netns(), name,
                                             pod_uid='uid-%d' % index))
    return sandboxes


def add_in_background(pool, node, runtime, sandbox, published=True):
    """Submit ``sandbox``'s ADD to ``pool`` and return its future once it waits.

    ``published``: the pod's VIFs are published already (inactive), so the ADD
    claims the pod, plugs, and waits for them to be active: return once its
    plugged attachment is recorded. Otherwise return once the daemon serves
    the ADD (it waits for the VIFs to be published, claiming nothing yet).
    """
    future = pool.submit(runtime.add, sandbox)
    if published:
        wait_for_plugged(node, '%s/%s' % (sandbox.pod_namespace, sandbox.pod_name),
                         sandbox.container_id)
    else:
        wait.until(lambda: metric(node, 'kuryr_cni_requests_in_flight') >= 1, 20,
                   'the ADD of %s to reach the daemon' % sandbox.container_id)
    return future


def wait_for_plugged(node, pod_key, container_id, timeout=20):
    """Wait until ``container_id`` owns the pod and its attachments are recorded plugged."""
    def plugged():
        current = binding(node, pod_key)
        if not current or current.get('owner') != container_id:
            return None
        attachments = current['sandboxes'][container_id]['attachments'].values()
        return current if attachments and all(a['state'] == 'ready' for a in attachments) \
            else None
    return wait.until(plugged, timeout,
                      '%s to own and have plugged %s' % (container_id, pod_key))


def leftovers(node):
    """What a deleted pod could leave behind: tagged host devices, bindings, locks."""
    devices = sorted(name for name, link in node.links().items()
                     if owner_tag.parse_alias(link.get('ifalias') or ''))
    # Files set aside (``.corrupt-<time>``) are kept for the operator on purpose.
    bindings = sorted(n for n in os.listdir(os.path.join(node.state_dir, 'bindings'))
                      if '.corrupt-' not in n)
    locks = sorted(os.listdir(os.path.join(node.state_dir, 'locks')))
    return {'devices': devices, 'bindings': bindings, 'locks': locks}


NOTHING = {'devices': [], 'bindings': [], 'locks': []}


@functools.lru_cache(maxsize=None)
def kernel_lacks(kind):
    """Why this kernel cannot make a ``kind`` link (``vlan``, ``macvlan``), or None.

    Tried once per session in a throwaway namespace, on a veth (some
    kernels have no dummy module either). The reason says the vm tier runs
    the test on a guest kernel that can (tests/vm/test_kernel.py runs every
    file that calls this, and fails if any of its tests skips there).
    """
    name = 'kc-probe-%s' % uuid.uuid4().hex[:8]
    subprocess.run(['ip', 'netns', 'add', name], check=True, capture_output=True, timeout=30)
    try:
        subprocess.run(['ip', '-n', name, 'link', 'add', 'p0', 'type', 'veth', 'peer', 'name',
                        'p1'], check=True, capture_output=True, timeout=30)
        extra = ['id', '5'] if kind == 'vlan' else ['mode', 'bridge']
        proc = subprocess.run(['ip', '-n', name, 'link', 'add', 'link', 'p0', 'name', 'probe',
                               'type', kind, *extra], capture_output=True, text=True, timeout=30)
        if proc.returncode:
            return '%sthis kernel cannot create %s links (%s)' % (
                conftest.VM_TIER, kind, proc.stderr.strip())
        return None
    finally:
        subprocess.run(['ip', 'netns', 'delete', name], capture_output=True, timeout=30)


def wait_gone(pidfds, timeout):
    """Wait for the processes behind ``{pid: pidfd}`` to end; returns survivors' pids."""
    poller = select.poll()
    by_fd = {}
    for pid, fd in pidfds.items():
        poller.register(fd, select.POLLIN)
        by_fd[fd] = pid
    deadline = time.monotonic() + timeout
    while by_fd and time.monotonic() < deadline:
        for fd, _ in poller.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            poller.unregister(fd)
            os.close(fd)
            del by_fd[fd]
    for fd in by_fd:
        os.close(fd)
    return sorted(by_fd.values())


def assert_connected(node, sandbox, index):
    """``sandbox`` has exactly its eth0, with its address, bridged, pinging the gateway."""
    links = node.links(sandbox.netns)
    assert set(links) == {'lo', 'eth0'}, links.keys()
    assert node.addresses(sandbox.netns, 'eth0') == {'10.10.0.%d/24' % index}
    host_end = node.links()[owner_tag.host_ifname(sandbox.container_id, 'eth0')]
    assert host_end.get('ifalias') == owner_tag.alias(sandbox.container_id, 'eth0')
    assert host_end.get('master') == node.links()[testhost.BRIDGE]['index']
    assert node.ping(sandbox.netns, testhost.GATEWAY)


def node_config(node, api=True, token=None):
    """A config file of what must differ in a throwaway namespace; its path.

    Where the socket, the state and the log go; with ``api`` the API server
    (the stand-in in ``node``), with ``token`` a file holding it. Given with a
    config under test, it leaves every other option to that one.
    """
    path = os.path.join(node.workdir, 'node.conf')
    with open(path, 'w') as f:
        f.write('[DEFAULT]\nlog_file = %s\n[cni_daemon]\nsocket = %s\nstate_dir = %s\n'
                % (os.path.join(node.workdir, 'daemon.log'), node.socket, node.state_dir))
        if api:
            f.write('[kubernetes]\napi_root = %s\n' % node.api.url)
        if token:
            token_file = os.path.join(node.workdir, 'token')
            with open(token_file, 'w') as t:
                t.write(token + '\n')
            f.write('token_file = %s\n' % token_file)
    return path


@contextlib.contextmanager
def sandbox_process(sandbox, pod_uid):
    """A process in ``sandbox``'s namespace, in a cgroup named as containerd names the
    sandbox's (``.../pod<uid>/cri-containerd-<id>.scope``); all removed after."""
    roots = [r for r in ('/sys/fs/cgroup/pids', '/sys/fs/cgroup')
             if os.path.exists(os.path.join(r, 'cgroup.procs'))]
    if not roots:
        pytest.skip('no writable cgroup hierarchy to name a sandbox process by')
    top = os.path.join(roots[0], 'kc-test-%s' % uuid.uuid4().hex[:8])
    leaf = os.path.join(top, 'kubepods', 'pod' + pod_uid,
                        'cri-containerd-%s.scope' % sandbox.container_id)
    os.makedirs(leaf)
    proc = subprocess.Popen(['ip', 'netns', 'exec', os.path.basename(sandbox.netns),
                             'sleep', '600'], stdin=subprocess.DEVNULL)
    try:
        with open(os.path.join(leaf, 'cgroup.procs'), 'w') as f:
            f.write(str(proc.pid))
        yield proc
    finally:
        proc.kill()
        proc.wait(30)
        for path in (leaf, os.path.dirname(leaf), os.path.dirname(os.path.dirname(leaf)), top):
            os.rmdir(path)


class Pinger:
    """``ping -i 0.1`` of ``address`` from a namespace until :meth:`stop`, which
    returns (sent, lost): how many requests it counted, and how many of them were
    never answered.

    ping itself counts a request still in flight when it is interrupted as lost,
    so under load a clean run could fail. stop instead waits for the reply to a
    request sent after it was called (its send time is the reply's time less its
    round trip), then counts only the unanswered requests up to that one; with no
    such reply within ``within`` seconds, every unanswered request is lost.
    """

    REPLY = re.compile(r'^\[(\d+\.\d+)\] .*icmp_seq=(\d+) .*time=([\d.]+) ms')
    NO_ANSWER = re.compile(r'no answer yet for icmp_seq=(\d+)')
    SUMMARY = re.compile(r'(\d+) packets transmitted, (\d+) received')

    def __init__(self, netns, address):
        # -D: each line stamped with its time; -O: a line for each request
        # unanswered when the next is sent.
        self.proc = subprocess.Popen(['ip', 'netns', 'exec', os.path.basename(netns), 'ping',
                                      '-D', '-O', '-i', '0.1', address],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines = []                     # ping's output so far
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()

    def answered(self):
        """``{icmp_seq: send time}`` of the requests answered so far."""
        found = (self.REPLY.search(line) for line in list(self.lines))
        return {int(m.group(2)): float(m.group(1)) - float(m.group(3)) / 1000
                for m in found if m}

    def unanswered(self):
        """The icmp_seq of each request unanswered when the next one was sent."""
        return {int(m.group(1)) for m in map(self.NO_ANSWER.search, list(self.lines)) if m}

    def stop(self, within=5):
        called = time.time()
        with self._changed:
            caught_up = self._changed.wait_for(
                lambda: any(sent > called for sent in self.answered().values()), within)
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(30)
        self._reader.join(30)
        match = self.SUMMARY.search(''.join(self.lines))
        assert match, ''.join(self.lines)
        sent, answered = int(match.group(1)), self.answered()
        if not caught_up:
            return sent, sent - len(answered)
        last = max(answered)
        return last, len(set(range(1, last + 1)) - set(answered))
