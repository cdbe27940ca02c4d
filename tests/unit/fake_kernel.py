"""A recording stand-in for rtnetlink, for the nested (vlan, macvlan) drivers.

Why a stand-in at all: the kernel of the development and CI machines has no
802.1Q support (no 8021q module; "Unknown device type"), so a VLAN link
cannot be made there and the vlan driver's functional tests skip. These
tests still have to prove what the driver asks of the kernel and how it
behaves when the kernel refuses. The stand-in replaces exactly the driver's
ways into a namespace (:func:`kuryr_cni.netns.open_netns`,
:func:`kuryr_cni.netns.iproute` and :func:`kuryr_cni.netns.channel`),
records every request with its namespace, and models only the kernel rules
the drivers depend on:

- a device is created in the namespace of ``net_ns_fd`` (else the caller's),
  with ``IFLA_LINK`` looked up in the caller's namespace;
- names are unique per namespace (EEXIST);
- a VLAN ID is unique per parent across all namespaces (EEXIST), as
  ``vlan_check_real_dev`` enforces;
- a sub-interface's MTU may not exceed its parent's (EINVAL);
- unknown devices are ENODEV; a kind the kernel lacks is EOPNOTSUPP.

Link messages are plain dicts whose tuple keys mimic pyroute2's nested
look-ups (``("linkinfo", "kind")``).
"""

import contextlib
import errno
import itertools
import socket

from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.ifinfmsg import IFF_UP
from pyroute2.iproute.linux import get_arguments_processor
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from kuryr_cni import netns as real_netns
from kuryr_cni.binding import podside


class FakeKernel:
    def __init__(self, kinds=('vlan', 'macvlan', 'veth')):
        self.kinds = set(kinds)
        self.namespaces = {}        # name -> {"links": {index: link}, "addrs": [], "routes": []}
        self.requests = []          # (namespace, method, command, kwargs)
        self.failures = {}          # (method, command) -> NetlinkError raised once
        self._index = itertools.count(2)
        self._fds = {}
        self._fd = itertools.count(100)

    # -- building the world -------------------------------------------------------

    def add_namespace(self, name):
        ns = {'links': {}, 'addrs': [], 'routes': []}
        self.namespaces[name] = ns
        self._put(name, {'ifname': 'lo', 'mtu': 65536, 'flags': 0})
        return name

    def add_link(self, ns, ifname, attrs=None):
        link = {'ifname': ifname, 'mtu': 1500, 'flags': IFF_UP}
        link.update(attrs or {})
        return self._put(ns, link)

    def _put(self, ns, link):
        link['index'] = 1 if link['ifname'] == 'lo' else next(self._index)
        self.namespaces[ns]['links'][link['index']] = link
        return link

    def links(self, ns):
        return {link['ifname']: link for link in self.namespaces[ns]['links'].values()}

    def requests_in(self, ns, method=None):
        return [(m, c, kw) for (n, m, c, kw) in self.requests
                if n == ns and (method is None or m == method)]

    # -- the driver's way in ----------------------------------------------------------

    def netns_module(self):
        """An object standing in for :mod:`kuryr_cni.netns` inside the driver module."""
        kernel = self

        class Netns:
            NamespaceNotFound = real_netns.NamespaceNotFound
            kernel_errors = staticmethod(real_netns.kernel_errors)    # no I/O: the real one
            check_answers = staticmethod(real_netns.check_answers)    # no I/O: the real one

            @staticmethod
            @contextlib.contextmanager
            def open_netns(path, host=None):
                if path not in kernel.namespaces:
                    raise real_netns.NamespaceNotFound('network namespace %s does not exist'
                                                       % path)
                fd = next(kernel._fd)
                kernel._fds[fd] = path
                yield fd

            @staticmethod
            @contextlib.contextmanager
            def iproute(path, timeout=None, echo=False):
                yield FakeIPRoute(kernel, kernel._fds.get(path, path))

            @staticmethod
            @contextlib.contextmanager
            def channel(path, timeout=None):
                yield FakeChannel(kernel, kernel._fds.get(path, path))

        return Netns


class FakeIPRoute:
    """The subset of pyroute2's IPRoute the drivers call, answered by :class:`FakeKernel`."""

    def __init__(self, kernel, ns):
        self.kernel = kernel
        self.ns = ns

    def _record(self, method, command, kwargs):
        self.kernel.requests.append((self.ns, method, command, dict(kwargs)))
        failure = self.kernel.failures.pop((method, command), None)
        if failure is not None:
            raise failure

    def _find(self, ns, index=None, ifname=None):
        for link in self.kernel.namespaces[ns]['links'].values():
            if (index is not None and link['index'] == index) or \
                    (index is None and link['ifname'] == ifname):
                return link
        raise NetlinkError(errno.ENODEV, 'No such device')

    def link(self, command, **kw):
        self._record('link', command, kw)
        links = self.kernel.namespaces[self.ns]['links']
        if command == 'get':
            return [dict(self._find(self.ns, kw.get('index'), kw.get('ifname')))]
        if command == 'dump':
            return [dict(link) for link in links.values()]
        if command == 'add':
            return self._add(kw)
        if command == 'set':
            link = self._find(self.ns, kw.get('index'), kw.get('ifname'))
            if 'ifalias' in kw:
                link['ifalias'] = kw['ifalias']
            if kw.get('state') == 'up':
                link['flags'] |= IFF_UP
            return []
        if command == 'del':
            link = self._find(self.ns, kw.get('index'), kw.get('ifname'))
            del links[link['index']]
            return []
        raise NotImplementedError(command)

    def _add(self, kw):
        kind = kw['kind']
        if kind not in self.kernel.kinds:
            raise NetlinkError(errno.EOPNOTSUPP, 'Unknown device type')
        target = self.kernel._fds.get(kw.get('net_ns_fd'), self.ns)
        parent = self._find(self.ns, index=kw['link'])
        if kw['ifname'] in self.kernel.links(target):
            raise NetlinkError(errno.EEXIST, 'File exists')
        if kind == 'vlan':
            for ns in self.kernel.namespaces.values():
                for link in ns['links'].values():
                    if (link.get('link') == parent['index']
                            and link.get(('linkinfo', 'data', 'vlan_id')) == kw['vlan_id']):
                        raise NetlinkError(errno.EEXIST, 'VLAN device already exists')
        if kw.get('mtu', 0) > parent['mtu']:
            raise NetlinkError(errno.EINVAL, 'Invalid argument')
        link = {'ifname': kw['ifname'], 'mtu': kw.get('mtu', parent['mtu']), 'flags': 0,
                'address': kw.get('address'), 'link': parent['index'],
                ('linkinfo', 'kind'): kind}
        if kind == 'vlan':
            link[('linkinfo', 'data', 'vlan_id')] = kw['vlan_id']
        if kind == 'macvlan':
            link[('linkinfo', 'data', 'macvlan_mode')] = kw['macvlan_mode']
        self.kernel._put(target, link)
        return []

    def addr(self, command, **kw):
        self._record('addr', command, kw)
        if command == 'add':
            self._find(self.ns, index=kw['index'])
            self.kernel.namespaces[self.ns]['addrs'].append(kw)
            return []
        if command == 'dump':
            return [dict(a) for a in self.kernel.namespaces[self.ns]['addrs']]
        raise NotImplementedError(command)

    def route(self, command, **kw):
        self._record('route', command, kw)
        if command == 'add':
            dst, _, length = kw['dst'].partition('/')
            self.kernel.namespaces[self.ns]['routes'].append({
                'oif': kw['oif'], 'table': 254, 'family': kw['family'], 'dst_len': int(length),
                'dst': None if int(length) == 0 else dst, 'gateway': kw.get('gateway')})
            return []
        if command == 'dump':
            return [dict(r) for r in self.kernel.namespaces[self.ns]['routes']]
        raise NotImplementedError(command)


class FakeChannel:
    """:class:`kuryr_cni.rtnl.Channel`'s ``send``, each request answered by :class:`FakeIPRoute`.

    Every message is encoded as it would go to the kernel and decoded again,
    then recorded as the ``IPRoute`` call that asks the same (``link set``,
    ``addr add``, ``route add``); a refusal becomes the request's ``error``
    and the batch goes on, as the kernel does.
    """

    def __init__(self, kernel, ns):
        self.ipr = FakeIPRoute(kernel, ns)

    def send(self, requests):
        for request in requests:
            msg = request.msg
            msg.encode()
            wire = type(msg)(msg.data)
            wire.decode()
            try:
                self._apply(wire)
            except NetlinkError as exc:
                request.error = exc
        return requests

    def _apply(self, wire):
        if isinstance(wire, ifinfmsg):
            kw = {'index': wire['index']}
            if wire['change'] & wire['flags'] & IFF_UP:
                kw['state'] = 'up'
            if wire.get_attr('IFLA_IFALIAS') is not None:
                kw['ifalias'] = wire.get_attr('IFLA_IFALIAS')
            if wire.get_attr('IFLA_AF_SPEC') is not None:
                kw['IFLA_AF_SPEC'] = podside.NO_IPV6_ADDRESSES
            return self.ipr.link('set', **kw)
        if isinstance(wire, ifaddrmsg):
            kw = {'index': wire['index'], 'address': wire.get_attr('IFA_ADDRESS'),
                  'prefixlen': wire['prefixlen']}
            if wire['flags']:
                kw['flags'] = wire['flags']
            return self.ipr.addr('add', **kw)
        default = '0.0.0.0' if wire['family'] == socket.AF_INET else '::'
        kw = {'dst': '%s/%d' % (wire.get_attr('RTA_DST') or default, wire['dst_len']),
              'oif': wire.get_attr('RTA_OIF'), 'family': wire['family']}
        if wire.get_attr('RTA_GATEWAY'):
            kw['gateway'] = wire.get_attr('RTA_GATEWAY')
        else:
            kw['scope'] = wire['scope']
        return self.ipr.route('add', **kw)


def encode_link_request(command, kwargs):
    """The ifinfmsg pyroute2 builds and sends for ``link(command, **kwargs)``, decoded.

    Built by pyroute2's own request filters (as ``IPRoute.link`` does),
    encoded to the bytes that would go to the kernel and decoded again, so
    a test sees the exact attributes on the wire.
    """
    processor = get_arguments_processor('link', command, dict(kwargs))
    msg = ifinfmsg()
    for field in msg.fields:
        msg[field[0]] = processor.get_value(field[0], default=0, mode='field')
    for key, value in processor.items():
        nla = ifinfmsg.name2nla(key)
        if msg.valid_nla(nla) and value is not None:
            msg['attrs'].append([nla, value])
    msg.encode()
    wire = ifinfmsg(msg.data)
    wire.decode()
    return wire
