"""Kuryr's nested mode for real: Kubernetes nodes as guests, pods as subports of their trunks.

:class:`Cluster` boots user-mode Linux guests (:class:`tests.vm.guests.Guests`,
each with a second NIC, ``vec1``, its trunk NIC) and runs the OpenStack tier's
control plane (:class:`tests.openstack.stack.Stack`, ``tools/openstack start
--nested``: neutron's trunk service plugin, kuryr-controller's ``nested-vlan``
driver with ``[pod_vif_nested] worker_nodes_subnets``) in the guests' own
network namespace, with kube-apiserver on the guests' management bridge. Each
guest becomes a node (:class:`Node`), as a cloud would make a VM and its
installer a Kubernetes node of it:

- Neutron: a port on the nodes network with the guest NIC's MAC and an address
  (the node's InternalIP, which kuryr-controller looks its parent port up by),
  and a trunk whose parent it is;
- Open vSwitch: the guest's trunk tap on br-int as that port's Interface
  (``external_ids:iface-id`` = the port, ``attached-mac`` = the NIC's MAC), so
  OVN binds it, as nova's os-vif plug would; the guest holds its address on
  ``vec1``;
- Kubernetes: the Node object, its InternalIP the trunk port's address;
- the daemon in the guest, from the checkout (shared read-only) with a
  virtualenv of the build's wheels, started by systemd (``systemd-run``,
  ``Type=notify``) with ``vif_source = kuryrport`` and ``[binding]
  link_iface = vec1``; it reaches kube-apiserver over the management link
  (``vec0``, the bridge at 10.250.0.1).

kubelet's part is played from the host: it sets the pod's ``status.hostIP``
before binding the pod to the node (kubelet sets it as soon as it sees the
pod; kuryr-controller needs it to find the trunk), and runs the CNI calls in
the guest through the runtime emulator (:mod:`tests.vm.guest_cni`, the shim
as libcni calls it) against network namespaces it makes there: kubelet and
containerd fork far too much for a one-CPU user-mode guest.
"""

import concurrent.futures
import dataclasses
import json
import os
import threading
import time
import uuid

from tests import wait
from tests.openstack import stack as osstack
from tests.vm import guests as vm_guests

GATEWAY = '10.250.0.1'          # tools/vm's bridge: the management link's host side
TRUNK_NIC = 'vec1'
CONFIG_DIR = '/etc/kuryr-nested'
UNIT = 'kuryr-nested'
DAEMON_LOG = '/var/log/kuryr-nested.log'
DAEMON_USER = 'system:serviceaccount:kube-system:kuryr-cni'   # tools/kube-apiserver's
CHASSIS = 'osp'                 # the one ovn-controller's chassis, where every trunk tap is
VIF_TIMEOUT = 120
VENV_TIMEOUT = 900
PYCACHE = '/var/cache/kuryr-cni-pyc'
POLL = 0.1
TIMINGS = []        # (what, seconds or MiB): tests/vm/conftest.py reports them at the end

DAEMON_CONFIG = """[DEFAULT]
debug = true
log_file = {log}

[cni_daemon]
node_name = {node}
vif_source = kuryrport
vif_timeout = {vif_timeout}

[kubernetes]
api_root = {api_root}
token_file = {config_dir}/token
ca_file = {config_dir}/ca.crt

[binding]
link_iface = {trunk_nic}
"""


def _metric_sum(text, name, skip=()):
    return sum(float(line.rsplit(' ', 1)[1]) for line in text.splitlines()
               if (line.startswith(name + '{') or line.startswith(name + ' '))
               and not any(word in line for word in skip))


def missing():
    return vm_guests.missing() or osstack.missing()


@dataclasses.dataclass
class Pod:
    """A pod of a node: its API object, its sandbox in the guest, what its ADD answered."""
    name: str
    uid: str
    node: 'Node'
    netns: str                  # its namespace's name in the guest
    container_id: str
    outcome: dict = None        # {'code': ..., 'output': ...} of the ADD
    at: dict = None             # step -> seconds after the pod's creation

    @property
    def vif(self):
        """The data of the VIF kuryr-controller wrote for eth0, or None (not yet)."""
        kuryrport = self.node.cluster.stack.kuryrport(self.name) or {}
        vif = (kuryrport.get('status') or {}).get('vifs', {}).get('eth0', {}).get('vif')
        return vif and vif['versioned_object.data']

    def wait_for_vif(self, timeout=120):
        return wait.until(lambda: self.vif, timeout, 'the VIF of pod %s' % self.name, 0.2)

    @property
    def address(self):
        return self.outcome['output']['ips'][0]['address'].split('/')[0]


class Node:
    """Guest ``name`` made a Kubernetes node on its Neutron trunk (see the module's doc)."""

    def __init__(self, cluster, name, number):
        self.cluster = cluster
        self.name = name
        self.tap = 'trunk%d' % number
        stack = cluster.stack
        self.address = '%s.%d' % (stack.env['NODES_CIDR'].rsplit('.', 1)[0], 10 + number)
        self.sh('ip link set %s up' % TRUNK_NIC)
        self.mac = self.sh('cat /sys/class/net/%s/address' % TRUNK_NIC).strip()
        project = stack.env['PROJECT']
        self.port = stack.neutron('POST', '/ports', {'port': {
            'project_id': project, 'name': 'trunk-' + name,
            'network_id': stack.env['NODES_NETWORK'], 'mac_address': self.mac,
            'fixed_ips': [{'subnet_id': stack.env['NODES_SUBNET'],
                           'ip_address': self.address}],
            'device_owner': 'compute:nova', 'device_id': 'vm-' + name,
            'binding:host_id': CHASSIS}})['port']
        self.trunk = stack.neutron('POST', '/trunks', {'trunk': {
            'project_id': project, 'name': 'trunk-' + name,
            'port_id': self.port['id']}})['trunk']
        stack.vsctl('add-port', 'br-int', self.tap, '--', 'set', 'Interface', self.tap,
                    'external_ids:iface-id=' + self.port['id'],
                    'external_ids:attached-mac=' + self.mac,
                    'external_ids:iface-status=active')
        stack.wait_for_status(self.port['id'], 'ACTIVE', timeout=60)
        self.sh('ip addr add %s/24 dev %s' % (self.address, TRUNK_NIC))
        stack.k8s('POST', '/api/v1/nodes', {
            'apiVersion': 'v1', 'kind': 'Node',
            'metadata': {'name': name, 'labels': {'kubernetes.io/hostname': name}}})
        stack.k8s('PATCH', '/api/v1/nodes/%s/status' % name, {'status': {'addresses': [
            {'type': 'InternalIP', 'address': self.address},
            {'type': 'Hostname', 'address': name}]}},
            content_type='application/merge-patch+json')

    def sh(self, command, timeout=120):
        return self.cluster.guests.run(self.name, command, timeout=timeout).check(
            '%s: %s' % (self.name, command))

    # The daemon --------------------------------------------------------------------------

    def start_daemon(self):
        """Install the virtualenv, the configuration and the credentials; start the unit."""
        stack = self.cluster.stack
        self.sh(vm_guests.venv_command(), timeout=VENV_TIMEOUT)
        config = DAEMON_CONFIG.format(
            log=DAEMON_LOG, node=self.name, vif_timeout=VIF_TIMEOUT,
            api_root=stack.env['K8S_URL'], config_dir=CONFIG_DIR, trunk_nic=TRUNK_NIC)
        # The watcher drops root: the token and the CA must be readable by others.
        self.sh('mkdir -p {d} && install -m 0644 {token} {d}/token && '
                'install -m 0644 {ca} {d}/ca.crt && cat > {d}/kuryr-cni.conf <<"EOF"\n'
                '{config}EOF'.format(d=CONFIG_DIR, token=stack.env['K8S_DAEMON_TOKEN'],
                                     ca=stack.env['K8S_CA'], config=config))
        started = time.monotonic()
        self.sh('systemd-run --unit={unit} --service-type=notify -p NotifyAccess=all '
                '-p TimeoutStartSec=300 --setenv=PYTHONPATH={repo} '
                '--setenv=PYTHONPYCACHEPREFIX={pycache} {venv}/bin/python -m '
                'kuryr_cni.daemon.main --config-file {d}/kuryr-cni.conf'.format(
                    unit=UNIT, repo=vm_guests.REPO, pycache=PYCACHE, venv=vm_guests.VENV,
                    d=CONFIG_DIR), timeout=320)
        return time.monotonic() - started

    def stop_daemon(self):
        self.sh('systemctl stop %s; systemctl reset-failed %s 2>/dev/null; true'
                % (UNIT, UNIT))

    def metric(self, name, skip=()):
        """The sum of the daemon's samples of metric ``name`` (its /metrics, in the guest)
        but those whose labels hold one of ``skip``."""
        out = self.sh('python3 -c "import urllib.request; print(urllib.request.urlopen('
                      '\'http://127.0.0.1:9655/metrics\', timeout=30).read().decode())"')
        return _metric_sum(out, name, skip)

    def daemon_log(self, lines=60):
        return self.cluster.guests.run(self.name, 'tail -n %d %s' % (lines, DAEMON_LOG)).output

    # Pods ----------------------------------------------------------------------------------

    def cni(self, command, pod, container_id=None, netns=None, shim_timeout=110,
            timeout=300):
        """One CNI call of the runtime emulator in the guest: ``{'code', 'output'}``.

        ``netns``: a namespace name (default: the pod's), ``-`` for none."""
        out = self.sh('cd {repo} && PYTHONPATH={repo} PYTHONPYCACHEPREFIX={pycache} '
                      'KURYR_CNI_SHIM={shim} KURYR_CNI_TIMEOUT={shim_timeout} '
                      '{venv}/bin/python -m tests.vm.guest_cni '
                      '{command} {cid} {netns} {pod} {uid}'.format(
                          repo=vm_guests.REPO, pycache=PYCACHE, venv=vm_guests.VENV,
                          shim=os.path.join(vm_guests.REPO, 'shim', 'kuryr-cni'),
                          shim_timeout=shim_timeout,
                          command=command, cid=container_id or pod.container_id,
                          netns=pod.netns if netns is None else netns, pod=pod.name,
                          uid=pod.uid), timeout=timeout)
        return json.loads(out.strip().splitlines()[-1])

    def ping(self, netns, address, count=2, wait=5):
        """Whether ``address`` answers from namespace ``netns`` of the guest."""
        return self.cluster.guests.run(
            self.name, 'ip netns exec %s ping -c %d -W %d %s' % (netns, count, wait, address),
            timeout=count * wait + 30).returncode == 0

    def in_pod(self, netns, command, timeout=60):
        """Run ``command`` in namespace ``netns`` of the guest; a Result."""
        return self.cluster.guests.run(
            self.name, 'ip netns exec %s %s' % (netns, command), timeout=timeout)

    def links(self, netns):
        """{name: ip -d -j link's entry} of namespace ``netns`` in the guest."""
        out = self.cluster.guests.run(self.name, 'ip -d -j -n %s link' % netns)
        if out.returncode:
            return {}
        return {link['ifname']: link for link in json.loads(out.output)}

    def vlan_devices(self):
        """{VLAN ID: (namespace, name)} of every VLAN device on the trunk NIC, in any
        namespace of the guest (the kernel keeps a VLAN ID unique per parent wherever its
        device lives)."""
        out = self.sh('for ns in "" $(ip netns list | cut -d" " -f1); do '
                      'echo "ns=$ns"; ip -d -j ${ns:+-n $ns} link; echo; done')
        devices = {}
        namespace = ''
        for line in out.splitlines():
            if line.startswith('ns='):
                namespace = line[3:]
            elif line.strip():
                for link in json.loads(line):
                    data = link.get('linkinfo', {}).get('info_data', {})
                    if link.get('linkinfo', {}).get('info_kind') == 'vlan':
                        devices[data['id']] = (namespace, link['ifname'])
        return devices


class Cluster:
    """Guests ``names`` as nodes behind one control plane, under ``workdir``."""

    def __init__(self, workdir, names):
        self.workdir = workdir
        self.run_id = uuid.uuid4().hex[:6]
        stack_dir = os.path.join(workdir, 'osp')
        os.makedirs(stack_dir, mode=0o700)
        self.timings = {}
        started = time.monotonic()
        # The stack's files (CA, tokens) are read by the guests: its folder is shared.
        # So is the build's ethtool (Debian 12's, as the guests are).
        self.guests = vm_guests.Guests(
            os.path.join(workdir, 'vm'), names, trunk=True,
            shares=[stack_dir, os.path.join(osstack.build_dir(), 'debian', 'sbin')])
        self.timings['guests booted'] = time.monotonic() - started
        self.stack = None
        self.nodes = {}
        try:
            started = time.monotonic()
            self.stack = osstack.Stack(stack_dir, self.guests.netns, CHASSIS,
                                       options=('--nested', '--api-address', GATEWAY))
            self.timings['stack started'] = time.monotonic() - started
            for number, name in enumerate(names, 1):
                self.nodes[name] = Node(self, name, number)
            started = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
                for name, seconds in zip(names, pool.map(
                        lambda node: node.start_daemon(), self.nodes.values())):
                    self.timings['%s: daemon active' % name] = seconds
            self.timings['daemons started'] = time.monotonic() - started
        except BaseException:
            self.close()
            raise

    def close(self):
        try:
            if self.stack is not None:
                self.stack.close()       # its processes; the namespace is the guests'
        finally:
            self.guests.close()

    # Pods ------------------------------------------------------------------------------

    def create_pod(self, node, name=None):
        """A pod bound to ``node`` as the scheduler and kubelet would make it: its
        ``status.hostIP`` set (kubelet's first status), then its binding."""
        stack = self.stack
        name = name or 'pod-%s-%s' % (self.run_id, uuid.uuid4().hex[:6])
        pod = stack.k8s('POST', '/api/v1/namespaces/default/pods', {
            'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': name},
            'spec': {'containers': [{'name': 'main', 'image': 'registry.k8s.io/pause:3.9'}]}})
        stack.k8s('PATCH', '/api/v1/namespaces/default/pods/%s/status' % name,
                  {'status': {'hostIP': node.address}},
                  content_type='application/merge-patch+json')
        stack.k8s('POST', '/api/v1/namespaces/default/pods/%s/binding' % name, {
            'apiVersion': 'v1', 'kind': 'Binding', 'metadata': {'name': name},
            'target': {'apiVersion': 'v1', 'kind': 'Node', 'name': node.name}})
        netns = 'ns-' + uuid.uuid4().hex[:8]
        node.sh('ip netns add %s && ip -n %s link set lo up' % (netns, netns))
        return Pod(name, pod['metadata']['uid'], node, netns, 'sandbox-%s-1' % name)

    def start_pod(self, node):
        """Create a pod and ADD its sandbox at once, as kubelet does; each step's time."""
        started = time.monotonic()
        pod = self.create_pod(node)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            add = pool.submit(node.cni, 'add', pod)
            pod.at = self.observe(pod, started, add.done)
            pod.outcome = add.result()
        return pod

    def subports(self, node):
        """{port ID: VLAN ID} of the node's trunk."""
        trunk = self.stack.neutron('GET', '/trunks/%s/get_subports' % node.trunk['id'])
        return {s['port_id']: s['segmentation_id'] for s in trunk['sub_ports']}

    def observe(self, pod, started, answered, timeout=400):
        """Seconds after ``started`` at which each step of a pod start was seen, until the
        ADD answered: subport created (on the node's trunk), KuryrPort written, ACTIVE
        (Neutron), KuryrPort active, plugged (eth0 a VLAN device in the pod's namespace,
        looked for in the guest by a thread of its own: a look there costs a fork in a
        slow guest), ADD answered (checked last in each round, so that what a round saw
        counts as before it)."""
        at = {}
        before = set(self.subports(pod.node))
        port_id = None
        deadline = started + timeout
        plugged = threading.Thread(target=self._watch_plugged,
                                   args=(pod, started, at, answered, deadline))
        plugged.start()
        try:
            while 'ADD answered' not in at:
                now = time.monotonic() - started
                if port_id is None:
                    new = set(self.subports(pod.node)) - before
                    if new:
                        [port_id] = new
                        at['subport created'] = now
                vif = pod.vif
                if vif:
                    at.setdefault('KuryrPort written', now)
                    if vif.get('active'):
                        at.setdefault('KuryrPort active', now)
                if port_id and 'ACTIVE' not in at and \
                        (self.stack.port(port_id) or {}).get('status') == 'ACTIVE':
                    at['ACTIVE'] = now
                if answered():
                    at['ADD answered'] = time.monotonic() - started
                elif time.monotonic() > deadline:
                    raise AssertionError('after %d s, only %s of pod %s'
                                         % (timeout, at, pod.name))
                time.sleep(POLL)
        finally:
            plugged.join(timeout + 60)
        return at

    @staticmethod
    def _watch_plugged(pod, started, at, answered, deadline):
        while time.monotonic() < deadline:
            done = answered()
            if 'eth0' in pod.node.links(pod.netns):
                at['plugged'] = time.monotonic() - started
                return
            if done:
                return
            time.sleep(POLL)

    # The API server's side ------------------------------------------------------------

    def apiserver_cpu_seconds(self):
        """The CPU time kube-apiserver has used (user + system)."""
        with open(os.path.join(self.stack.dir, 'k8s', 'run', 'kube-apiserver.pid')) as f:
            pid = int(f.read())
        with open('/proc/%d/stat' % pid) as f:
            fields = f.read().rsplit(')', 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')

    def registered_watchers(self, kind):
        """Watches kube-apiserver serves of ``kind`` (its apiserver_registered_watchers)."""
        text = self.stack.k8s('GET', '/metrics', as_bytes=True).decode()
        return int(sum(float(line.rsplit(' ', 1)[1]) for line in text.splitlines()
                       if line.startswith('apiserver_registered_watchers{')
                       and 'kind="%s"' % kind in line))

    def daemon_requests(self):
        """{source address: [(verb, request URI)]} of the daemons' requests, from
        kube-apiserver's audit log (each guest calls from its own address)."""
        requests = {}
        with open(os.path.join(self.stack.dir, 'k8s', 'audit.log')) as f:
            for line in f:
                event = json.loads(line)
                # Each request is logged at each stage: counted once, when received.
                if event['stage'] == 'RequestReceived' and \
                        event['user']['username'] == DAEMON_USER:
                    requests.setdefault(event['sourceIPs'][0], []).append(
                        (event['verb'], event['requestURI']))
        return requests

    def delete_pod(self, pod):
        """The runtime's DEL, then the API object; wait until kuryr-controller removed the
        subport and the KuryrPort (its finalizers)."""
        self.stack.k8s('DELETE', '/api/v1/namespaces/default/pods/%s?gracePeriodSeconds=0'
                       % pod.name)
        wait.until(lambda: self.stack.pod(pod.name) is None
                   and self.stack.kuryrport(pod.name) is None,
                   120, 'pod %s and its KuryrPort to be gone' % pod.name, 0.2)
