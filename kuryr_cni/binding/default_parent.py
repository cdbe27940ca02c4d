"""The parent of nested VIFs when ``[binding] link_iface`` is unset, found as upstream finds it
but from root's sockets only, and decided once per process.

kuryr-kubernetes' CNI daemon (``kuryr_kubernetes/cni/binding/nested.py``,
``_detect_iface_name``) takes, in this order:

1. the interface holding the address kubelet listens on: when exactly one
   TCP socket of the host namespace listens on kubelet's port (10250), the
   interface that has that socket's local address;
2. otherwise the first interface, in index order, that is not a loopback.

Here step 1 counts only sockets of root (uid 0, the ``uid`` column of
``/proc/net/tcp{,6}``), as kubelet's is: any local user may listen on
10250 (an unprivileged port) on the address of an interface of their
choosing, and with the upstream rule would steer every nested pod of the
node onto it, or, by adding a second listener, off kubelet's. And the
answer is found once per process and host namespace, on first need, and
logged: a parent that moved between pods as kubelet restarted (no listener
for a moment: step 2) would split the node's pods across interfaces.

A kubelet listening on every address (``0.0.0.0`` or ``::``, its default)
holds no interface's address, so step 2 decides; nodes with more than one
interface should set ``link_iface`` (security.rst). Read-only: a /proc read
and two netlink dumps, once.
"""

import threading

from oslo_log import log as logging
from pyroute2.netlink.rtnl.ifinfmsg import IFF_LOOPBACK

from kuryr_cni import errors
from kuryr_cni import netns

LOG = logging.getLogger(__name__)

KUBELET_PORT = 10250
ROOT = 0

_decided = {}       # host namespace path (None: our own) -> interface name
_deciding = threading.Lock()


def find(host, host_netns):
    """The name of the default parent in the host namespace (``host``: its iproute),
    decided on the first call for ``host_netns`` and the same on every later one."""
    with _deciding:
        if host_netns not in _decided:
            name, why = _find(host, host_netns)
            LOG.info('Nested VIFs that name no parent use %s (%s); set [binding] '
                     'link_iface to choose', name, why)
            _decided[host_netns] = name
        return _decided[host_netns]


def _find(host, host_netns):
    """``(name, why)`` of the default parent."""
    with netns.kernel_errors('find the parent interface of nested VIFs'):
        listening = netns.listening_addresses(KUBELET_PORT, host_netns, uid=ROOT)
        links = sorted(host.link('dump'), key=lambda link: link['index'])
        if len(listening) == 1:
            holders = {addr['index'] for addr in host.addr('dump')
                       if addr.get('address') == listening[0]}
            for link in links:
                if link['index'] in holders:
                    return link.get('ifname'), ('it holds %s, where root\'s one socket on '
                                                'port %d listens' % (listening[0], KUBELET_PORT))
        for link in links:
            if not link['flags'] & IFF_LOOPBACK:
                return link.get('ifname'), ('the first interface that is not a loopback: '
                                            'root\'s %d sockets on port %d name no one '
                                            'interface' % (len(listening), KUBELET_PORT))
    raise errors.BindingFailed('no parent interface for nested VIFs',
                               'the host has no interface but loopback: set [binding] link_iface')
