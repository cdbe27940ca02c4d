"""A real node for the node tier: kubelet, containerd (tools/node) and the daemon as shipped.

:class:`KubeNode` is a test host (:class:`tools.testbed.host.Host`: a network
namespace holding the pods' bridge ``kuryr-br0`` with the gateway address, as a
router would) wired to the session's kube-apiserver (:class:`tests.k8s.cluster.Cluster`),
in which ``tools/node start`` runs containerd and a kubelet registered as
:attr:`name`. The daemon runs as the DaemonSet runs it: the image's entrypoint
(``tools/container-entrypoint.sh``) installs the shim and the shipped conflist
into the node's CNI directories and execs the daemon with the ConfigMap's
``kuryr-cni.conf``, extracted from ``etc/kubernetes/kuryr-cni-daemonset.yaml``
unchanged; the daemon finds the API server as a pod does (in-cluster: the
``KUBERNETES_SERVICE_*`` variables and a token under
``/var/run/secrets/kubernetes.io/serviceaccount``, here the static user bound
to the shipped ClusterRole). The shipped paths (``/run/kuryr-cni``,
``/var/lib/kuryr-cni``) hold as they are: inside the node's mount namespace
``/run`` and ``/var/lib`` are the node's own (``<dir>/mnt/run``, ``<dir>/mnt/varlib``).

Tests look into pods through the node (:meth:`KubeNode.in_pod`: a command
inside a pod's first container, its mount and network namespaces), and read
the daemon's metrics and state as the functional tier's helpers do.
"""

import contextlib
import json
import math
import os
import shutil
import subprocess
import time

import urllib3
from kubernetes import client
from kubernetes import watch

from kuryr_cni import ctl
from tools.testbed import host as testhost
from tools.testbed import shim as testshim

from tests import wait
from tests.functional import helpers
from tests.k8s import cluster as k8s

REPO = k8s.REPO
TOOL = os.path.join(REPO, 'tools', 'node')
ENTRYPOINT = os.path.join(REPO, 'tools', 'container-entrypoint.sh')
CONFLIST = os.path.join(REPO, 'etc', 'cni', '10-kuryr.conflist')
NODE_BINARIES = ('kubelet', 'containerd', 'containerd-shim-runc-v2', 'ctr', 'runc')
BUSYBOX = 'localhost/kuryr-node-busybox:1'
SERVICE_ACCOUNT = 'secrets/kubernetes.io/serviceaccount'     # under /run (= /var/run)
HEALTH_PORT = 8090
NODE_NAME = 'kuryr-node-1'
# kubelet's own API rate limit raised: at its default of 5 requests a second, the status
# updates of a burst of pods queue for many seconds whatever the CNI plugin does.
KUBELET_FLAGS = ('--kube-api-qps=100', '--kube-api-burst=200', '--event-qps=100',
                 '--event-burst=200')
NOTHING = dict(helpers.NOTHING, queued=[])
WATCH_SECONDS = 30      # the longest watch request of Pods.until
WATCH_SLACK = 10        # seconds more for an answer to reach the test


def missing():
    """Why no node can run here (None: it can)."""
    reason = k8s.missing()
    if reason:
        return reason
    for binary in NODE_BINARIES:
        if not os.access(os.path.join(k8s.CACHE, 'bin', binary), os.X_OK):
            return 'the node is not built (tools/node build; cache %s)' % k8s.CACHE
    for tool in ('nsenter', 'unshare', 'curl'):
        if not shutil.which(tool):
            return 'needs %s (util-linux, curl)' % tool
    if not os.path.exists('/usr/lib/cni/loopback'):
        return 'needs the loopback CNI plugin (Debian: containernetworking-plugins)'
    return None


def shipped_config():
    """The DaemonSet ConfigMap's ``data``: ``kuryr-cni.conf`` and ``10-kuryr.conflist``."""
    [config_map] = [doc for doc in k8s._documents(k8s.DAEMONSET) if doc['kind'] == 'ConfigMap']
    return config_map['data']


class KubeNode(testhost.Host):
    """kubelet + containerd + the daemon in a namespace of their own, named :attr:`name`."""

    def __init__(self, cluster, prefix, name=NODE_NAME, kubelet_flags=KUBELET_FLAGS,
                 netns=None):
        """``netns``: an existing namespace to run in (with no bridge of ours), else a new one."""
        super().__init__(prefix=prefix, bridge=netns is None, netns=netns)
        self.cluster = cluster
        self.name = name
        self.kubelet_flags = list(kubelet_flags)
        self.dir = os.path.join(self.workdir, 'node')
        self.state_dir = os.path.join(self.dir, 'mnt', 'varlib', 'kuryr-cni')
        self.socket = os.path.join(self.dir, 'mnt', 'run', 'kuryr-cni', 'daemon.sock')
        self.daemon_log_path = os.path.join(self.workdir, 'kuryr-cni.log')
        try:
            self.address = cluster.attach(self)
            self._write_kubeconfig()
            self.start_kubelet()
        except BaseException:
            self.close()
            raise

    # kubelet and containerd ----------------------------------------------------------

    def _write_kubeconfig(self):
        self.kubeconfig = os.path.join(self.workdir, 'kubelet.kubeconfig')
        # The admin's token: kubelet's own identity is not what this tier tests.
        config = {'apiVersion': 'v1', 'kind': 'Config',
                  'clusters': [{'name': 'test', 'cluster': {
                      'server': self.cluster.url,
                      'certificate-authority': self.cluster.ca_file}}],
                  'users': [{'name': 'kubelet', 'user': {'token': self.cluster.token()}}],
                  'contexts': [{'name': 'test', 'context': {'cluster': 'test',
                                                            'user': 'kubelet'}}],
                  'current-context': 'test'}
        with open(self.kubeconfig, 'w') as f:
            json.dump(config, f)

    def start_kubelet(self):
        """Start what of the node is not running (all at first; kubelet after a stop)."""
        tool('start', self.dir, '--netns', self.ns, '--node-ip', self.address,
             '--kubeconfig', self.kubeconfig, '--name', self.name, '--',
             *self.kubelet_flags, timeout=180)

    def stop_kubelet(self):
        tool('stop', self.dir, 'kubelet', timeout=60)

    def pid(self, what):
        with open(os.path.join(self.dir, 'run', what + '.pid')) as f:
            return int(f.read())

    def run(self, *command, **kwargs):
        """``command`` as a process of the node (its namespaces and cgroup), to completion."""
        return subprocess.run([TOOL, 'run', self.dir, *command], capture_output=True,
                              text=True, timeout=kwargs.pop('timeout', 60), **kwargs)

    # The daemon, as the DaemonSet runs it -----------------------------------------------

    def start_daemon(self, wait_ready=True, timeout=60):
        config = os.path.join(self.workdir, 'configmap')
        os.makedirs(config, exist_ok=True)
        with open(os.path.join(config, 'kuryr-cni.conf'), 'w') as f:
            f.write(shipped_config()['kuryr-cni.conf'])
        self._write_service_account()
        env = {'CNI_BIN_DIR': os.path.join(self.dir, 'cni', 'bin'),
               'CNI_CONF_DIR': os.path.join(self.dir, 'cni', 'net.d'),
               'KURYR_CNI_SHIM': testshim.built(),
               'KURYR_CNI_CONFIG': os.path.join(config, 'kuryr-cni.conf'),
               'KURYR_CNI_CONFLIST': CONFLIST,
               'KURYR_CNI_POD_CONFIG': os.path.join(self.workdir, 'kuryr-cni-node.conf'),
               'KURYR_CNI_DAEMON': testhost.daemon_command()[0],
               'NODE_NAME': self.name,
               'KUBERNETES_SERVICE_HOST': self.cluster.address,
               'KUBERNETES_SERVICE_PORT': str(self.cluster.port)}
        with open(self.daemon_log_path, 'ab') as log:
            # tools/node run, nsenter, env and the entrypoint exec each other: the
            # process is the daemon's parent.
            self.daemon = subprocess.Popen(
                [TOOL, 'run', self.dir, '--unit', 'kuryr-cni-daemon', 'env',
                 *('%s=%s' % item for item in env.items()), ENTRYPOINT],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        if wait_ready:
            self.wait_daemon_ready(timeout)
        return self.daemon

    def _write_service_account(self):
        directory = os.path.join(self.dir, 'mnt', 'run', SERVICE_ACCOUNT)
        os.makedirs(directory, exist_ok=True)
        shutil.copy(self.cluster.daemon_token_file, os.path.join(directory, 'token'))
        shutil.copy(self.cluster.ca_file, os.path.join(directory, 'ca.crt'))
        with open(os.path.join(directory, 'namespace'), 'w') as f:
            f.write('kube-system')

    def wait_daemon_ready(self, timeout=60):
        def ready():
            if self.daemon.poll() is not None:
                raise AssertionError('the daemon exited with %s: %s'
                                     % (self.daemon.returncode, self.daemon_log()[-3000:]))
            with contextlib.suppress(OSError):
                return self.http_get(HEALTH_PORT, '/ready', timeout=2)[0] == 200
            return False
        wait.until(ready, timeout, 'the daemon to be ready', interval=0.1)

    def daemon_log(self):
        with open(self.daemon_log_path, errors='replace') as f:
            return f.read()

    # Pods ------------------------------------------------------------------------------

    def pod_body(self, name, namespace='default', grace=1):
        return {'apiVersion': 'v1', 'kind': 'Pod',
                'metadata': {'name': name, 'namespace': namespace},
                'spec': {'nodeName': self.name, 'terminationGracePeriodSeconds': grace,
                         'automountServiceAccountToken': False, 'enableServiceLinks': False,
                         'containers': [{'name': 'main', 'image': BUSYBOX,
                                         'imagePullPolicy': 'Never',
                                         'command': ['sleep', '100000']}]}}

    def _task(self, task_id, name):
        path = os.path.join(self.dir, 'containerd', 'state', 'io.containerd.runtime.v2.task',
                            'k8s.io', task_id, name)
        with open(path) as f:
            return f.read()

    @staticmethod
    def container_id(pod):
        return pod['status']['containerStatuses'][0]['containerID'].split('://', 1)[1]

    def container_pid(self, pod):
        """The host PID of ``pod``'s first container (from containerd's task state)."""
        return int(self._task(self.container_id(pod), 'init.pid'))

    def sandbox_id(self, pod):
        """The ID of the sandbox ``pod``'s first container runs in (CNI_CONTAINERID);
        None if that container is gone already."""
        try:
            config = json.loads(self._task(self.container_id(pod), 'config.json'))
        except FileNotFoundError:
            return None
        return config['annotations']['io.kubernetes.cri.sandbox-id']

    def sandbox_pid(self, pod):
        """The host PID of the sandbox's pause process."""
        return int(self._task(self.sandbox_id(pod), 'init.pid'))

    def containers(self):
        """The IDs of containerd's containers on the node, sandboxes included."""
        out = self.run(os.path.join(k8s.CACHE, 'bin', 'ctr'), '--address',
                       os.path.join(self.dir, 'containerd', 'containerd.sock'),
                       '--namespace', 'k8s.io', 'containers', 'list', '--quiet')
        assert out.returncode == 0, out.stderr
        return set(out.stdout.split())

    def in_pod(self, pod, *command, timeout=30):
        """``command`` inside ``pod``'s first container: its mount and network namespaces,
        so the pod's own busybox runs it."""
        return subprocess.run(['nsenter', '--target', str(self.container_pid(pod)), '--mount',
                               '--net', '--', *command], capture_output=True, text=True,
                              timeout=timeout)

    def pod_addresses(self, pod, ifname='eth0'):
        out = self.in_pod(pod, 'ip', '-o', '-4', 'addr', 'show', 'dev', ifname)
        assert out.returncode == 0, out.stderr
        return {line.split()[3] for line in out.stdout.splitlines()}

    def pod_pings(self, pod, address):
        return self.in_pod(pod, 'ping', '-c', '1', '-W', '2', address).returncode == 0

    def wait_ready_node(self, timeout=120):
        """Until kubelet reports the node Ready (registered, and the runtime's network
        ready: a CNI config installed)."""
        def ready():
            status, body = self.cluster.raw('GET', '/api/v1/nodes/' + self.name)
            if status != 200:
                return False
            conditions = json.loads(body)['status'].get('conditions', [])
            return any(c['type'] == 'Ready' and c['status'] == 'True' for c in conditions)
        wait.until(ready, timeout, 'node %s to be Ready' % self.name, interval=0.5)

    def leftovers(self):
        """What deleted pods could leave: tagged host devices, bindings, locks, queued DELs."""
        left = helpers.leftovers(self)
        left['queued'] = self.queued_dels()
        return left

    def stale_dels(self):
        """The daemon's log of the stale DELs it rejected, oldest first (``/v1/stale-dels``)."""
        status, entries = ctl.fetch(self.socket, '/v1/stale-dels')
        assert status == 200, entries
        return entries

    def queued_dels(self):
        directory = os.path.join(self.state_dir, 'del-queue')
        return sorted(os.listdir(directory)) if os.path.isdir(directory) else []

    def queued_del_bodies(self, names):
        """What the shim kept of each queued DEL named (:meth:`queued_dels`)."""
        bodies = []
        for name in names:
            with open(os.path.join(self.state_dir, 'del-queue', name)) as f:
                bodies.append(json.load(f))
        return bodies

    # Teardown ------------------------------------------------------------------------------

    def close(self):
        with contextlib.suppress(Exception):
            if self.daemon is not None and self.daemon.poll() is None:
                self.stop_daemon(timeout=30)
        tool('stop', self.dir, timeout=120, check=False)
        if self.daemon is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.daemon.wait(10)
        super().close()


def tool(*args, timeout, check=True):
    proc = subprocess.run([TOOL, *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode:
        raise RuntimeError('tools/node %s failed: %s%s' % (args[0], proc.stdout, proc.stderr))
    return proc


class Pods:
    """A test's pods in namespace ``default`` of ``node``, by name."""

    def __init__(self, cluster, node):
        self.cluster = cluster
        self.node = node
        self.core = cluster.core
        self.stalls = []        # when a watch of until() went silent, and was made again

    def create(self, name, grace=1):
        return self.cluster._json(self.core.create_namespaced_pod, 'default',
                                  self.node.pod_body(name, grace=grace))

    def get(self, name):
        status, body = self.cluster.raw('GET', '/api/v1/namespaces/default/pods/' + name)
        return json.loads(body) if status == 200 else None

    def on_node(self):
        return self.cluster._json(self.core.list_namespaced_pod, 'default',
                                  field_selector='spec.nodeName=' + self.node.name)['items']

    def wait_running(self, names, timeout=120):
        """Until every pod named runs its container; ``{name: pod}``."""
        names = set(names)

        def running(pods):
            named = {name: pods[name] for name in names & set(pods)}
            return named if len(named) == len(names) and all(map(is_running, named.values())) \
                else None
        return self.until(running, timeout, 'pods %s to run' % sorted(names))

    def running(self, name, uid=None):
        """The pod ``name`` (of ``uid``, if given) if it runs, else None."""
        return _running(self.get(name), uid)

    def wait_running_as(self, name, what, timeout, uid=None, judge=lambda pod: True):
        """Until the pod ``name`` (of ``uid``, if given) runs and ``judge(pod)``; the pod."""
        def wanted(pods):
            pod = _running(pods.get(name), uid)
            return pod if pod and judge(pod) else None
        return self.until(wanted, timeout, what)

    def delete(self, name, grace=None, uid=None):
        kwargs = {} if grace is None else {'grace_period_seconds': grace}
        if uid is not None:
            kwargs['body'] = {'preconditions': {'uid': uid}}
        return self.cluster._json(self.core.delete_namespaced_pod, name, 'default', **kwargs)

    def wait_gone(self, names, timeout=120):
        names = set(names)
        self.until(lambda pods: not names & set(pods), timeout,
                   'pods %s to be gone' % sorted(names))

    def until(self, judge, timeout, what):
        """Until ``judge({name: pod})``, of the node's pods in ``default``, is true; that.

        Judged on a list, then again on each event of a watch from it: kubelet's
        status writes wake the test, which never polls the API server (the pods
        of a burst, listed five times a second, would load it and the machine).
        A watch that goes silent past its own timeout is listed and made again,
        as a reflector would, and noted in :attr:`stalls`: only the deadline fails.
        """
        return self.cluster.submit(self._follow, judge, timeout, what).result(
            timeout + WATCH_SECONDS + WATCH_SLACK)

    def _follow(self, judge, timeout, what):
        deadline = time.monotonic() + timeout
        selector = 'spec.nodeName=' + self.node.name
        pods, version = {}, None
        while True:
            remaining = deadline - time.monotonic()
            try:
                if version is None:
                    listed = _json_of(self.core.list_namespaced_pod(
                        'default', field_selector=selector, _preload_content=False,
                        _request_timeout=WATCH_SECONDS + WATCH_SLACK))
                    pods = {p['metadata']['name']: p for p in listed['items']}
                    version = listed['metadata']['resourceVersion']
                    outcome = judge(pods)
                    if outcome:
                        return outcome
                if remaining <= 0:
                    raise AssertionError('timed out after %ss waiting for %s%s' % (
                        timeout, what,
                        '; watches stalled at %s' % self.stalls if self.stalls else ''))
                for event in watch.Watch().stream(
                        self.core.list_namespaced_pod, 'default', field_selector=selector,
                        resource_version=version,
                        timeout_seconds=max(1, min(math.ceil(remaining), WATCH_SECONDS)),
                        _request_timeout=WATCH_SECONDS + WATCH_SLACK,
                        deserialize=False):     # raw JSON: the models cost ms per event
                    pod = event['object']
                    version = pod['metadata']['resourceVersion']
                    if event['type'] == 'DELETED':
                        pods.pop(pod['metadata']['name'], None)
                    else:
                        pods[pod['metadata']['name']] = pod
                    outcome = judge(pods)
                    if outcome:
                        return outcome
            except client.exceptions.ApiException as exc:
                if exc.status != 410:       # expired: list again
                    raise
                version = None
            except KeyError:    # an ERROR event (expired): read with deserialize=False, the
                version = None  # client looks for the 'raw_object' only its models have
            except (urllib3.exceptions.TimeoutError, urllib3.exceptions.ProtocolError):
                if remaining <= 0:
                    raise
                self.stalls.append(time.strftime('%H:%M:%S'))
                version = None

    def delete_all(self):
        names = [p['metadata']['name'] for p in self.on_node()]
        for name in names:
            with contextlib.suppress(Exception):
                self.delete(name)
        self.wait_gone(names)


def _running(pod, uid=None):
    """``pod`` if it is of ``uid`` (if given) and runs, else None."""
    if pod is None or (uid is not None and pod['metadata']['uid'] != uid):
        return None
    return pod if is_running(pod) else None


def _json_of(response):
    try:
        return json.loads(response.read())
    finally:
        response.release_conn()


@contextlib.contextmanager
def pods_deleted_after(cluster, node):
    """A test's :class:`Pods`, every one of them deleted, and gone, on leaving."""
    made = Pods(cluster, node)
    try:
        yield made
    finally:
        made.delete_all()


def is_running(pod):
    """Whether ``pod`` (an API object) runs every container."""
    statuses = pod.get('status', {}).get('containerStatuses') or []
    return pod['status'].get('phase') == 'Running' and statuses and \
        all('running' in s.get('state', {}) for s in statuses)
