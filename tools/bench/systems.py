"""The CNIs under test, each on a test host of its own, behind the same driver.

:class:`System` is what a runtime knows of a CNI: a plugin executable, a
network config, the ``CNI_PATH`` it needs, and a result cache (the ADD result
goes back to the plugin as ``prevResult`` with the DEL, as libcni does). Both
systems run on a :class:`tools.testbed.host.Host` (a network namespace with
a bridge holding the gateway address, as a router would), with their own bridge
name and subnet, and every plugin exec happens inside that host's namespace
(:mod:`tools.bench.driver`).

* :class:`KuryrSystem`: the shim (``shim/kuryr-cni``, copied into the host's
  CNI bin dir as operators install it) talking to the daemon,
  started inside the host with production logging (no debug), its pods and
  their bridge-kind VIFs served by the host's Kubernetes API stand-in.
* :class:`ReferenceSystem`: Debian's ``containernetworking-plugins``,
  ``bridge`` with ``host-local`` IPAM, its IPAM data dir under the host's
  temporary directory.
"""

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import time

from tools.testbed import host as testhost
from tools.bench import driver as driver_mod

CNI_VERSION = '1.0.0'     # the newest both speak (the reference plugins 1.1 stop there)
MTU = 1450
REFERENCE_DIR = '/usr/lib/cni'
REFERENCE_PLUGIN = os.path.join(REFERENCE_DIR, 'bridge')
REFERENCE_IPAM = os.path.join(REFERENCE_DIR, 'host-local')
REFERENCE_BRIDGE = 'kc-ref-br0'
REFERENCE_SUBNET = '10.20.0.0/16'
REFERENCE_GATEWAY = '10.20.0.1'
KURYR_PREFIX = '10.10'    # pods get 10.10.x.y/16 on the host's bridge (gateway 10.10.0.1)
HOSTS_PER_OCTET = 250
CLOCK_TICKS = os.sysconf('SC_CLK_TCK')
STOP_GRACE = 15           # seconds the daemon gets to stop on SIGTERM


class BenchError(Exception):
    """A plugin run failed or the test host misbehaved: the figures would be wrong."""


@dataclasses.dataclass
class Sandbox:
    container_id: str
    netns: str
    pod_name: str
    pod_uid: str
    pod_namespace: str = 'default'
    ifname: str = 'eth0'

    def cni_args(self):
        return ';'.join(['IgnoreUnknown=1', 'K8S_POD_NAMESPACE=' + self.pod_namespace,
                         'K8S_POD_NAME=' + self.pod_name, 'K8S_POD_UID=' + self.pod_uid])


def cpu_seconds(pids, reaped=False):
    """``(user, system)`` CPU seconds of ``pids`` from ``/proc``; ``reaped``: with what
    the children they waited for used (a process forked per request)."""
    user = system = 0
    for pid in pids:
        try:
            with open('/proc/%d/stat' % pid) as f:
                fields = f.read().rpartition(')')[2].split()
        except FileNotFoundError:
            continue      # a process that ended meanwhile; it did no ADD or DEL
        user += int(fields[11]) + (int(fields[13]) if reaped else 0)
        system += int(fields[12]) + (int(fields[14]) if reaped else 0)
    return user / CLOCK_TICKS, system / CLOCK_TICKS


def bridge_vifs(index):
    """Pod ``index``'s bridge-kind VIF: 10.10.x.y/16 on the host's bridge (``{'eth0': vif}``).

    The same for every system that reads VIFs (kuryr-cni, kuryr-daemon).
    """
    octet3, octet4 = divmod(index, HOSTS_PER_OCTET)
    return testhost.Host.vifs(index, ips=['%s.%d.%d/16' % (KURYR_PREFIX, octet3, octet4 + 2)],
                              mac='fa:16:3e:01:%02x:%02x' % (index // 256, index % 256),
                              mtu=MTU)


def reference_missing():
    """Why the reference plugins cannot run here, or None when they can."""
    for path in (REFERENCE_PLUGIN, REFERENCE_IPAM):
        if not os.access(path, os.X_OK):
            return '%s is not installed (Debian package containernetworking-plugins)' % path
    return None


class System:
    """One CNI on its test host: builds exec ops like a runtime and runs them."""

    name = None
    label = None
    op_timeout = None       # seconds a plugin run may take; None: the driver's OP_TIMEOUT

    def __init__(self, host, plugin, netconf, cni_path):
        self.host = host
        self.plugin = plugin
        self.netconf = netconf
        self.cni_path = cni_path
        self.driver = driver_mod.Driver(host.ns)
        self.cache = {}         # container ID -> ADD result (the runtime's result cache)
        # CPU seconds of the last run(): {'plugin', 'service_user', 'service_sys'}
        self.last_cpu = None
        self._netns = {}        # pod index -> its network namespace path

    # Pods -------------------------------------------------------------------

    def sandboxes(self, indexes, generation):
        """A sandbox per pod index; ``generation`` makes fresh container IDs.

        A pod's network namespace is made on first use and reused by later
        generations (making namespaces is the runtime's work, not timed here).
        """
        made = []
        for index in indexes:
            if index not in self._netns:
                self._netns[index] = self.host.pod_netns()
            made.append(Sandbox('%s-g%d-%d' % (self.name, generation, index),
                                self._netns[index], 'pod-%d' % index, 'uid-%d' % index))
        self.prepare_pods(indexes)
        return made

    def prepare_pods(self, indexes):
        """Whatever must exist before the runtime calls ADD for these pods."""

    # Exec ops -----------------------------------------------------------------

    def op(self, command, sandbox=None):
        env = {'PATH': '/usr/sbin:/usr/bin:/sbin:/bin', 'CNI_COMMAND': command,
               'CNI_CONTAINERID': '', 'CNI_NETNS': '', 'CNI_IFNAME': '', 'CNI_ARGS': '',
               'CNI_PATH': self.cni_path}
        config = dict(self.netconf)
        if sandbox is not None:
            env.update(CNI_CONTAINERID=sandbox.container_id, CNI_NETNS=sandbox.netns,
                       CNI_IFNAME=sandbox.ifname, CNI_ARGS=sandbox.cni_args())
            if command == 'DEL' and sandbox.container_id in self.cache:
                config['prevResult'] = self.cache[sandbox.container_id]
        op = {'argv': [self.plugin], 'env': env, 'stdin': json.dumps(config)}
        if self.op_timeout:
            op['timeout'] = self.op_timeout
        return op

    def run(self, command, sandboxes, concurrency=1):
        """Run ``command`` for every sandbox; returns ``(wall, [seconds])``.

        Raises BenchError when any run fails: a benchmark of failures would
        measure nothing.
        """
        user_before, sys_before = self.service_cpu()
        wall, results = self.driver.run([self.op(command, s) for s in sandboxes], concurrency)
        user_after, sys_after = self.service_cpu()
        self.last_cpu = {'plugin': self.driver.cpu, 'service_user': user_after - user_before,
                         'service_sys': sys_after - sys_before}
        for sandbox, result in zip(sandboxes, results):
            if result['code'] != 0:
                raise BenchError('%s %s of %s failed (exit %d): %s %s' % (
                    self.label, command, sandbox.container_id, result['code'],
                    result['stdout'].strip(), result['stderr'].strip()))
            if command == 'ADD':
                self.cache[sandbox.container_id] = json.loads(result['stdout'])
            elif command == 'DEL':
                self.cache.pop(sandbox.container_id, None)
        return wall, [r['seconds'] for r in results]

    def service_cpu(self):
        """``(user, system)`` CPU seconds of the system's long-running processes (none here)."""
        return 0.0, 0.0

    def version_op(self):
        return self.op('VERSION')

    def pod_address(self, sandbox):
        """The first address ADD gave ``sandbox`` (from the cached result)."""
        return self.cache[sandbox.container_id]['ips'][0]['address'].split('/')[0]

    def gateway(self):
        raise NotImplementedError

    def leftovers(self):
        """What a fully deleted workload left behind on this system (empty: clean)."""
        return {}

    def close(self):
        self.driver.close()
        self.host.close()


class KuryrSystem(System):
    name = 'kuryr'
    label = 'kuryr-cni'

    def __init__(self, workers):
        host = testhost.Host(prefix='kc-bench')
        try:
            host.start_api()
            self.workers = workers
            self._start_daemon(host, workers)
            netconf = {'cniVersion': CNI_VERSION, 'name': 'kuryr', 'type': 'kuryr-cni',
                       'daemon_socket': host.socket, 'state_dir': host.state_dir,
                       'timeout': 110}
            super().__init__(host, host.install_shim(), netconf, '/opt/cni/bin')
        except BaseException:
            host.close()
            raise
        self._pods = set()
        self.forced_stops = 0

    @staticmethod
    def _start_daemon(host, workers):
        # As deployed: the daemon's debug logging off (the test host turns it on).
        host.start_daemon(workers=workers, vif_timeout=60, extra='[DEFAULT]\ndebug = false\n')

    def restart_daemon(self, workers):
        """Stop the daemon and start it again with ``workers`` CNI workers."""
        self.stop_daemon()
        self.workers = workers
        self._start_daemon(self.host, workers)
        self.wait_for_pods(len(self._pods))

    def stop_daemon(self):
        """SIGTERM the daemon; kill its process group if it is not gone in STOP_GRACE s.

        Nothing is in flight when the bench stops it, so a slow graceful stop
        only costs time; ``forced_stops`` counts the kills for the report.
        """
        daemon = self.host.daemon
        if daemon is None or daemon.poll() is not None:
            return
        try:
            self.host.stop_daemon(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            self.forced_stops += 1
            with contextlib.suppress(ProcessLookupError):
                os.killpg(daemon.pid, signal.SIGKILL)   # its session and group: the daemon's
            daemon.wait(30)

    def close(self):
        try:
            self.stop_daemon()
        finally:
            super().close()

    def prepare_pods(self, indexes):
        new = [i for i in indexes if i not in self._pods]
        for index in new:
            self.host.api.create_pod('default', 'pod-%d' % index, testhost.NODE,
                                     uid='uid-%d' % index,
                                     annotations={'kuryr.openstack.org/vifs':
                                                  json.dumps(self.vifs(index))})
            self._pods.add(index)
        if new:
            self.wait_for_pods(len(self._pods))

    def vifs(self, index):
        return bridge_vifs(index)

    def wait_for_pods(self, count, timeout=120):
        """Wait until the daemon's watcher has seen ``count`` pods (its /v1/status)."""
        deadline = time.monotonic() + timeout
        seen = None
        while time.monotonic() < deadline:
            seen = self.daemon_status().get('pods')
            if seen is not None and seen >= count:
                return
            time.sleep(0.05)
        raise BenchError('the daemon saw %s of %d pods after %ss' % (seen, count, timeout))

    def daemon_status(self):
        """GET /v1/status from the daemon's CNI socket (what kuryr-cni-ctl reads)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(self.host.socket)
            sock.sendall(b'GET /v1/status HTTP/1.0\r\nHost: kuryr-cni\r\n\r\n')
            data = b''
            while chunk := sock.recv(65536):
                data += chunk
        head, _, body = data.partition(b'\r\n\r\n')
        if b' 200 ' not in head.split(b'\r\n')[0]:
            raise BenchError('daemon status: %r' % head[:200])
        return json.loads(body)

    def service_cpu(self):
        """``(user, system)`` CPU seconds of the daemon's processes (threads included)."""
        return cpu_seconds(self.host.processes())

    def gateway(self):
        return testhost.GATEWAY

    def leftovers(self):
        found = {}
        devices = [name for name, link in self.host.links().items()
                   if (link.get('ifalias') or '').startswith('kuryr-cni:')]
        if devices:
            found['devices'] = sorted(devices)
        for sub in ('bindings', 'locks'):
            with contextlib.suppress(FileNotFoundError):
                names = os.listdir(os.path.join(self.host.state_dir, sub))
                if names:
                    found[sub] = sorted(names)
        return found


class ReferenceSystem(System):
    name = 'reference'
    label = 'reference (bridge + host-local)'

    def __init__(self):
        host = testhost.Host(prefix='kc-bench', bridge=False)
        try:
            # The same starting point as kuryr-cni's host: the bridge exists, up,
            # with the gateway address on it.
            testhost.ip('-n', host.ns, 'link', 'add', REFERENCE_BRIDGE, 'type', 'bridge')
            testhost.ip('-n', host.ns, 'addr', 'add', REFERENCE_GATEWAY + '/16',
                        'dev', REFERENCE_BRIDGE)
            testhost.ip('-n', host.ns, 'link', 'set', REFERENCE_BRIDGE, 'up')
            self.data_dir = os.path.join(host.workdir, 'host-local')
            netconf = {
                'cniVersion': CNI_VERSION, 'name': 'kc-bench-ref', 'type': 'bridge',
                'bridge': REFERENCE_BRIDGE, 'isGateway': True, 'mtu': MTU,
                'ipam': {'type': 'host-local', 'dataDir': self.data_dir,
                         'ranges': [[{'subnet': REFERENCE_SUBNET,
                                      'gateway': REFERENCE_GATEWAY}]],
                         'routes': [{'dst': '0.0.0.0/0'}]}}
            super().__init__(host, REFERENCE_PLUGIN, netconf, REFERENCE_DIR)
        except BaseException:
            host.close()
            raise

    def gateway(self):
        return REFERENCE_GATEWAY

    def leftovers(self):
        found = {}
        links = self.host.links()
        bridge = links.get(REFERENCE_BRIDGE, {}).get('index')
        ports = [name for name, link in links.items()
                 if bridge is not None and link.get('master') == bridge]
        if ports:
            found['devices'] = sorted(ports)
        network_dir = os.path.join(self.data_dir, self.netconf['name'])
        with contextlib.suppress(FileNotFoundError):
            leases = [n for n in os.listdir(network_dir)
                      if n[0].isdigit() and not n.startswith('last_reserved_ip')]
            if leases:
                found['leases'] = sorted(leases)
        return found
