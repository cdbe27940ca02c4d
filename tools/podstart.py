"""Pod start latency in ClusterLoader2's node-throughput shape, by hand.

    python -m tools.podstart node [--pods 100] [--rate 5] [--out FILE]     (root)
    python -m tools.podstart gate [--pods 100] [--rate 5] [--out FILE] [--kuryr-daemon]
    (either: [--shapes rate,burst], the shapes to run)

The shape: ``--pods`` pods on one node, offered at ``--rate`` pods a second,
then again as one burst (all created at once). ``node``: the node tier's node
(:mod:`tests.node.kubenode`, kubelet 1.20 + containerd 1.6), each shape run
once with the kuryr-cni daemon (and the tier's stand-in for kuryr-controller
and Neutron) and once with the reference plugins (Debian's ``bridge`` +
``host-local``), alternating, in the same run (:mod:`tests.node.bench`
switches the plugin); kuryr-cni's pods with the stand-in's steps (KuryrPort
written, plug seen, KuryrPort active) from its own clock, so that what the
stand-in control plane costs is told from what the daemon and kubelet do.
``gate``: the gate topology (:mod:`tests.gate.conftest`: the real
kube-apiserver, kuryr-controller, Neutron ML2/OVN and the node tier's node),
with each pod's steps from the systems' own records (Neutron's port created
and ACTIVE, the daemon's ADD received and answered; the KuryrPort written and
active, polled: :class:`GateSteps`); kuryr-cni only, or
with ``--kuryr-daemon`` each shape run by kuryr-cni and by kuryr-daemon
10.0.0 (``tools/openstack build-kuryr-daemon``), alternating, both behind the
kuryr-controller of kuryr-daemon's build.

Each pod's start is measured three ways, p50/p95/p99 of each printed as JSON:

``watched``
    from just before its create request to the moment a watch of the node's
    pods shows every container running (this process's monotonic clock);
``api``
    from its ``creationTimestamp`` to its ``Ready`` condition's
    ``lastTransitionTime`` (what ClusterLoader2's pod-startup measurement
    reads; the API's timestamps have a resolution of one second);
``started``
    from its ``creationTimestamp`` to its container's ``startedAt``, the
    runtime's start time as kubelet recorded it (one-second resolution too).
    kubelet 1.20's own ``kubelet_pod_start_duration_seconds`` histogram is not
    used: it is observed about twice per pod (204 observations for 102 pods,
    half of them past its last bucket, 10 s), not once at running.

Everything made (namespaces, processes, files, pods, ports) is removed on exit.
"""

import argparse
import concurrent.futures
import contextlib
import datetime
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time

SHAPES = ('rate', 'burst')
# The machine is shared: waiting longer for it to be idle would not make it so.
SETTLE_TIMEOUT = 15
# Seconds, plus 3 a pod, for a shape's pods to run and then to go: a 40-pod burst behind
# Neutron did not run in 240 s under a load average of 56.
START_TIMEOUT = 300
API_POLL = 0.2          # seconds between two polls of the gate's per-step observations


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def summary(values):
    if not values:
        return None
    return {'pods': len(values), 'p50': round(statistics.median(values), 2),
            'p95': round(percentile(values, 0.95), 2),
            'p99': round(percentile(values, 0.99), 2), 'max': round(max(values), 2)}


def _time(stamp):
    return datetime.datetime.strptime(stamp, '%Y-%m-%dT%H:%M:%SZ').replace(
        tzinfo=datetime.timezone.utc).timestamp()


def api_latency(pod):
    """creationTimestamp → the Ready condition's lastTransitionTime, in seconds."""
    ready = [c for c in pod['status'].get('conditions', ())
             if c['type'] == 'Ready' and c['status'] == 'True']
    return _time(ready[0]['lastTransitionTime']) - _time(pod['metadata']['creationTimestamp'])


def started_latency(pod):
    """creationTimestamp → the last of its containers' startedAt, in seconds."""
    started = max(_time(s['state']['running']['startedAt'])
                  for s in pod['status']['containerStatuses'])
    return started - _time(pod['metadata']['creationTimestamp'])


# One shape -------------------------------------------------------------------------------

def offer(pods, names, rate):
    """Create the pods named, at ``rate`` a second (None: all at once); ``{uid: sent}``."""
    sent = {}
    started = time.monotonic()

    def create(index_name):
        index, name = index_name
        if rate:
            delay = started + index / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)       # the offered pace, not an event to wait for
        at = time.monotonic()
        sent[pods.create(name)['metadata']['uid']] = at
    # Threads enough that a slow create request does not hold the next ones back.
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(create, enumerate(names), timeout=600))
    return sent


def run_shape(pods, clock, prefix, count, rate, observer=None, report=None):
    """One shape: the figures of its pods' starts (see the module's), given to ``report``
    before the pods are deleted (a slow delete then loses no figure)."""
    names = ['%s-%d' % (prefix, i) for i in range(count)]
    if observer:
        observer.start()
    sent = offer(pods, names, rate)
    running = pods.wait_running(names, timeout=START_TIMEOUT + 3 * count)
    deadline = time.monotonic() + 30
    while set(sent) - set(clock.running) and time.monotonic() < deadline:
        time.sleep(0.1)     # the watch is behind the list that saw them running
    watched = [clock.running[uid] - at for uid, at in sent.items() if uid in clock.running]
    read = [pods.get(name) or running[name] for name in names]
    figures = {'watched': summary(watched), 'api': summary(list(map(api_latency, read))),
               'started': summary(list(map(started_latency, read)))}
    if observer:
        figures['steps'] = observer.stop()
    if report:
        report(figures)
    for name in names:
        pods.delete(name)
    # kuryr-daemon 10.0.0 answers a DEL that comes after the pod's KuryrPort is gone only
    # once its wait for that KuryrPort times out: kubelet deletes its pods slowly.
    pods.wait_gone(names, timeout=START_TIMEOUT + 30 * count)
    return figures


def reporter(results, system, shape):
    """What takes a shape's figures: into ``results``, with the load at its start, and out."""
    key = '%s %s' % (system, shape)
    loaded = load()

    def report(figures):
        results[key] = dict(figures, load=loaded)
        print(key, json.dumps(results[key]), flush=True)
    return report


def shapes(args):
    return [(shape, args.rate if shape == 'rate' else None) for shape in args.shapes]


def load():
    return [round(n, 2) for n in os.getloadavg()]


# Each pod's steps ------------------------------------------------------------------------

class Steps:
    """Each pod's steps, in seconds after its creation request, summarised with its
    start (``Running``) and what is left of it after each step of :attr:`TO_RUNNING`.
    Subclasses say when each step of :attr:`STEPS` was seen (:meth:`_seen`);
    :meth:`start` wraps ``pods.create``, :meth:`stop` unwraps it."""

    STEPS = ()
    TO_RUNNING = ()     # steps whose "→ Running" (the rest of the pod's start) is given

    def __init__(self, pods, clock):
        self.pods = pods
        self.clock = clock
        self.sent = {}          # name -> (uid, monotonic)

    def start(self):
        original = self.pods.create

        def create(name, **kwargs):
            at = time.monotonic()
            pod = original(name, **kwargs)
            self.sent[name] = (pod['metadata']['uid'], at)
            return pod
        self.pods.create = create

    def stop(self):
        del self.pods.create
        at = self._seen()
        steps = {step: summary([seen[step] for seen in at.values() if step in seen])
                 for step in self.STEPS}
        running = {name: self.clock.running[uid] - sent
                   for name, (uid, sent) in self.sent.items() if uid in self.clock.running}
        steps['Running'] = summary(list(running.values()))
        for step in self.TO_RUNNING:
            steps['%s → Running' % step] = summary([
                running[name] - seen[step] for name, seen in at.items()
                if name in running and step in seen])
        self.sent = {}
        return steps

    def _seen(self):
        raise NotImplementedError


class NodeSteps(Steps):
    """The node tier's stand-in control plane's steps (:class:`tests.node.controller.
    Controller`'s own clock, which shares this process's): its KuryrPort written, the
    plug seen by its Neutron half, the KuryrPort marked active."""

    STEPS = ('KuryrPort written', 'plugged', 'KuryrPort active')
    TO_RUNNING = ('plugged', 'KuryrPort active')    # the ADD answers on active here

    def __init__(self, controller, pods, clock):
        super().__init__(pods, clock)
        self.controller = controller

    def _seen(self):
        at = {}
        for name, (uid, sent) in self.sent.items():
            port = self.controller.ports.get(uid)
            stamps = (port.written_at, port.plugged_seen, port.activated) if port else ()
            at[name] = {step: stamp - sent for step, stamp in zip(self.STEPS, stamps)
                        if stamp is not None}
        return at


# The node tier ---------------------------------------------------------------------------

def node_tier(args):
    from tests.k8s import cluster as k8s
    from tests.node import bench
    from tests.node import controller as kcontroller
    from tests.node import kubenode
    reason = kubenode.missing()
    if reason:
        sys.exit('cannot run: %s' % reason)
    prefix = 'kc-ps%d' % os.getpid()
    results = {}
    with k8s.serving(prefix) as cluster:
        node = kubenode.KubeNode(cluster, prefix)
        try:
            node.start_daemon()
            for plugin in ('bridge', 'host-local'):
                shutil.copy('/usr/lib/cni/' + plugin, os.path.join(node.dir, 'cni', 'bin'))
            node.wait_ready_node()
            with kubenode.pods_deleted_after(cluster, node) as pods:
                clock = bench.Clock(cluster, node)
                try:
                    for number, (shape, rate) in enumerate(shapes(args)):
                        order = ['kuryr-cni', 'reference'][::1 if number % 2 == 0 else -1]
                        for plugin in order:
                            playing = (kcontroller.Controller(cluster, node)
                                       if plugin == 'kuryr-cni' else None)
                            observer = (NodeSteps(playing, pods, clock)
                                        if playing is not None else None)
                            try:
                                bench.use(node, plugin)
                                bench.probe(pods, node, plugin)
                                bench.settle(SETTLE_TIMEOUT)
                                run_shape(pods, clock, shape, args.pods, rate, observer,
                                          report=reporter(results, plugin, shape))
                            finally:
                                if playing is not None:
                                    playing.close()
                finally:
                    clock.close()
        finally:
            node.close()
    return results


# The gate topology -----------------------------------------------------------------------

class GateSteps(Steps):
    """The gate's steps, from each system's own records where it keeps them: Neutron's
    port timestamps (to the second), the daemon's log (to the millisecond); the
    KuryrPort's, which keeps none, polled (up to :data:`API_POLL` and a listing late).
    Under load a poll of Neutron's ports and ``br-int`` took seconds and saw the early
    steps after the pod ran, which these records do not."""

    STEPS = ('port created', 'KuryrPort written', 'ADD received', 'ADD answered', 'ACTIVE',
             'KuryrPort active')
    TO_RUNNING = ('KuryrPort written', 'ADD answered')

    def __init__(self, stack, node, pods, clock):
        super().__init__(pods, clock)
        self.stack = stack
        self.node = node
        self.polled = {}        # name -> {step: monotonic}

    def start(self):
        super().start()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self):
        while not self._stop.is_set():
            try:
                items = self.stack.k8s(
                    'GET', '/apis/openstack.org/v1/namespaces/default/kuryrports')['items']
            except Exception:       # noqa: the next round reads again
                items = ()
            now = time.monotonic()
            for item in items:
                vif = (item.get('status') or {}).get('vifs', {}).get('eth0', {}).get('vif')
                if vif and item['metadata']['name'] in self.sent:
                    at = self.polled.setdefault(item['metadata']['name'], {})
                    at.setdefault('KuryrPort written', now)
                    if vif['versioned_object.data'].get('active'):
                        at.setdefault('KuryrPort active', now)
            self._stop.wait(API_POLL)

    def _seen(self):
        deadline = time.monotonic() + 120   # active comes after Running: tens of s at p99
        while time.monotonic() < deadline and any(
                len(self.polled.get(name, ())) < 2 for name in self.sent):
            time.sleep(API_POLL)
        self._stop.set()
        self._thread.join(30)
        # Wall-clock records onto this process's monotonic clock (one machine's clocks).
        offset = time.time() - time.monotonic()
        ports = {p['device_id']: p for p in self.stack.neutron('GET', '/ports')['ports']}
        adds = {}
        for match in ADD_LINE.finditer(self.node.daemon_log()):
            answered = datetime.datetime.strptime(match['at'], LOG_TIME).timestamp() - offset
            adds.setdefault(match['name'], []).append(
                (answered - float(match['seconds']), answered))
        at = {}
        for name, (uid, sent) in self.sent.items():
            seen = at[name] = {step: stamp - sent
                               for step, stamp in self.polled.get(name, {}).items()}
            port = ports.get(uid)
            if port is not None:
                seen['port created'] = _time(port['created_at']) - offset - sent
                if port['status'] == 'ACTIVE':
                    seen['ACTIVE'] = _time(port['updated_at']) - offset - sent
            # This pod's ADD, not an earlier one's of its name (another shape's).
            answers = [add for add in adds.get(name, ()) if add[0] >= sent]
            if answers:
                seen['ADD received'], seen['ADD answered'] = (
                    stamp - sent for stamp in answers[0])
        self.polled = {}
        return at


# The daemon's log line for a successful ADD (kuryr_cni.daemon.api), local time.
ADD_LINE = re.compile(r'^(?P<at>\S+ \S+) \d+ INFO kuryr_cni\.daemon\.api \[[^]]*\] ADD pod '
                      r'default/(?P<name>\S+) container \S+ ifname \S+: success \(code 0\) '
                      r'in (?P<seconds>[\d.]+) s$', re.MULTILINE)
LOG_TIME = '%Y-%m-%d %H:%M:%S.%f'       # oslo.log's log_date_format, and its msecs


def gate_tier(args):
    from tests.gate import conftest as gate
    from tests.node import bench
    from tests.node import kubenode
    from tests.openstack import stack as osstack
    reason = kubenode.missing() or osstack.missing() or (
        args.kuryr_daemon and upstream_missing())
    if reason:
        sys.exit('cannot run: %s' % reason)
    prefix = 'kc-pg%d' % os.getpid()
    results = {}
    workdir = tempfile.mkdtemp(prefix='kc-podstart-')
    try:
        stack = osstack.Stack(workdir, prefix + '-osp', kubenode.NODE_NAME)
        try:
            if args.kuryr_daemon:
                # Both daemons behind the kuryr-controller its release was deployed with.
                stack.swap_controller('kuryr-daemon')
            cluster = gate.StackCluster(stack)
            stack.k8s('DELETE', '/api/v1/nodes/' + kubenode.NODE_NAME)
            node = kubenode.KubeNode(cluster, prefix, netns=stack.netns)
            upstream = None
            try:
                ovs_run = os.path.join(node.dir, 'mnt', 'run', 'openvswitch')
                os.makedirs(ovs_run, exist_ok=True)
                os.symlink(stack.env['OVSDB'].split(':', 1)[1],
                           os.path.join(ovs_run, 'db.sock'))
                node.start_daemon()
                node.wait_ready_node()
                if args.kuryr_daemon:
                    upstream = KuryrDaemonOnNode(stack, node)
                with kubenode.pods_deleted_after(cluster, node) as pods:
                    clock = bench.Clock(cluster, node)
                    try:
                        for number, (shape, rate) in enumerate(shapes(args)):
                            systems = ['kuryr-cni'] + (['kuryr-daemon'] if upstream else [])
                            for system in systems[::1 if number % 2 == 0 else -1]:
                                if upstream:
                                    upstream.use(system == 'kuryr-daemon', pods)
                                run_shape(pods, clock, shape, args.pods, rate,
                                          GateSteps(stack, node, pods, clock),
                                          reporter(results, system, shape))
                    except BaseException:
                        if upstream and upstream.in_use:
                            print(upstream.daemon.log_tail(80), file=sys.stderr)
                        raise
                    finally:
                        clock.close()
            finally:
                if upstream:
                    upstream.close()
                node.close()
                cluster.close()
        finally:
            stack.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def upstream_missing():
    from tools.bench import upstream
    return upstream.missing()


class KuryrDaemonOnNode:
    """kuryr-daemon 10.0.0 as the gate node's CNI, in place of kuryr-cni when in use: in
    the node's namespaces (where the runtime's pod namespaces are), its ``kuryr-cni``
    executable under a network file that sorts before the shipped one, so that
    containerd picks it while it is there."""

    CONFLIST = '05-kuryr-daemon.conflist'

    def __init__(self, stack, node):
        from tests.node import kubenode
        from tools.bench import upstream
        from tools.testbed import kuryr_daemon as testkuryr
        self.node = node
        self.daemon = testkuryr.KuryrDaemon(
            upstream.build(), stack.netns, node.name, stack.env, stack.env['K8S_ADMIN_TOKEN'],
            debug=False, launcher=[kubenode.TOOL, 'run', node.dir, '--unit', 'kuryr-daemon'])
        self.calls = os.path.join(self.daemon.dir, 'calls')
        self.conflist = os.path.join(node.dir, 'cni', 'net.d', self.CONFLIST)
        executable = os.path.join(node.dir, 'cni', 'bin', 'kuryr-daemon-cni')
        with open(executable, 'w') as f:
            # Each call counted, for the probe that says containerd switched.
            f.write('#!/bin/sh\necho "$CNI_COMMAND" >>%s\nexec %s\n'
                    % (self.calls, os.path.join(self.daemon.venv, 'bin', 'kuryr-cni')))
        os.chmod(executable, 0o755)
        self.network = {'cniVersion': '0.3.1', 'name': 'kuryr', 'plugins': [
            {'type': 'kuryr-daemon-cni', 'kuryr_conf': self.daemon.conf, 'debug': False}]}
        self.in_use = False

    def use(self, wanted, pods):
        """Make kuryr-daemon (``wanted``) or kuryr-cni the node's CNI; until a pod shows it."""
        if wanted == self.in_use:
            return
        if wanted:
            self.node.stop_daemon()
            self.daemon.start()
            with open(self.conflist + '.tmp', 'w') as f:
                json.dump(self.network, f)
            os.rename(self.conflist + '.tmp', self.conflist)
        else:
            self.daemon.stop()
            os.unlink(self.conflist)
            self.node.start_daemon()
        self.in_use = wanted
        for attempt in range(10):
            before = self._adds()
            name = 'probe-%d' % attempt
            pods.create(name)
            pods.wait_running([name], timeout=START_TIMEOUT)
            pods.delete(name)
            pods.wait_gone([name], timeout=START_TIMEOUT)
            if (self._adds() > before) == wanted:
                return
        raise AssertionError('containerd did not switch to %s'
                             % ('kuryr-daemon' if wanted else 'kuryr-cni'))

    def _adds(self):
        try:
            with open(self.calls) as f:
                return f.read().split().count('ADD')
        except FileNotFoundError:
            return 0

    def close(self):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.conflist)
        self.daemon.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('tier', choices=('node', 'gate'))
    parser.add_argument('--pods', type=int, default=100)
    parser.add_argument('--rate', type=float, default=5.0, help='pods offered a second')
    parser.add_argument('--out')
    parser.add_argument('--shapes', type=lambda text: text.split(','), default=SHAPES,
                        help='which of rate,burst (default: both, in that order)')
    parser.add_argument('--kuryr-daemon', action='store_true',
                        help='gate: kuryr-daemon 10.0.0 too, each shape run by both')
    args = parser.parse_args(argv)
    started = time.monotonic()
    results = (node_tier if args.tier == 'node' else gate_tier)(args)
    report = {'tier': args.tier, 'pods': args.pods, 'rate': args.rate,
              'seconds': round(time.monotonic() - started), 'results': results}
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == '__main__':
    main()
