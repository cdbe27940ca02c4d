"""kuryr-daemon 10.0.0, upstream's last release, as a third system under test.

It runs from the virtualenv ``tools/openstack build-kuryr-daemon`` built (its
own pins: pyroute2 0.7.12, os-vif 3.5.0; never rebuilt here) on a test host of
its own, logging as a production node did (no debug), started by
:class:`tools.testbed.kuryr_daemon.KuryrDaemon`. It reads its VIFs from
KuryrPort objects, which the host's wire-level Kubernetes API stand-in serves
(list, watch, label selector: what its watchers ask for; a bearer token, as its
``token_file`` must name one). Before any ADD each pod and its KuryrPort
exist, the KuryrPort already carrying an active ``VIFBridge`` (plugin
``linux_bridge``) with the same MAC, address, MTU and bridge as kuryr-cni's
bridge-kind VIF for the same pod index: both daemons plug it alike, a veth
whose host end joins the host's Linux bridge; no Open vSwitch is involved.

Every sandbox is a new pod: its own network namespace, pod and KuryrPort
(``pod-<index>-g<generation>``, the VIF still pod index's), and after its DEL
the runtime's and kuryr-controller's part is done, untimed: the namespace
removed (which takes the veth kuryr-daemon's DEL leaves), then the pod and
KuryrPort deleted. kuryr-daemon keys everything on the pod's name; a later
sandbox on the same pod's KuryrPort and namespace would find the last one's
devices there, a path of its own no other system takes.

The runtime execs its own ``kuryr-cni`` executable (a Python program: its
import of os-vif and oslo is paid on every operation) with a 10.0.0 node's
network entry; it answers in CNI 0.3.1 whatever the config says.
"""

import contextlib
import json
import re
import os
import subprocess
import time

from tools.bench import systems as systems_mod
from tools.testbed import host as testhost
from tools.testbed import kuryr_daemon as testkuryr

CONSTRAINTS = os.path.join(systems_mod.driver_mod.REPO, 'tools',
                           'kuryr-daemon-constraints.txt')
CNI_VERSION = '0.3.1'     # what kuryr-cni 10.0.0 answers in
TOKEN = 'kc-bench-token'
NETWORK_ID = 'b9b2c6a4-1f0c-4d4c-8c0e-2a7d5f1e9c33'
# A forked Python process per request, ~2.4 s of CPU per ADD: at concurrency 50 on a
# loaded two-core machine one ADD waits minutes for the other 49.
OP_TIMEOUT = 900
LEFTOVER_GRACE = 30     # seconds
ATTEMPTS = 4            # tries of an operation, as a runtime retries a failed sandbox
# The last line of a traceback it logs: the exception's class.
DAEMON_ERROR = re.compile(r' ERROR kuryr-daemon ([\w.]+(?:Error|Exception|Interrupted)): ')
LOG_KEPT = 60           # lines of its log quoted when an operation fails


def build():
    """The prebuilt kuryr-daemon virtualenv's directory, or None when there is none."""
    cache = (os.environ.get('OPENSTACK_CACHE')
             or os.path.join(systems_mod.driver_mod.REPO, '.cache', 'openstack'))
    path = testkuryr.build_dir(cache, CONSTRAINTS)
    return path if os.path.exists(os.path.join(path, 'complete')) else None


def missing():
    """Why kuryr-daemon cannot run here, or None when it can."""
    if build() is None:
        return ('kuryr-daemon 10.0.0 is not built (tools/openstack build-kuryr-daemon, '
                'with OPENSTACK_CACHE set to its cache)')
    return None


def _obj(name, data, version='1.0'):
    return {'versioned_object.name': name, 'versioned_object.namespace': 'os_vif',
            'versioned_object.version': version, 'versioned_object.data': data}


def vif_bridge(vif):
    """kuryr-cni's bridge-kind VIF ``vif`` as the os-vif primitive kuryr-controller writes."""
    address, prefix = vif['ips'][0].split('/')
    octets = address.split('.')
    cidr = '%s.%s.0.0/%s' % (octets[0], octets[1], prefix)
    subnet = _obj('Subnet', {
        'cidr': cidr, 'dns': [], 'gateway': vif['gateway'],
        'ips': _obj('FixedIPList', {'objects': [_obj('FixedIP', {'address': address})]}),
        'routes': _obj('RouteList', {'objects': []})})
    network = _obj('Network', {
        'id': NETWORK_ID, 'bridge': vif['bridge'], 'label': 'ns/default-net',
        'mtu': vif['mtu'], 'multi_host': False, 'should_provide_bridge': False,
        'should_provide_vlan': False, 'subnets': _obj('SubnetList', {'objects': [subnet]})},
        version='1.1')
    return _obj('VIFBridge', {
        'active': True, 'address': vif['mac'], 'bridge_name': vif['bridge'],
        'has_traffic_filtering': False, 'id': vif['port_id'], 'network': network,
        'plugin': 'linux_bridge', 'preserve_on_delete': False,
        # Its host end's name: 'tap' and the port ID, at most 14 characters, as Neutron's.
        'vif_name': ('tap' + vif['port_id'])[:14]})


def _error(result):
    """The last line of what a failed kuryr-cni run said (its exception), or its stderr."""
    try:
        answer = json.loads(result['stdout'])
        text = answer.get('details') or answer.get('msg') or ''
    except ValueError:
        text = result['stdout'] or result['stderr']
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else 'exit %d' % result['code'])[:300]


class _Session:
    """What :func:`tools.bench.memory.daemon_pss` reads: the daemon's processes."""

    def __init__(self, daemon):
        self.daemon = daemon

    def processes(self):
        # Its session: the parent, cotyledon's workers, the watchers, the privsep
        # helper os-vif starts (started by the daemon, so in its session).
        out = subprocess.run(['ps', '-o', 'pid=,args=', '-s', str(self.daemon.process.pid)],
                             capture_output=True, text=True, timeout=10).stdout
        return {int(line.split(None, 1)[0]): _title(line.split(None, 1)[1])
                for line in out.strip().splitlines()}


def _title(args):
    """A short role for a kuryr-daemon process (its own titles are the command line)."""
    if 'privsep-helper' in args:
        return 'privsep-helper'
    if args.startswith('ip netns exec'):
        return 'ip netns exec'
    return args.split('--config-file')[0].strip().rsplit('/', 1)[-1] or args


class KuryrDaemonSystem(systems_mod.System):
    name = 'kuryr_daemon'
    label = 'kuryr-daemon 10.0.0'

    def __init__(self):
        host = testhost.Host(prefix='kc-bench')
        self.daemon = None
        try:
            host.start_api(token=TOKEN)
            token_file = os.path.join(host.workdir, 'token')
            with open(token_file, 'w') as f:
                f.write(TOKEN)
            self.daemon = testkuryr.KuryrDaemon(build(), host.ns, testhost.NODE,
                                                {'K8S_URL': host.api.url, 'OVSDB': 'unix:'},
                                                token_file, debug=False)
            self.daemon.start()
            executable = os.path.join(self.daemon.venv, 'bin', 'kuryr-cni')
            netconf = {'cniVersion': CNI_VERSION, 'name': 'kuryr', 'type': 'kuryr-cni',
                       'kuryr_conf': self.daemon.conf, 'debug': False}
            super().__init__(host, executable, netconf, '/opt/cni/bin')
        except BaseException:
            if self.daemon is not None:
                self.daemon.close()
            host.close()
            raise
        self.session = _Session(self.daemon)
        self.op_timeout = OP_TIMEOUT
        self.failures = []

    def sandboxes(self, indexes, generation):
        """A new pod per sandbox: its namespace, pod and KuryrPort (pod ``index``'s VIF)."""
        made = []
        for index in indexes:
            sandbox = systems_mod.Sandbox(
                '%s-g%d-%d' % (self.name, generation, index), self.host.pod_netns(),
                'pod-%d-g%d' % (index, generation), 'uid-%d-g%d' % (index, generation))
            self.host.api.create_pod('default', sandbox.pod_name, testhost.NODE,
                                     uid=sandbox.pod_uid)
            vif = systems_mod.bridge_vifs(index)['eth0']
            self.host.api.create_kuryrport(
                'default', sandbox.pod_name, testhost.NODE,
                spec={'podUid': sandbox.pod_uid, 'podStatic': False,
                      'podNodeName': testhost.NODE},
                status={'vifs': {'eth0': {'default': True, 'vif': vif_bridge(vif)}}})
            made.append(sandbox)
        return made

    def run(self, command, sandboxes, concurrency=1):
        """As :meth:`System.run`, but a failed operation is retried as a runtime retries it.

        Under concurrent ADDs kuryr-daemon 10.0.0 fails some of them (its
        pyroute2 0.7 IPDB raises ``NetlinkDumpInterrupted`` when a link dump
        meets a concurrent change; its daemon answers 500, its executable exits
        with code 100). kubelet would tear the sandbox down (DEL, namespace
        removed) and start the pod a new one: the failed ops are run so, once
        the batch is over, one at a time (retried at concurrency, they meet each
        other's link changes and fail again), up to ``ATTEMPTS`` times in all; the wall time, CPU
        and each op's seconds include the retries, and each failure is kept in
        :attr:`failures`. An op failing every attempt fails the run.
        """
        user_before, sys_before = self.service_cpu()
        wall, results = self.driver.run([self.op(command, s) for s in sandboxes], concurrency)
        plugin = self.driver.cpu
        seconds = [r['seconds'] for r in results]
        failed = [i for i, r in enumerate(results) if r['code'] != 0]
        for attempt in range(1, ATTEMPTS):
            if not failed:
                break
            redo = [sandboxes[i] for i in failed]
            for i in failed:
                self.failures.append({'command': command,
                                      'container_id': sandboxes[i].container_id,
                                      'error': _error(results[i])})
            if command == 'ADD':
                more, _results = self.driver.run([self.op('DEL', s) for s in redo])
                wall += more
                plugin += self.driver.cpu
                for sandbox in redo:
                    self.host.remove_netns(sandbox.netns)
                    sandbox.container_id += '-r%d' % attempt
                    sandbox.netns = self.host.pod_netns()
            more, again = self.driver.run([self.op(command, s) for s in redo])
            wall += more
            plugin += self.driver.cpu
            for i, result in zip(failed, again):
                results[i] = result
                seconds[i] += result['seconds']
            failed = [i for i in failed if results[i]['code'] != 0]
        user_after, sys_after = self.service_cpu()
        self.last_cpu = {'plugin': plugin, 'service_user': user_after - user_before,
                         'service_sys': sys_after - sys_before}
        if failed:
            sandbox, result = sandboxes[failed[0]], results[failed[0]]
            why = (self.label, command, sandbox.container_id, ATTEMPTS, result['code'],
                   result['stdout'].strip(), result['stderr'].strip(), LOG_KEPT,
                   self.daemon.log_tail(LOG_KEPT))
            raise systems_mod.BenchError('%s %s of %s failed %d times (exit %d): %s %s\n'
                                         'kuryr-daemon log, last %d lines:\n%s' % why)
        for sandbox, result in zip(sandboxes, results):
            if command == 'ADD':
                self.cache[sandbox.container_id] = json.loads(result['stdout'])
            elif command == 'DEL':
                self.cache.pop(sandbox.container_id, None)
                self.remove(sandbox)
        return wall, seconds

    def daemon_errors(self):
        """``{exception: count}`` of the exceptions kuryr-daemon logged, read from its log."""
        found = {}
        for name in DAEMON_ERROR.findall(self.daemon.log_text()):
            found[name] = found.get(name, 0) + 1
        return found

    def take_failures(self):
        """The failed (and retried) operations since the last call."""
        taken, self.failures = self.failures, []
        return taken

    def remove(self, sandbox):
        """What follows a DEL on a real node: the runtime removes the namespace, the pod
        is deleted, kuryr-controller deletes its KuryrPort (the registry entry goes)."""
        self.host.remove_netns(sandbox.netns)
        self.host.api.delete_pod('default', sandbox.pod_name)
        self.host.api.delete_kuryrport('default', sandbox.pod_name)

    def service_cpu(self):
        """``(user, system)`` CPU seconds of its processes, and of those it forked and reaped.

        kuryr-daemon forks a process per request (``[cni_daemon] worker_num`` is
        the most at once): their CPU is counted in their parent once reaped.
        """
        return systems_mod.cpu_seconds(self.session.processes(), reaped=True)

    def gateway(self):
        return testhost.GATEWAY

    def leftovers(self):
        # The kernel destroys a removed namespace, and the veths in it, in its own
        # time after `ip netns del` returns: ports still there are given a while.
        deadline = time.monotonic() + LEFTOVER_GRACE
        while True:
            links = self.host.links()
            bridge = links.get(testhost.BRIDGE, {}).get('index')
            ports = [name for name, link in links.items()
                     if bridge is not None and link.get('master') == bridge]
            if not ports or time.monotonic() > deadline:
                return {'devices': sorted(ports)} if ports else {}
            time.sleep(0.5)

    def close(self):
        try:
            if self.daemon is not None:
                with contextlib.suppress(Exception):
                    self.daemon.close()
        finally:
            super().close()
