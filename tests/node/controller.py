"""kuryr-controller and Neutron, as the node tier plays them for one node.

:class:`Controller` follows the node's pods with a watch, as kuryr-controller
does, and gives each new pod (each UID) a KuryrPort of the pod's name, whose
``status.vifs`` hold one inactive ``VIFBridge`` on the node's bridge with an
address of its own in ``10.10.0.0/24`` (os-vif primitives, as in
:mod:`tests.unit.osvif_fixtures`). When the pod is gone from the API (a
DELETED event, or absent from a relisting) it deletes the port. A pod named in
:meth:`Controller.hold` gets no port until :meth:`Controller.release`: a VIF
that comes late. Like kuryr-controller, which handles pods concurrently, it
writes and deletes the ports of several pods at once (:data:`WORKERS`), and its
Neutron half activates them on threads of its own, as Neutron's server is
another process: an activation never waits behind a burst's writes.

Its Neutron half marks a port active only once the port's host side exists,
as Neutron does: a port of the VIF's bridge whose veth peer, in another
namespace, has the VIF's MAC. Like Neutron's agents, which follow their
bridge as it changes, it follows the node namespace's link events (every
host end lives there) and keeps the bridge's ports, each with its peer's
namespace ID and index (``IFLA_LINK_NETNSID``, ``IFLA_LINK``); it reads the
peer from the node's namespace by that ID (``IFLA_TARGET_NETNSID``), without
entering the pod's. Events lost to a full socket, and every :data:`RESCAN`
seconds while a port waits, it lists the bridge's ports again.
"""

import contextlib
import select
import socket
import struct
import threading
import time
import uuid

from kubernetes import client
from kubernetes import watch
from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
from pyroute2.netlink.rtnl import RTM_DELLINK, RTM_GETLINK, RTM_NEWLINK, RTMGRP_LINK
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from kuryr_cni import netns
from kuryr_cni import rtnl
from tests.unit import osvif_fixtures as fx
from tools.testbed import host as testhost

_HEADER = struct.Struct('=IHHII')       # nlmsghdr
_IFINFO = struct.Struct('=BxHiII')      # ifinfomsg
_IFLA_LINK_NETNSID = 37
_LINK_ATTRS = {5: 'link', 10: 'master', _IFLA_LINK_NETNSID: 'link_netnsid'}
_SO_RCVBUFFORCE = 33          # not in Python's socket module
EVENT_BUFFER = 8 << 20        # bytes of link events the socket holds
RESCAN = 2                    # seconds between listings of the bridge's ports
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
        self.written_at = None      # time.monotonic() once it is created
        self.activating = False
        self.plugged_seen = None    # time.monotonic() when its host side was seen
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
        self._stop = threading.Event()
        # Host end index -> [peer's namespace ID, peer's index, peer's MAC once read].
        self._bridge_ports = {}
        self._pool = cluster.executor(WORKERS, 'stand-in-api')
        self._activating = cluster.executor(WORKERS, 'stand-in-activate')
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

    def account(self):
        """What it did for the pods it holds ports for, and its errors: for a failing
        test to say whether the control plane or the daemon was late."""
        with self._lock:
            ports = list(self.ports.values())
        unwritten = sum(p.written is None or not p.written.done() for p in ports)
        inactive = sorted(p.name for p in ports if p.activated is None)
        delays = sorted(p.activated - p.created for p in ports if p.activated is not None)
        lines = ['%d ports, %d not written yet, %d not active%s'
                 % (len(ports), unwritten, len(inactive),
                    ': ' + ' '.join(inactive[:20]) if inactive else '')]
        if delays:
            lines.append('active after their creation: median %.2f s, slowest %.2f s'
                         % (delays[len(delays) // 2], delays[-1]))
        return '\n'.join(lines + ['error: ' + e for e in self.errors[-20:]])

    def close(self):
        self._stop.set()
        for thread in self._threads:
            thread.join(10)
        with contextlib.suppress(Exception):
            self._watching.result(WATCH_SECONDS * 3)
        for pool in (self._pool, self._activating):
            pool.shutdown(wait=True, cancel_futures=True)

    # kuryr-controller ---------------------------------------------------------------------

    def _watch(self):
        api = client.CoreV1Api(self.cluster.api)
        selector = 'spec.nodeName=' + self.node.name
        version = None
        while not self._stop.is_set():
            try:
                if version is None:
                    asked = time.monotonic()
                    listed = self.cluster._json(api.list_pod_for_all_namespaces,
                                                field_selector=selector)
                    for pod in listed['items']:
                        self._ensure_port(pod)
                    self._forget_unlisted({pod['metadata']['uid'] for pod in listed['items']},
                                          asked)
                    version = listed['metadata']['resourceVersion']
                # Raw JSON: the client's models cost milliseconds of CPU per pod.
                for event in watch.Watch().stream(
                        api.list_pod_for_all_namespaces, field_selector=selector,
                        resource_version=version, timeout_seconds=WATCH_SECONDS,
                        _request_timeout=WATCH_SECONDS * 3,     # silent past its end: again
                        deserialize=False):
                    pod = event['object']
                    version = pod['metadata']['resourceVersion']
                    if event['type'] == 'DELETED':
                        self._delete_port(pod['metadata']['uid'])
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
                # controller's finalizer on the old pod would have it; the old pod's
                # own removal (_remove) may take it first.
                try:
                    self.cluster.custom.delete_namespaced_custom_object(
                        'openstack.org', 'v1', port.namespace, 'kuryrports', port.name)
                except client.exceptions.ApiException as gone:
                    if gone.status != 404:
                        raise
                create()
            port.written_at = time.monotonic()
        except Exception as exc:
            self.errors.append(repr(exc))
            raise

    def _forget_unlisted(self, listed_uids, asked):
        """Delete the ports of pods a list asked for at ``asked`` no longer shows: pods
        deleted while no watch ran (its version expired, or the server went), whose
        DELETED events nobody will send. An informer's relist does the same."""
        with self._lock:
            gone = [uid for uid, port in self.ports.items()
                    if uid not in listed_uids and port.created < asked]
        for uid in gone:
            self._delete_port(uid)

    def _delete_port(self, uid):
        with self._lock:
            port = self.ports.pop(uid, None)
        if port is not None:
            self._pool.submit(self._remove, port)

    def _remove(self, port):
        with contextlib.suppress(Exception):    # its creation failed: the error is recorded
            port.written.result()
        try:
            item = self.cluster._json(self.cluster.custom.get_namespaced_custom_object,
                                      'openstack.org', 'v1', port.namespace, 'kuryrports',
                                      port.name)
        except client.exceptions.ApiException as exc:
            if exc.status != 404:
                self.errors.append(repr(exc))
            return
        if item['spec']['podUid'] == port.uid:
            # That object only: a new incarnation's port may have replaced it by now.
            only = client.V1DeleteOptions(
                preconditions=client.V1Preconditions(uid=item['metadata']['uid']))
            with contextlib.suppress(client.exceptions.ApiException):
                self.cluster.call(self.cluster.custom.delete_namespaced_custom_object,
                                  'openstack.org', 'v1', port.namespace, 'kuryrports',
                                  port.name, body=only)

    def _number(self):
        used = {port.number for port in self.ports.values()}
        for _ in range(LAST - FIRST + 1):
            number, self._next = self._next, self._next + 1 if self._next < LAST else FIRST
            if number not in used:
                return number
        raise AssertionError('no address left in %s' % SUBNET)

    # Neutron ------------------------------------------------------------------------------

    def _neutron(self):
        with contextlib.closing(self._link_changes()) as changes, \
                netns.channel(self.node.path) as node_side:
            bridge = listed = None
            while not self._stop.is_set():
                try:
                    if bridge is None:
                        bridge = _links(node_side, [(testhost.BRIDGE, None)])[0]['index']
                    with self._lock:
                        waiting = {p.mac: p for p in self.ports.values() if not p.activating}
                    if waiting and (listed is None or time.monotonic() - listed > RESCAN):
                        self._list_bridge_ports(bridge)
                        listed = time.monotonic()
                    if waiting:
                        for mac in self._pod_end_macs(node_side) & set(waiting):
                            port = waiting[mac]
                            port.activating = True
                            port.plugged_seen = port.plugged_seen or time.monotonic()
                            self._activating.submit(self._activate, port)
                    if select.select([changes], [], [], RESCAN)[0] and \
                            not self._follow_changes(changes, bridge):
                        listed = None
                except Exception as exc:    # the node changing under the look: the next one
                    self.errors.append(repr(exc))
                    bridge = listed = None
                    self._stop.wait(RELIST)

    def _link_changes(self):
        """A socket of the node's namespace that receives its link events."""
        sock = netns.socket_in(self.node.path, socket.AF_NETLINK, socket.SOCK_RAW,
                               socket.NETLINK_ROUTE)
        # Room for a burst's events while this thread waits for the GIL or the kernel's
        # rtnl lock (beyond the default rmem_max: root may force it): a lost event
        # costs a relisting.
        sock.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, EVENT_BUFFER)
        sock.bind((0, RTMGRP_LINK))
        return sock

    def _follow_changes(self, changes, bridge):
        """Apply the link events waiting on ``changes`` to the bridge's ports; False if
        some were lost (the socket's buffer was full)."""
        while True:
            try:
                data = changes.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return True
            except OSError:         # ENOBUFS: events were dropped
                return False
            for msg_type, link in _link_events(data):
                self._note(link, bridge, msg_type == RTM_NEWLINK)

    def _list_bridge_ports(self, bridge):
        with netns.iproute(self.node.path) as ipr:
            links = ipr.get_links()
        present = set()
        for link in links:
            if link.get('master') == bridge:
                present.add(link['index'])
                self._note(link, bridge, True)
        for index in set(self._bridge_ports) - present:
            del self._bridge_ports[index]

    def _note(self, link, bridge, exists):
        index = link['index']
        peer = [link.get('link_netnsid'), link.get('link')]
        if not exists or link.get('master') != bridge or None in peer:
            self._bridge_ports.pop(index, None)
        elif self._bridge_ports.get(index, [None, None])[:2] != peer:
            self._bridge_ports[index] = peer + [None]

    def _pod_end_macs(self, node_side):
        """The MACs of the bridge ports' peers, each read once."""
        unread = [port for port in self._bridge_ports.values() if port[2] is None]
        for port, end in zip(unread, _links(node_side, [(index, nsid)
                                                        for nsid, index, _ in unread])):
            if end is not None:
                port[2] = end.get('address')
        return {port[2] for port in self._bridge_ports.values() if port[2]}

    def _activate(self, port):
        try:
            self.cluster.update_kuryrport_vifs(port.namespace, port.name,
                                               port.vifs(active=True))
        except Exception:       # deleted meanwhile, or not written yet: the next scan
            port.activating = False
            return
        port.activated = time.monotonic()
        self.activations.append(port)


def _links(channel, keys):
    """The links ``(name or index, namespace ID or None: the channel's)`` from ``channel``
    (None where there is no such link)."""
    requests = []
    for key, nsid in keys:
        msg = ifinfmsg()
        if isinstance(key, int):
            msg['index'] = key
        else:
            msg['attrs'].append(('IFLA_IFNAME', key))
        if nsid is not None:
            msg['attrs'].append(('IFLA_IF_NETNSID', nsid))   # IFLA_TARGET_NETNSID
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


def _link_events(data):
    """``(type, {'index', 'master', 'link', 'link_netnsid'})`` of the link messages in
    ``data``, read with ``struct``: every plug brings several, and
    pyroute2 would decode every attribute of each (~0.3 ms)."""
    offset = 0
    while offset + _HEADER.size + _IFINFO.size <= len(data):
        length, msg_type = _HEADER.unpack_from(data, offset)[:2]
        if length < _HEADER.size:
            return
        family, _type, index = _IFINFO.unpack_from(data, offset + _HEADER.size)[:3]
        if msg_type in (RTM_NEWLINK, RTM_DELLINK) and family != socket.AF_BRIDGE:
            link = {'index': index}
            at = offset + _HEADER.size + _IFINFO.size
            while at + 4 <= offset + length:
                size, kind = struct.unpack_from('=HH', data, at)
                if size < 4:
                    break
                if kind in _LINK_ATTRS:
                    link[_LINK_ATTRS[kind]] = struct.unpack_from(
                        '=i' if kind == _IFLA_LINK_NETNSID else '=I', data, at + 4)[0]
                at += (size + 3) & ~3
            yield msg_type, link
        offset += (length + 3) & ~3
