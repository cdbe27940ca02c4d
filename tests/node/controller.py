"""kuryr-controller and Neutron, as the node tier plays them for one node.

:class:`Controller` follows the node's pods with a watch, as kuryr-controller
does, and gives each new pod (each UID) a KuryrPort of the pod's name, whose
``status.vifs`` hold one inactive ``VIFBridge`` on the node's bridge with an
address of its own in ``10.10.0.0/24`` (os-vif primitives, as in
:mod:`tests.unit.osvif_fixtures`). When the pod is gone from the API it
deletes the port. A pod named in :meth:`Controller.hold` gets no port until
:meth:`Controller.release`: a VIF that comes late. Like kuryr-controller, which
handles pods concurrently, it writes, activates and deletes the ports of
several pods at once (:data:`WORKERS`); one pod's steps keep their order.

Its Neutron half marks a port active only once the port's host side exists,
as Neutron does: a link with the VIF's MAC in one of the node's pod
namespaces, whose veth peer is a port of the VIF's bridge. The pod
namespaces are containerd's bind mounts, which exist only in the node's
mount namespace: they are reached through ``/proc/<holder>/root``. Like
Neutron's agents, which follow their bridge's changes as they happen, it
looks again whenever a link of the node's namespace changes (where every
host end lives, so every plug changes one), and every :data:`RESCAN`
seconds regardless. A look reads only namespaces where no VIF has been found
yet and that hold more than ``lo``, one link at a time (a dump of a
namespace's links decodes dozens of attributes of each).
"""

import contextlib
import glob
import os
import select
import socket
import threading
import time
import uuid

from kubernetes import client
from kubernetes import watch
from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
from pyroute2.netlink.rtnl import RTM_GETLINK, RTMGRP_LINK
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from kuryr_cni import netns
from kuryr_cni import rtnl
from tests.unit import osvif_fixtures as fx
from tools.testbed import host as testhost

RESCAN = 0.5                  # seconds between looks when no link changes
RELIST = 0.05                 # seconds before listing again after a failed watch
SUBNET = testhost.SUBNET_PREFIX + '.0/24'
FIRST, LAST = 2, 254          # host numbers handed out in SUBNET
WATCH_SECONDS = 5             # each watch request's own timeout: stop() is seen that soon
# API calls for different pods in flight at once, on threads of its own: the
# test's calls are not kuryr-controller's to queue behind.
WORKERS = 8


class Port:
    """What the controller gave one pod."""

    def __init__(self, namespace, name, uid, number):
        self.namespace, self.name, self.uid, self.number = namespace, name, uid, number
        self.ip = '%s.%d' % (testhost.SUBNET_PREFIX, number)
        self.mac = 'fa:16:3e:00:%02x:%02x' % (number // 256, number % 256)
        self.port_id = str(uuid.uuid4())
        self.created = time.monotonic()
        self.written = None         # the future of the KuryrPort's creation
        self.activating = False
        self.activated = None       # time.monotonic() when marked active

    def vifs(self, active):
        network = fx.network([fx.subnet(SUBNET, [self.ip], gateway=testhost.GATEWAY)])
        return fx.status_vifs(fx.bridge_vif(
            active=active, n=self.number, id=self.port_id, address=self.mac,
            bridge_name=testhost.BRIDGE, network=network))


class Controller:
    def __init__(self, cluster, node):
        self.cluster = cluster
        self.node = node
        self.ports = {}             # pod uid -> Port, while the pod exists
        self.activations = []       # (Port) in the order marked active
        self.errors = []            # what went wrong in a scan, for a failing test to show
        self._held = set()          # (namespace, name)
        self._next = FIRST
        self._lock = threading.Lock()
        self._wanted = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._known_ns = {}         # pod namespace path -> MACs found there
        self._pool = cluster.executor(WORKERS, 'stand-in-api')
        self._threads = [threading.Thread(target=self._neutron, daemon=True,
                                          name='stand-in-neutron')]
        self._watching = cluster.submit(self._watch)
        for thread in self._threads:
            thread.start()

    # What tests ask ---------------------------------------------------------------------

    def hold(self, name, namespace='default'):
        """Give the pod ``name`` no port until :meth:`release`."""
        with self._lock:
            self._held.add((namespace, name))

    def release(self, name, namespace='default'):
        with self._lock:
            self._held.discard((namespace, name))
        pod = self.cluster._json(self.cluster.core.read_namespaced_pod, name, namespace)
        self._ensure_port(pod)
        self.port(pod).written.result(timeout=60)

    def port(self, pod):
        return self.ports[pod['metadata']['uid']]

    def close(self):
        self._stop.set()
        with self._lock:
            self._wanted.notify_all()
        for thread in self._threads:
            thread.join(10)
        with contextlib.suppress(Exception):
            self._watching.result(WATCH_SECONDS * 3)
        self._pool.shutdown(wait=True, cancel_futures=True)

    # kuryr-controller ---------------------------------------------------------------------

    def _watch(self):
        api = client.CoreV1Api(self.cluster.api)
        selector = 'spec.nodeName=' + self.node.name
        version = None
        while not self._stop.is_set():
            try:
                if version is None:
                    listed = self.cluster._json(api.list_pod_for_all_namespaces,
                                                field_selector=selector)
                    for pod in listed['items']:
                        self._ensure_port(pod)
                    version = listed['metadata']['resourceVersion']
                # Raw JSON: the client's models cost milliseconds of CPU per pod.
                for event in watch.Watch().stream(
                        api.list_pod_for_all_namespaces, field_selector=selector,
                        resource_version=version, timeout_seconds=WATCH_SECONDS,
                        deserialize=False):
                    pod = event['object']
                    version = pod['metadata']['resourceVersion']
                    if event['type'] == 'DELETED':
                        self._delete_port(pod)
                    else:
                        self._ensure_port(pod)
                    if self._stop.is_set():
                        return
            except Exception as exc:    # expired (410), or the server went: list again
                self.errors.append(repr(exc))
                version = None
                self._stop.wait(RELIST)

    def _ensure_port(self, pod):
        meta = pod['metadata']
        key = (meta['namespace'], meta['name'])
        with self._lock:
            if meta['uid'] in self.ports or key in self._held or meta.get('deletionTimestamp'):
                return
            port = Port(meta['namespace'], meta['name'], meta['uid'], self._number())
            self.ports[meta['uid']] = port
            port.written = self._pool.submit(self._write, port)

    def _write(self, port):
        def create():
            self.cluster.create_kuryrport(port.namespace, port.name, self.node.name, port.uid,
                                          port.vifs(active=False))
        try:
            try:
                create()
            except client.exceptions.ApiException as exc:
                if exc.status != 409:
                    raise
                # Another incarnation's port under this name goes first, as the
                # controller's finalizer on the old pod would have it.
                self._custom().delete_namespaced_custom_object(
                    'openstack.org', 'v1', port.namespace, 'kuryrports', port.name)
                create()
        except Exception as exc:
            self.errors.append(repr(exc))
            raise
        with self._lock:
            self._wanted.notify_all()

    def _delete_port(self, pod):
        with self._lock:
            port = self.ports.pop(pod['metadata']['uid'], None)
        if port is not None:
            self._pool.submit(self._remove, port)

    def _remove(self, port):
        with contextlib.suppress(Exception):    # its creation failed: the error is recorded
            port.written.result()
        current = self.cluster._json(self._custom().list_namespaced_custom_object,
                                     'openstack.org', 'v1', port.namespace, 'kuryrports')
        for item in current['items']:
            if item['metadata']['name'] == port.name and item['spec']['podUid'] == port.uid:
                with contextlib.suppress(client.exceptions.ApiException):
                    self.cluster.call(self._custom().delete_namespaced_custom_object,
                                      'openstack.org', 'v1', port.namespace, 'kuryrports',
                                      port.name)

    def _number(self):
        used = {port.number for port in self.ports.values()}
        for _ in range(LAST - FIRST + 1):
            number, self._next = self._next, self._next + 1 if self._next < LAST else FIRST
            if number not in used:
                return number
        raise AssertionError('no address left in %s' % SUBNET)

    def _custom(self):
        return client.CustomObjectsApi(self.cluster.api)

    # Neutron ------------------------------------------------------------------------------

    def _neutron(self):
        with contextlib.closing(self._link_changes()) as changes, \
                netns.channel(self.node.path) as node_side:
            while not self._stop.is_set():
                with self._lock:
                    waiting = [p for p in self.ports.values() if not p.activating]
                    if not waiting:
                        self._wanted.wait(1)
                        continue
                try:
                    plugged = self._host_sides(node_side, {port.mac for port in waiting})
                    for port in waiting:
                        if port.mac in plugged:
                            port.activating = True
                            self._pool.submit(self._activate, port)
                except Exception as exc:    # the node changing under the look: the next one
                    self.errors.append(repr(exc))
                _wait_readable(changes, RESCAN)

    def _link_changes(self):
        """A socket of the node's namespace that becomes readable when a link changes."""
        sock = netns.socket_in(self.node.path, socket.AF_NETLINK, socket.SOCK_RAW,
                               socket.NETLINK_ROUTE)
        sock.bind((0, RTMGRP_LINK))
        return sock

    def _activate(self, port):
        try:
            self.cluster.update_kuryrport_vifs(port.namespace, port.name,
                                               port.vifs(active=True))
        except Exception:       # deleted meanwhile, or not written yet: the next scan
            port.activating = False
            return
        port.activated = time.monotonic()
        self.activations.append(port)

    def _host_sides(self, node_side, macs):
        """Which of ``macs`` have a pod end in a pod namespace and a host end on the bridge."""
        found = set()
        paths = set(self._pod_namespaces())
        for path in list(self._known_ns):
            if path not in paths:
                del self._known_ns[path]
        bridge = None
        for path in paths:
            known = self._known_ns.get(path)
            if known:
                found |= known & macs
                continue
            with contextlib.suppress(Exception):    # a namespace removed meanwhile
                names = netns.link_names(path) - {'lo'}     # ~0.05 ms: most hold only lo
                if not names:
                    continue
                with netns.channel(path) as pod_side:
                    ends = [link for link in _links(pod_side, names)
                            if link.get('address') in macs and link.get('link')]
                if ends and bridge is None:
                    bridge = _links(node_side, [testhost.BRIDGE])[0]['index']
                self._known_ns[path] = {
                    end.get('address') for end, peer in zip(ends, _links(
                        node_side, [end.get('link') for end in ends]))
                    if peer is not None and peer.get('master') == bridge}
                found |= self._known_ns[path]
        return found

    def _pod_namespaces(self):
        holder = self.node.pid('holder')
        root = '/proc/%d/root' % holder
        # [plugins."io.containerd.grpc.v1.cri"] netns_mounts_under_state_dir: the CRI
        # plugin's own state directory.
        return glob.glob(root + os.path.join(self.node.dir, 'containerd', 'state',
                                             'io.containerd.grpc.v1.cri', 'netns', 'cni-*'))


def _links(channel, keys):
    """The links named or numbered ``keys`` in ``channel``'s namespace (None: none such)."""
    requests = []
    for key in keys:
        msg = ifinfmsg()
        if isinstance(key, int):
            msg['index'] = key
        else:
            msg['attrs'] = [('IFLA_IFNAME', key)]
        requests.append(rtnl.Request(msg, RTM_GETLINK, NLM_F_REQUEST | NLM_F_ACK,
                                     'look up link %s' % key))
    links = []
    for request in channel.send(requests):
        link = None
        if request.error is None and request.echoed:
            link = ifinfmsg(request.echoed[0])
            link.decode()
        links.append(link)
    return links


def _wait_readable(sock, timeout):
    """Wait until ``sock`` has something to read, or ``timeout``; then drop what it has."""
    if select.select([sock], [], [], timeout)[0]:
        with contextlib.suppress(BlockingIOError, OSError):     # OSError: ENOBUFS, also news
            while sock.recv(65536, socket.MSG_DONTWAIT):
                pass
