"""A real kube-apiserver and etcd in a network namespace of their own, for the k8s tier.

:class:`Cluster` runs ``tools/kube-apiserver`` in a throwaway "control plane"
namespace, on the address of a bridge there (``10.250.0.1``), never on the
machine's interfaces. Each test node (a :class:`tools.testbed.host.Host`,
whose namespace holds the daemon under test) is wired to that bridge by a
veth pair (:meth:`Cluster.attach`), so every byte between a daemon and the
API server crosses one interface whose counters the tests read.

The test process itself talks to the API server as the cluster admin through
the official client. Its sockets must be made inside the control plane
namespace: the calls run on a small thread pool whose threads entered that
namespace when they started and never leave it (:meth:`Cluster.call`); no
other thread of the test process ever enters a namespace.
"""

import base64
import concurrent.futures
import contextlib
import ctypes
import http.client
import itertools
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import urllib.parse
import uuid

from kubernetes import client
import yaml

from tests import wait

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(REPO, 'tools', 'kube-apiserver')
CACHE = os.environ.get('KUBE_APISERVER_CACHE') or os.path.join(REPO, '.cache', 'kube-apiserver')
DAEMONSET = os.path.join(REPO, 'etc', 'kubernetes', 'kuryr-cni-daemonset.yaml')
KURYRPORT_CRD = os.path.join(REPO, 'etc', 'kubernetes', 'kuryrport-crd.yaml')

ADDRESS = '10.250.0.1'
PREFIX_LENGTH = 16
PORT = 6443
ETCD_PORT = 2379
BRIDGE = 'k8s'
NODE_LINK = 'k8s0'          # the node's end of its veth to the control plane
DAEMON_USER = 'system:serviceaccount:kube-system:kuryr-cni'
DAEMON_GROUPS = ['system:serviceaccounts', 'system:serviceaccounts:kube-system',
                 'system:authenticated']
CALL_TIMEOUT = 120
CLONE_NEWNET = 0x40000000

_libc = ctypes.CDLL(None, use_errno=True)
_inside = threading.local()         # .netns: the namespace a pool thread entered
_node_numbers = itertools.count(2)


def missing():
    """Why no real API server can run here (None: it can)."""
    if os.geteuid() != 0 or not shutil.which('ip'):
        return 'needs root and iproute2 to make network namespaces'
    for binary in ('kube-apiserver', 'etcd'):
        if not os.access(os.path.join(CACHE, 'bin', binary), os.X_OK):
            return 'kube-apiserver is not built (tools/kube-apiserver build; cache %s)' % CACHE
    return None


@contextlib.contextmanager
def serving(prefix):
    """A :class:`Cluster` with the DaemonSet's RBAC and the KuryrPort CRD applied; closed
    on leaving."""
    server = Cluster(prefix)
    try:
        server.apply_daemonset_rbac()
        server.install_kuryrport_crd()
        yield server
    finally:
        server.close()


def ip(*args):
    return subprocess.run(['ip', *args], check=True, capture_output=True, text=True,
                          timeout=30).stdout


class Cluster:
    """etcd and kube-apiserver (RBAC and the Node authorizer on) in namespace ``netns``.

    ``extra_flags`` go to kube-apiserver. ``close()`` stops both and removes
    the namespace and every file.
    """

    address = ADDRESS
    port = PORT

    def __init__(self, prefix, extra_flags=()):
        self.netns = '%s-k8s-%s' % (prefix, uuid.uuid4().hex[:6])
        self.dir = tempfile.mkdtemp(prefix='kc-k8s-')
        self.extra_flags = list(extra_flags)
        self.url = 'https://%s:%d' % (self.address, self.port)
        self._pool = None
        ip('netns', 'add', self.netns)
        try:
            ip('-n', self.netns, 'link', 'set', 'lo', 'up')
            ip('-n', self.netns, 'link', 'add', BRIDGE, 'type', 'bridge')
            ip('-n', self.netns, 'addr', 'add', '%s/%d' % (ADDRESS, PREFIX_LENGTH), 'dev', BRIDGE)
            ip('-n', self.netns, 'link', 'set', BRIDGE, 'up')
            self.start()
            self._connect()
        except BaseException:
            self.close()
            raise

    def _connect(self):
        """The admin's clients, on threads inside :attr:`netns`."""
        self._pool = self.executor(8, 'k8s-admin')
        self.api = self.call(self._admin_client)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    # The server's life ----------------------------------------------------------------

    def start(self):
        """Start what is not running (both at first; kube-apiserver after :meth:`stop`)."""
        subprocess.run([TOOL, 'start', self.dir, '--netns', self.netns, '--address', ADDRESS,
                        '--port', str(PORT), '--etcd-port', str(ETCD_PORT), '--',
                        *self.extra_flags], check=True, capture_output=True, timeout=180)

    def stop(self, what='kube-apiserver'):
        subprocess.run([TOOL, 'stop', self.dir, what], check=True, capture_output=True,
                       timeout=60)

    def restart(self):
        """Restart kube-apiserver alone (etcd keeps running, and every object)."""
        self.stop()
        self.start()

    def pid(self, what='kube-apiserver'):
        with open(os.path.join(self.dir, 'run', what + '.pid')) as f:
            return int(f.read())

    def close(self):
        self._disconnect()
        subprocess.run([TOOL, 'stop', self.dir], capture_output=True, timeout=60)
        subprocess.run(['ip', 'netns', 'delete', self.netns], capture_output=True, timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _disconnect(self):
        if self._pool is not None:
            with contextlib.suppress(Exception):
                self.call(self.api.close)
            self._pool.shutdown(wait=True)
            self._pool = None

    # Credentials --------------------------------------------------------------------------

    @property
    def ca_file(self):
        return os.path.join(self.dir, 'ca.crt')

    @property
    def daemon_token_file(self):
        return os.path.join(self.dir, 'daemon.token')

    def token(self, who='admin'):
        with open(os.path.join(self.dir, who + '.token')) as f:
            return f.read().strip()

    def _admin_client(self):
        configuration = client.Configuration()
        configuration.host = self.url
        configuration.ssl_ca_cert = self.ca_file
        configuration.api_key['BearerToken'] = self.token('admin')
        configuration.api_key_prefix['BearerToken'] = 'Bearer'
        # Every pool of threads calling through it at once (the admin pool, the node
        # tier's stand-in controller and its Neutron half): a connection that does not
        # fit is dropped, and the next call pays a new TLS handshake.
        configuration.connection_pool_maxsize = 32
        return client.ApiClient(configuration)

    def daemon_config(self, node_name, vif_source='annotation'):
        """The daemon's configuration (appended to the test host's) for this server."""
        return ('\n[cni_daemon]\nnode_name = %s\nvif_source = %s\n'
                '\n[kubernetes]\napi_root = %s\ntoken_file = %s\nca_file = %s\n'
                % (node_name, vif_source, self.url, self.daemon_token_file, self.ca_file))

    # Nodes ----------------------------------------------------------------------------------

    def attach(self, host):
        """Wire ``host``'s namespace to the control plane by a veth; returns its address."""
        number = next(_node_numbers)
        address = '10.250.%d.%d' % (number // 250, number % 250 + 2)
        peer = 'n%d' % number
        ip('-n', host.ns, 'link', 'add', NODE_LINK, 'type', 'veth', 'peer', 'name', peer,
           'netns', self.netns)
        ip('-n', self.netns, 'link', 'set', peer, 'master', BRIDGE, 'up')
        ip('-n', host.ns, 'addr', 'add', '%s/%d' % (address, PREFIX_LENGTH), 'dev', NODE_LINK)
        ip('-n', host.ns, 'link', 'set', NODE_LINK, 'up')
        return address

    # Calls, as the cluster admin ------------------------------------------------------------

    def call(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` on a thread inside the control plane namespace."""
        if getattr(_inside, 'netns', None) == self.netns:      # one already (from map)
            return fn(*args, **kwargs)
        return self._pool.submit(fn, *args, **kwargs).result(CALL_TIMEOUT)

    def submit(self, fn, *args, **kwargs):
        """Start ``fn(*args, **kwargs)`` on a thread inside the namespace; its Future."""
        return self._pool.submit(fn, *args, **kwargs)

    def executor(self, workers, name):
        """A pool of ``workers`` threads of its own inside the namespace, for a caller
        whose API calls must not queue behind everyone else's."""
        return concurrent.futures.ThreadPoolExecutor(
            workers, thread_name_prefix=name, initializer=_enter_netns, initargs=(self.netns,))

    def map(self, fn, items):
        return list(self._pool.map(fn, items, timeout=CALL_TIMEOUT * 10))

    def create_pod(self, namespace, name, node, vifs=None, typical=False):
        """A pod bound to ``node`` (no scheduler runs), with the VIF annotation; its object.

        ``typical``: shaped like a Deployment's pod once kubelet has reported it
        running (owner, probes, service-account volume, full status), for its
        size on the wire; otherwise the least a pod can be.
        """
        annotations = {'kuryr.openstack.org/vifs': json.dumps(vifs)} if vifs else {}
        body = {'apiVersion': 'v1', 'kind': 'Pod',
                'metadata': {'name': name, 'namespace': namespace, 'annotations': annotations,
                             'labels': {'app': name.rsplit('-', 1)[0]}},
                'spec': {'nodeName': node, 'containers': [
                    {'name': 'main', 'image': 'registry.k8s.io/pause:3.9'}]}}
        if typical:
            body['metadata']['labels']['pod-template-hash'] = '7d9c8b6f5d'
            body['metadata']['ownerReferences'] = [{
                'apiVersion': 'apps/v1', 'kind': 'ReplicaSet', 'name': 'web-7d9c8b6f5d',
                'uid': str(uuid.uuid4()), 'controller': True, 'blockOwnerDeletion': True}]
            body['spec'].update(TYPICAL_SPEC)
        pod = self._json(self.core.create_namespaced_pod, namespace, body)
        return self.report_running(pod) if typical else pod

    def report_running(self, pod):
        """Write the status kubelet reports of a running pod, as it does; the pod."""
        return self._json(self.core.patch_namespaced_pod_status, pod['metadata']['name'],
                          pod['metadata']['namespace'], typical_status(pod))

    def set_vifs(self, namespace, name, vifs):
        patch = {'metadata': {'annotations': {'kuryr.openstack.org/vifs': json.dumps(vifs)}}}
        return self._json(self.core.patch_namespaced_pod, name, namespace, patch)

    def delete_pod(self, namespace, name):
        """Delete at once: no kubelet runs here to confirm a graceful deletion."""
        return self._json(self.core.delete_namespaced_pod, name, namespace,
                          grace_period_seconds=0)

    def create_kuryrport(self, namespace, name, node, pod_uid, vifs=None, static=False):
        body = {'apiVersion': 'openstack.org/v1', 'kind': 'KuryrPort',
                'metadata': {'name': name, 'namespace': namespace,
                             'labels': {'kuryr.openstack.org/nodeName': node}},
                'spec': {'podUid': pod_uid, 'podNodeName': node, 'podStatic': static},
                'status': {'vifs': vifs or {}}}
        return self._json(self.custom.create_namespaced_custom_object, 'openstack.org', 'v1',
                          namespace, 'kuryrports', body)

    def update_kuryrport_vifs(self, namespace, name, vifs):
        return self._json(self.custom.patch_namespaced_custom_object, 'openstack.org', 'v1',
                          namespace, 'kuryrports', name, {'status': {'vifs': vifs}})

    def events(self, namespace='default'):
        return self._json(self.core.list_namespaced_event, namespace)['items']

    def resource_version(self):
        """The cluster's current resourceVersion (etcd's revision)."""
        return self._json(self.core.list_namespace)['metadata']['resourceVersion']

    def _json(self, method, *args, **kwargs):
        def fetch():
            response = method(*args, _preload_content=False, **kwargs)
            try:
                return json.loads(response.read())
            finally:
                response.release_conn()
        return self.call(fetch)

    # RBAC and custom resources ---------------------------------------------------------------

    def apply_daemonset_rbac(self):
        """Create the ClusterRole and ClusterRoleBinding of the DaemonSet's manifest."""
        for doc in _documents(DAEMONSET):
            if doc['kind'] == 'ClusterRole':
                self.call(client.RbacAuthorizationV1Api(self.api).create_cluster_role, doc,
                          _preload_content=False)
            elif doc['kind'] == 'ClusterRoleBinding':
                self.call(client.RbacAuthorizationV1Api(self.api).create_cluster_role_binding,
                          doc, _preload_content=False)

    def daemonset_rules(self):
        [role] = [doc for doc in _documents(DAEMONSET) if doc['kind'] == 'ClusterRole']
        return role['rules']

    def set_daemon_rules(self, rules):
        """Replace the daemon's ClusterRole rules; return once the authorizer applies them."""
        rbac = client.RbacAuthorizationV1Api(self.api)
        role = self._json(rbac.read_cluster_role, 'kuryr-cni')
        role['rules'] = rules
        self.call(rbac.replace_cluster_role, 'kuryr-cni', role, _preload_content=False)
        wanted = {(group, resource, verb) for rule in rules for group in rule['apiGroups']
                  for resource in rule['resources'] for verb in rule['verbs']}
        every = {(group, resource, verb) for rule in self.daemonset_rules()
                 for group in rule['apiGroups'] for resource in rule['resources']
                 for verb in rule['verbs']}
        # The RBAC authorizer learns of the change through its own watch: ask it.
        wait.until(lambda: all(self.daemon_may(*triple) == (triple in wanted)
                               for triple in every), 30, 'the RBAC change to take effect')

    def daemon_may(self, group, resource, verb):
        review = {'apiVersion': 'authorization.k8s.io/v1', 'kind': 'SubjectAccessReview',
                  'spec': {'user': DAEMON_USER, 'groups': DAEMON_GROUPS,
                           'resourceAttributes': {'group': group, 'resource': resource,
                                                  'verb': verb}}}
        answer = self._json(client.AuthorizationV1Api(self.api).create_subject_access_review,
                            review)
        return answer['status'].get('allowed', False)

    def install_kuryrport_crd(self):
        [crd] = _documents(KURYRPORT_CRD)
        ext = client.ApiextensionsV1Api(self.api)
        self.call(ext.create_custom_resource_definition, crd, _preload_content=False)

        def established():      # served from then on
            status = self._json(ext.read_custom_resource_definition, crd['metadata']['name'])
            return any(c['type'] == 'Established' and c['status'] == 'True'
                       # conditions is null until the server has looked at the CRD
                       for c in (status.get('status') or {}).get('conditions') or [])
        wait.until(established, 30, 'the KuryrPort CRD to be established')

    # What the server saw -----------------------------------------------------------------------

    def audit(self, since=0):
        """The audit log's records from byte ``since`` on, and the offset after them."""
        with open(os.path.join(self.dir, 'audit.log'), 'rb') as f:
            f.seek(since)
            data = f.read()
        complete = data[:data.rfind(b'\n') + 1]
        return ([json.loads(line) for line in complete.splitlines() if line.strip()],
                since + len(complete))

    def audit_offset(self):
        return os.path.getsize(os.path.join(self.dir, 'audit.log'))

    def daemon_requests(self, since, stage='RequestReceived', **match):
        """The daemon identity's requests audited since offset ``since``, whose objectRef
        matches ``match``: at their arrival (a watch's end is only written once it ends)."""
        records, _ = self.audit(since)
        return [r for r in records if r['user']['username'] == DAEMON_USER
                and r['stage'] == stage
                and all(r.get('objectRef', {}).get(k) == v for k, v in match.items())]

    def refused(self, since):
        """The URIs of the daemon's requests answered 403 since offset ``since``."""
        return [r['requestURI'] for r in self.daemon_requests(since, 'ResponseComplete')
                if r.get('responseStatus', {}).get('code') == 403]

    def metrics(self):
        """kube-apiserver's own /metrics, as text."""
        status, body = self.raw('GET', '/metrics')
        assert status == 200, body
        return body.decode()

    def open_watches(self, nodes):
        """A watch of each node's pods, as a daemon's, left open; their sockets."""
        def open_all():
            context = ssl.create_default_context(cafile=self.ca_file)
            opened = []
            for node in nodes:
                sock = context.wrap_socket(
                    socket.create_connection((self.address, self.port), 30),
                    server_hostname=self.address)
                sock.sendall(('GET /api/v1/pods?watch=true&fieldSelector=spec.nodeName%%3D%s'
                              '&resourceVersion=0&timeoutSeconds=300 HTTP/1.1\r\nHost: %s\r\n'
                              'Authorization: Bearer %s\r\n\r\n'
                              % (node, self.address, self.token('daemon'))).encode())
                opened.append(sock)
            return opened
        return self.call(open_all)

    def open_pod_watches(self):
        """Pod watches open at kube-apiserver now (its own and its clients')."""
        for line in self.metrics().splitlines():
            if line.startswith('apiserver_longrunning_gauge{') and 'resource="pods"' in line \
                    and 'verb="WATCH"' in line:
                return int(float(line.rsplit(' ', 1)[1]))
        return 0

    def raw(self, method, path, who='admin', body=None, timeout=30, token=None):
        """One request over its own connection: ``(status, body bytes)``, nothing interpreted.

        ``who`` names the token (``admin``, ``daemon``) or is None for none;
        ``token`` sends that one instead.
        """
        headers = {'Accept': 'application/json'}
        token = token or (self.token(who) if who is not None else None)
        if token is not None:
            headers['Authorization'] = 'Bearer ' + token
        if body is not None:
            headers['Content-Type'] = 'application/json'
            body = body if isinstance(body, (bytes, str)) else json.dumps(body)

        def request():
            context = ssl.create_default_context(cafile=self.ca_file)
            conn = http.client.HTTPSConnection(self.address, self.port, context=context,
                                               timeout=timeout)
            try:
                conn.request(method, path, body, headers)
                response = conn.getresponse()
                return response.status, response.read()
            finally:
                conn.close()
        return self.call(request)

    def etcd(self, path, body):
        """POST to etcd's JSON gateway (v3 API) inside the namespace."""
        def post():
            conn = http.client.HTTPConnection(ADDRESS, ETCD_PORT, timeout=30)
            try:
                conn.request('POST', path, json.dumps(body),
                             {'Content-Type': 'application/json'})
                response = conn.getresponse()
                answer = json.loads(response.read())
                assert response.status == 200, answer
                return answer
            finally:
                conn.close()
        return self.call(post)

    def compact(self):
        """Compact etcd's history up to now: watches from older versions get 410 Gone."""
        revision = self.etcd('/v3/kv/range', {'key': base64.b64encode(b'/').decode()}
                             )['header']['revision']
        self.etcd('/v3/kv/compaction', {'revision': revision, 'physical': True})
        return int(revision)

    def cpu_seconds(self, what='kube-apiserver'):
        """CPU time (user + system) the process has used."""
        with open('/proc/%d/stat' % self.pid(what)) as f:
            fields = f.read().rpartition(')')[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def _enter_netns(name):
    """Move the calling thread (one of a Cluster's pool, for its life) into ``name``."""
    fd = os.open('/run/netns/' + name, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise OSError(code, 'setns: %s' % os.strerror(code))
    finally:
        os.close(fd)
    _inside.netns = name


def _documents(path):
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def query(record):
    """The query parameters of an audited request."""
    return query_of(record['requestURI'])


def query_of(uri):
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(uri).query))


TYPICAL_SPEC = {
    'serviceAccountName': 'default',
    'containers': [{
        'name': 'web', 'image': 'registry.example.org/shop/web:1.42.0',
        'ports': [{'name': 'http', 'containerPort': 8080, 'protocol': 'TCP'}],
        'env': [{'name': 'LOG_LEVEL', 'value': 'info'},
                {'name': 'POD_NAME', 'valueFrom': {'fieldRef': {'fieldPath': 'metadata.name'}}}],
        'resources': {'requests': {'cpu': '100m', 'memory': '128Mi'},
                      'limits': {'memory': '256Mi'}},
        'readinessProbe': {'httpGet': {'path': '/healthz', 'port': 8080},
                           'periodSeconds': 10},
        'volumeMounts': [{'name': 'kube-api-access', 'readOnly': True,
                          'mountPath': '/var/run/secrets/kubernetes.io/serviceaccount'}]}],
    'volumes': [{'name': 'kube-api-access', 'projected': {'sources': [
        {'serviceAccountToken': {'expirationSeconds': 3607, 'path': 'token'}},
        {'configMap': {'name': 'kube-root-ca.crt',
                       'items': [{'key': 'ca.crt', 'path': 'ca.crt'}]}},
        {'downwardAPI': {'items': [{'path': 'namespace', 'fieldRef': {
            'apiVersion': 'v1', 'fieldPath': 'metadata.namespace'}}]}}]}}],
}


def typical_status(pod):
    """What kubelet reports of a running pod of :data:`TYPICAL_SPEC`."""
    now = pod['metadata']['creationTimestamp']
    conditions = [{'type': kind, 'status': 'True', 'lastProbeTime': None,
                   'lastTransitionTime': now}
                  for kind in ('Initialized', 'Ready', 'ContainersReady', 'PodScheduled')]
    return {'status': {
        'phase': 'Running', 'conditions': conditions, 'hostIP': '192.0.2.10',
        'podIP': '10.10.0.5', 'podIPs': [{'ip': '10.10.0.5'}], 'startTime': now,
        'qosClass': 'Burstable',
        'containerStatuses': [{
            'name': 'web', 'ready': True, 'restartCount': 0, 'started': True,
            'image': 'registry.example.org/shop/web:1.42.0',
            'imageID': 'registry.example.org/shop/web@sha256:' + '0' * 64,
            'containerID': 'containerd://' + '1' * 64,
            'state': {'running': {'startedAt': now}}, 'lastState': {}}]}}
