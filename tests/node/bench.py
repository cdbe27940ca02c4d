"""Pod start time on a real node: kuryr-cni against the reference plugins, alternating.

    python -m tests.node.bench [--sizes 30 110] [--passes 2] [--split] [--out FILE]   (root)

The node tier's node (:mod:`tests.node.kubenode`, kubelet's API rate limit
raised as in the tier) runs bursts of pods created at once, each burst with
one plugin: the kuryr-cni daemon as shipped (with the tier's kuryr-controller
and Neutron stand-in, :mod:`tests.node.controller`), or Debian's ``bridge`` +
``host-local`` (containernetworking-plugins) on a bridge of their own. The
plugin is switched between bursts by adding or removing the reference
conflist, which sorts before kuryr-cni's (containerd uses the first); a probe
pod proves the switch before each burst, and the burst waits for the
machine's CPUs to settle first. Bursts alternate plugins, and the first
plugin alternates between passes; before the two bursts of a size, an
uncounted one of that size warms the node up to it.

With ``--split``, the control plane (kube-apiserver, etcd, this process with
the stand-in for kuryr-controller and Neutron) runs on the first CPU and the
node (containerd, kubelet, the pods, the daemon) on the others, as on a real
cluster, where the control plane is not on the node; without it, all share
every CPU.

A pod's start time is from the moment its create request is sent to the
moment a watch of the node's pods shows all its containers running, both on
this process's monotonic clock. Printed as JSON (and written to ``--out``):
per plugin and burst size, p50, p95 and max over every pod of every pass;
and, per burst, the CPU seconds each process used until its pods ran.
"""

import argparse
import concurrent.futures
import ipaddress
import json
import os
import shutil
import statistics
import sys
import threading
import time

from kubernetes import client
from kubernetes import watch

from tests.k8s import cluster as k8s
from tests.node import controller as kcontroller
from tests.node import kubenode

REFERENCE = '05-reference.conflist'
SETTLE_WINDOW = 1.0         # seconds of CPU use looked at by settle()
QUIET = 0.15                # the busy share of them that counts as settled
TICK = os.sysconf('SC_CLK_TCK')     # /proc's CPU times are counted in these
REFERENCE_SUBNET = '10.20.0.0/16'
REFERENCE_CONFLIST = {
    'cniVersion': '1.0.0', 'name': 'reference',
    'plugins': [{'type': 'bridge', 'bridge': 'ref-br0', 'isGateway': True,
                 'ipam': {'type': 'host-local', 'ranges': [[{'subnet': REFERENCE_SUBNET}]]}}]}


class Clock:
    """When each pod of the node was first seen running, from a watch."""

    def __init__(self, cluster, node):
        self.cluster = cluster
        self.node = node
        self.running = {}
        self._stop = threading.Event()
        self._done = cluster.submit(self._watch)

    def _watch(self):
        api = client.CoreV1Api(self.cluster.api)
        while not self._stop.is_set():
            for event in watch.Watch().stream(
                    api.list_namespaced_pod, 'default', timeout_seconds=5,
                    field_selector='spec.nodeName=' + self.node.name, deserialize=False):
                pod = event['object']
                if kubenode.is_running(pod):
                    self.running.setdefault(pod['metadata']['uid'], time.monotonic())
                if self._stop.is_set():
                    return

    def close(self):
        self._stop.set()
        self._done.result(30)


def use(node, plugin):
    path = os.path.join(node.dir, 'cni', 'net.d', REFERENCE)
    if plugin == 'reference':
        with open(path + '.tmp', 'w') as f:
            json.dump(REFERENCE_CONFLIST, f)
        os.rename(path + '.tmp', path)
    elif os.path.exists(path):
        os.unlink(path)


def probe(pods, node, plugin):
    """Until a pod gets its address from ``plugin``: containerd has reloaded its config."""
    subnet = ipaddress.ip_network(REFERENCE_SUBNET if plugin == 'reference'
                                  else kcontroller.SUBNET)
    for attempt in range(10):
        name = 'probe-%d' % attempt
        pods.create(name)
        pod = pods.wait_running([name], timeout=120)[name]
        pods.delete(name)
        pods.wait_gone([name])
        if ipaddress.ip_address(pod['status']['podIP']) in subnet:
            return
    raise AssertionError('containerd did not switch to %s' % plugin)


def busy():
    """The machine's CPU ticks ``(busy, all)`` so far, from /proc/stat."""
    with open('/proc/stat') as f:
        ticks = [int(n) for n in f.readline().split()[1:8]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)     # idle and iowait are not busy


def cpu_by_process():
    """CPU seconds used so far by each live process, with the children it has waited
    for (containerd's include the CNI plugins it ran): ``{pid: (name, seconds)}``.
    The daemon's processes are named by their titles, the kernel's work-queue
    threads together as ``kworker``."""
    seen = {}
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open('/proc/%s/stat' % pid) as f:
                stat = f.read()
            name = stat[stat.index('(') + 1:stat.rindex(')')]
            if name.startswith('kuryr-cni'):
                with open('/proc/%s/cmdline' % pid) as f:
                    name = f.read().split('\0')[0].split(' [')[0]     # the title alone
            elif name.startswith('kworker/'):
                # Renamed after each work item: by name, one would count its life's CPU.
                name = 'kworker'
        except OSError:         # gone meanwhile
            continue
        fields = stat[stat.rindex(')') + 2:].split()
        seen[int(pid)] = (name, sum(int(n) for n in fields[11:15]) / TICK)
    return seen


def cpu_used(before, after):
    """CPU seconds per process name between two :func:`cpu_by_process` readings."""
    used = {}
    for pid, (name, seconds) in after.items():
        earlier = before.get(pid)
        spent = seconds - earlier[1] if earlier and earlier[0] == name else seconds
        used[name] = round(used.get(name, 0) + spent, 2)
    return dict(sorted(used.items(), key=lambda item: -item[1]))


def settle(timeout=60):
    """Until the machine's CPUs are mostly idle for a while (or ``timeout``): what the
    previous burst left running (sandbox teardown, namespaces the kernel frees
    later, the control plane's deletions) must not weigh on the next one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = busy()
        time.sleep(SETTLE_WINDOW)
        after = busy()
        if after[0] - before[0] <= QUIET * (after[1] - before[1]):
            return
    print('the machine did not settle in %d s' % timeout, flush=True)


def burst(cluster, node, pods, clock, size):
    names = ['bench-%d' % i for i in range(size)]
    sent = {}

    def create(name):
        started = time.monotonic()
        pod = pods.create(name)
        sent[pod['metadata']['uid']] = started
    cpu_before, busy_before = cpu_by_process(), busy()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(create, names, timeout=300))
    pods.wait_running(names, timeout=60 + 3 * size)
    deadline = time.monotonic() + 30
    while set(sent) - set(clock.running) and time.monotonic() < deadline:
        time.sleep(0.1)
    busy_after = busy()
    cpu = cpu_used(cpu_before, cpu_by_process())
    cpu['(all)'] = round((busy_after[0] - busy_before[0]) / TICK, 2)
    latencies = [clock.running[uid] - started for uid, started in sent.items()]
    for name in names:
        pods.delete(name)
    pods.wait_gone(names, timeout=300)
    return latencies, cpu


def run(cluster, node, pods, clock, plugin, size):
    """One burst with ``plugin``; the controller plays its part for kuryr-cni's only, so
    that the reference plugins' bursts share the node with nothing of kuryr's but the
    idle daemon."""
    playing = kcontroller.Controller(cluster, node) if plugin == 'kuryr-cni' else None
    try:
        use(node, plugin)
        probe(pods, node, plugin)
        settle()
        return burst(cluster, node, pods, clock, size)
    finally:
        if playing is not None:
            playing.close()


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def summary(values):
    return {'pods': len(values), 'p50': round(statistics.median(values), 2),
            'p95': round(percentile(values, 0.95), 2), 'max': round(max(values), 2)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--sizes', type=int, nargs='+', default=[30, 110])
    parser.add_argument('--passes', type=int, default=2)
    parser.add_argument('--out')
    parser.add_argument('--split', action='store_true',
                        help='the control plane on the first CPU, the node on the others')
    args = parser.parse_args(argv)
    reason = kubenode.missing()
    if reason:
        sys.exit('cannot run: %s' % reason)
    cpus = sorted(os.sched_getaffinity(0))
    control, on_node = ({cpus[0]}, set(cpus[1:])) if args.split else (set(cpus), set(cpus))
    if not on_node:
        sys.exit('--split needs two CPUs')
    # Processes and threads take the CPUs of the thread that starts them.
    os.sched_setaffinity(0, control)
    cluster = k8s.Cluster('kc-nb%d' % os.getpid())
    node = None
    results = {}
    cpu_seconds = {}
    try:
        cluster.apply_daemonset_rbac()
        cluster.install_kuryrport_crd()
        os.sched_setaffinity(0, on_node)
        try:
            node = kubenode.KubeNode(cluster, 'kc-nb%d' % os.getpid())
            node.start_daemon()
        finally:
            os.sched_setaffinity(0, control)
        for plugin in ('bridge', 'host-local'):
            shutil.copy('/usr/lib/cni/' + plugin, os.path.join(node.dir, 'cni', 'bin'))
        node.wait_ready_node()
        pods = kubenode.Pods(cluster, node)
        clock = Clock(cluster, node)
        try:
            for number in range(args.passes):
                order = ['kuryr-cni', 'reference'][::1 if number % 2 == 0 else -1]
                for size in args.sizes:
                    # Uncounted: the first burst of a size after another size is the
                    # slower of its pair, whichever plugin runs it (10 pairs of 12);
                    # after this one, both counted bursts follow one of their size.
                    print('warm-up, %s, %d pods: %s' % (order[-1], size, summary(
                        run(cluster, node, pods, clock, order[-1], size)[0])), flush=True)
                    for plugin in order:
                        latencies, cpu = run(cluster, node, pods, clock, plugin, size)
                        key = '%s %d' % (plugin, size)
                        results.setdefault(key, []).extend(latencies)
                        cpu_seconds.setdefault(key, []).append(cpu)
                        print('pass %d, %s, %d pods: %s\n  CPU seconds: %s' % (
                            number + 1, plugin, size, summary(latencies),
                            dict(list(cpu.items())[:12])), flush=True)
        finally:
            clock.close()
    finally:
        if node is not None:
            node.close()
        cluster.close()
    report = {key: summary(values) for key, values in results.items()}
    print(json.dumps(report, indent=2))
    if args.out:
        with open(args.out, 'w') as f:
            json.dump({'summary': report, 'latencies': results, 'cpu_seconds': cpu_seconds},
                      f, indent=1)


if __name__ == '__main__':
    main()
