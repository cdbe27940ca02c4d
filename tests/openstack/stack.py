"""The OpenStack control plane of the openstack tier, as its tests see it.

:class:`Stack` runs ``tools/openstack start`` (neutron ML2/OVN, OVN, MariaDB,
kube-apiserver, the real kuryr-controller) in a network namespace of its own
and hands tests what they need of it: Neutron's and Kubernetes' APIs as the
admin, the integration bridge, OVN's databases. Every request is made over a
socket created inside that namespace (:func:`kuryr_cni.netns.socket_in`): the
stack listens on the namespace's loopback only, and no thread of the test
process ever enters a namespace. ``close()`` stops every process and removes
the namespace and every file.
"""

import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse

import yaml

from kuryr_cni import netns
from tests import wait
from tools.testbed import ovs as testovs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(REPO, 'tools', 'openstack')
CONSTRAINTS = os.path.join(REPO, 'tools', 'openstack-constraints.txt')
CACHE = os.environ.get('OPENSTACK_CACHE') or os.path.join(REPO, '.cache', 'openstack')
KUBE_APISERVER_CACHE = (os.environ.get('KUBE_APISERVER_CACHE')
                        or os.path.join(REPO, '.cache', 'kube-apiserver'))
DAEMONSET = os.path.join(REPO, 'etc', 'kubernetes', 'kuryr-cni-daemonset.yaml')
START_TIMEOUT = 600         # a cold MariaDB and neutron's migrations on a busy machine
CALL_TIMEOUT = 30


def missing():
    """Why the stack cannot run here (None: it can)."""
    if os.geteuid() != 0 or not shutil.which('ip'):
        return 'needs root and iproute2 to make network namespaces'
    reason = testovs.missing()
    if reason:
        return reason
    for binary in ('kube-apiserver', 'etcd'):
        if not os.access(os.path.join(KUBE_APISERVER_CACHE, 'bin', binary), os.X_OK):
            return ('kube-apiserver is not built (tools/kube-apiserver build; cache %s)'
                    % KUBE_APISERVER_CACHE)
    if not os.path.exists(os.path.join(build_dir(), 'complete')):
        return 'the OpenStack stack is not built (tools/openstack build; cache %s)' % CACHE
    return None


def build_dir():
    """Where ``tools/openstack build`` puts the build of today's pins."""
    with open(CONSTRAINTS, 'rb') as f:
        return os.path.join(CACHE, hashlib.sha256(f.read()).hexdigest()[:12])


class APIError(Exception):
    def __init__(self, method, url, status, body):
        super().__init__('%s %s answered %s: %s' % (method, url, status, body[:500]))
        self.status = status


class Stack:
    """The stack under ``workdir``, in namespace ``netns_name``, for node ``node``."""

    def __init__(self, workdir, netns_name, node, options=()):
        """``options``: more of ``tools/openstack start``'s (``--nested``, ``--api-address``)."""
        self.dir = workdir
        self.netns = netns_name
        self.netns_path = '/run/netns/' + netns_name
        self.node = node
        # None, or 'kuryr-daemon': kuryr-controller from kuryr-daemon's build (its os-vif), for
        # as long as the attribute says so (see tools/openstack start --controller-of).
        self.controller_of = None
        self.options = list(options)
        try:
            self.start()
            with open(os.path.join(workdir, 'stack.env')) as f:
                self.env = dict(line.rstrip('\n').split('=', 1) for line in f if '=' in line)
            self._tls = ssl.create_default_context(cafile=self.env['K8S_CA'])
            self.apply_daemon_rbac()
        except BaseException:
            self.close()
            raise

    # The stack's life -----------------------------------------------------------------

    def start(self):
        """Start what is not running (everything at first)."""
        proc = subprocess.run([TOOL, 'start', self.dir, '--netns', self.netns,
                               '--node', self.node, *self.options,
                               *(['--controller-of', self.controller_of]
                                 if self.controller_of else [])],
                              capture_output=True, text=True, timeout=START_TIMEOUT)
        if proc.returncode:
            raise RuntimeError('tools/openstack start failed:\n%s%s'
                               % (proc.stdout, proc.stderr[-4000:]))

    def swap_controller(self, of):
        """Run kuryr-controller from the build ``of`` names (None: the stack's own)."""
        self.controller_of = of
        self.stop('kuryr-controller')
        self.start()

    def stop(self, what=None):
        """Stop everything, or the one process named (e.g. ``kuryr-controller``)."""
        subprocess.run([TOOL, 'stop', self.dir, *([what] if what else [])], check=True,
                       capture_output=True, timeout=120)

    def hold(self, name):
        """Freeze the stack's process ``name`` (SIGSTOP) until :meth:`release`."""
        os.kill(self._pid(name), signal.SIGSTOP)

    def release(self, name):
        os.kill(self._pid(name), signal.SIGCONT)

    def _pid(self, name):
        with open(os.path.join(self.dir, 'run', name + '.pid')) as f:
            return int(f.read())

    def close(self):
        subprocess.run([TOOL, 'stop', self.dir], capture_output=True, timeout=180)
        shutil.rmtree(self.dir, ignore_errors=True)

    def log(self, name):
        """A log of the stack (``kuryr-controller``, ``neutron``, ``ovn-controller``...)."""
        path = (self.env['KURYR_CONTROLLER_LOG'] if name == 'kuryr-controller'
                else os.path.join(self.dir, 'logs', name + '.log'))
        try:
            with open(path, errors='replace') as f:
                return f.read()
        except FileNotFoundError:
            return ''

    # Requests, as the admin -------------------------------------------------------------

    def _request(self, base, method, path, body=None, headers=(), as_bytes=False):
        """The decoded JSON answer, or with ``as_bytes`` the body as it came."""
        url = urllib.parse.urlsplit(base)
        sock = netns.socket_in(self.netns_path, socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(CALL_TIMEOUT)
        try:
            sock.connect((url.hostname, url.port))
            if url.scheme == 'https':
                sock = self._tls.wrap_socket(sock, server_hostname=url.hostname)
            conn = http.client.HTTPConnection(url.hostname, url.port, timeout=CALL_TIMEOUT)
            conn.sock = sock
            data = body if body is None or isinstance(body, bytes) else json.dumps(body)
            conn.request(method, path, data, {'Content-Type': 'application/json',
                                              'Accept': 'application/json', **dict(headers)})
            response = conn.getresponse()
            raw = response.read()
        finally:
            sock.close()
        if response.status >= 400:
            raise APIError(method, path, response.status, raw.decode(errors='replace'))
        if as_bytes:
            return raw
        return json.loads(raw) if raw.strip() else None

    def neutron(self, method, path, body=None):
        """One Neutron API call (``/v2.0`` + ``path``); its decoded answer."""
        return self._request(self.env['NEUTRON_URL'], method, '/v2.0' + path, body)

    def k8s(self, method, path, body=None, content_type='application/json', as_bytes=False):
        """One Kubernetes API call as the cluster admin; its decoded answer (or its
        bytes: ``/metrics``)."""
        with open(self.env['K8S_ADMIN_TOKEN']) as f:
            token = f.read().strip()
        return self._request(self.env['K8S_URL'], method, path, body,
                             {'Authorization': 'Bearer ' + token,
                              'Content-Type': content_type}, as_bytes=as_bytes)

    def apply_daemon_rbac(self):
        """The ClusterRole and binding of the shipped DaemonSet, for the daemon's token."""
        paths = {'ClusterRole': 'clusterroles', 'ClusterRoleBinding': 'clusterrolebindings'}
        with open(DAEMONSET) as f:
            for doc in yaml.safe_load_all(f):
                if doc and doc['kind'] in paths:
                    try:
                        self.k8s('POST', '/apis/rbac.authorization.k8s.io/v1/'
                                 + paths[doc['kind']], doc)
                    except APIError as exc:
                        if exc.status != 409:       # made by an earlier start
                            raise

    # Pods, as kubelet's API objects -----------------------------------------------------------

    def create_pod(self, name, namespace='default'):
        body = {'apiVersion': 'v1', 'kind': 'Pod',
                'metadata': {'name': name, 'namespace': namespace},
                'spec': {'nodeName': self.node, 'containers': [
                    {'name': 'main', 'image': 'registry.k8s.io/pause:3.9'}]}}
        return self.k8s('POST', '/api/v1/namespaces/%s/pods' % namespace, body)

    def delete_pod(self, name, namespace='default'):
        """Delete at once (no kubelet confirms a graceful deletion here)."""
        self.k8s('DELETE', '/api/v1/namespaces/%s/pods/%s?gracePeriodSeconds=0'
                 % (namespace, name))

    def pod(self, name, namespace='default'):
        return self._get('/api/v1/namespaces/%s/pods/%s' % (namespace, name))

    def kuryrport(self, name, namespace='default'):
        return self._get('/apis/openstack.org/v1/namespaces/%s/kuryrports/%s'
                         % (namespace, name))

    def events(self, namespace='default'):
        return self.k8s('GET', '/api/v1/namespaces/%s/events' % namespace)['items']

    def _get(self, path):
        try:
            return self.k8s('GET', path)
        except APIError as exc:
            if exc.status == 404:
                return None
            raise

    def wait_for_vif(self, name, timeout=60):
        """The primitive of the pod's ``eth0`` VIF once kuryr-controller wrote it."""
        def vif():
            port = self.kuryrport(name)
            return (port or {}).get('status', {}).get('vifs', {}).get('eth0', {}).get('vif')
        return wait.until(vif, timeout, 'kuryr-controller to write the VIF of %s' % name, 0.05)

    # Neutron ------------------------------------------------------------------------------------

    def port(self, port_id):
        try:
            return self.neutron('GET', '/ports/' + port_id)['port']
        except APIError as exc:
            if exc.status == 404:
                return None
            raise

    def ports_of(self, pod_uid):
        return self.neutron('GET', '/ports?device_id=' + pod_uid)['ports']

    def wait_for_status(self, port_id, status, timeout=30):
        return wait.until(lambda: (self.port(port_id) or {}).get('status') == status, timeout,
                          'port %s to be %s' % (port_id, status), 0.05)

    # Open vSwitch and OVN -----------------------------------------------------------------------

    def vsctl(self, *args):
        return subprocess.run(['ovs-vsctl', '--db=' + self.env['OVSDB'], '--timeout=20', *args],
                              check=True, capture_output=True, text=True, timeout=30).stdout

    def sbctl(self, *args):
        return subprocess.run([os.path.join(self.env['OVN_BIN'], 'ovn-sbctl'),
                               '--db=' + self.env['OVN_SB'], '--timeout=20', *args],
                              check=True, capture_output=True, text=True, timeout=30).stdout

    def br_int_ports(self):
        """{port name: its Interface's external_ids} of br-int."""
        out = self.vsctl('--format=json', '--columns=name,external_ids', 'list', 'Interface')
        table = json.loads(out)
        ports = set(self.vsctl('list-ports', 'br-int').split())
        return {name: dict(ids[1]) for name, ids in table['data'] if name in ports}

    def plugged(self, port_id):
        """The br-int port whose Interface names Neutron port ``port_id``, or None."""
        return next((name for name, ids in self.br_int_ports().items()
                     if ids.get('iface-id') == port_id), None)

    def plugged_interface(self, port_id):
        """The external_ids of the br-int Interface naming Neutron port ``port_id``, or None."""
        return next((ids for ids in self.br_int_ports().values()
                     if ids.get('iface-id') == port_id), None)

    def watch_interfaces(self):
        """An :class:`InterfaceWatch` of this stack's Open vSwitch (a context manager)."""
        return InterfaceWatch(self.env['OVSDB'])

    def nbctl(self, *args):
        return subprocess.run([os.path.join(self.env['OVN_BIN'], 'ovn-nbctl'),
                               '--db=' + self.env['OVN_NB'], '--timeout=20', *args],
                              check=True, capture_output=True, text=True, timeout=30).stdout

    def run_in(self, pod_netns_path, *command, timeout=30):
        return subprocess.run(['ip', 'netns', 'exec', os.path.basename(pod_netns_path),
                               *command], capture_output=True, text=True, timeout=timeout)

    def checksum_offload_off(self, pod_netns_path, ifname='eth0'):
        """TX checksum offload off on a pod's interface: see tests/openstack/conftest.py."""
        proc = self.run_in(pod_netns_path, self.env['ETHTOOL'], '-K', ifname, 'tx', 'off')
        assert proc.returncode == 0, proc.stderr

    def daemon_config(self, vif_timeout):
        """What the daemon under test needs to know of the stack (appended to its config)."""
        return ('\n[cni_daemon]\nnode_name = %s\nvif_source = kuryrport\nvif_timeout = %d\n'
                '\n[kubernetes]\napi_root = %s\ntoken_file = %s\nca_file = %s\n'
                '\n[binding]\novsdb_connection = %s\n'
                % (self.node, vif_timeout, self.env['K8S_URL'], self.env['K8S_DAEMON_TOKEN'],
                   self.env['K8S_CA'], self.env['OVSDB']))


class InterfaceWatch:
    """When each Neutron port's Interface appeared, and got ovn-installed, to the millisecond.

    ``ovsdb-client monitor`` streams every change of the Interface table as it
    is committed; a thread stamps each line as it arrives. :attr:`plugged` and
    :attr:`installed` map a port ID (``iface-id``) to a ``time.monotonic()``.
    """

    def __init__(self, connection):
        self.plugged = {}
        self.installed = {}
        self._proc = subprocess.Popen(
            ['ovsdb-client', 'monitor', connection, 'Open_vSwitch', 'Interface',
             'external_ids', '--format=json', '--data=json'],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        for line in self._proc.stdout:
            now = time.monotonic()
            try:
                rows = json.loads(line).get('data', [])
            except ValueError:
                continue
            for row in rows:
                if row[1] not in ('initial', 'insert', 'new'):
                    continue
                ids = dict(row[2][1]) if isinstance(row[2], list) else {}
                port_id = ids.get('iface-id')
                if port_id:
                    self.plugged.setdefault(port_id, now)
                    if ids.get('ovn-installed') == 'true':
                        self.installed.setdefault(port_id, now)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._proc.kill()
        self._proc.wait(10)
        self._thread.join(10)
