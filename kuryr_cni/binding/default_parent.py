"""The parent of nested VIFs when ``[binding] link_iface`` is unset, found as upstream finds it.

kuryr-kubernetes' CNI daemon (``kuryr_kubernetes/cni/binding/nested.py``,
``_detect_iface_name``) takes, in this order:

1. the interface holding the address kubelet listens on: when exactly one
   TCP socket of the host namespace listens on kubelet's port (10250), the
   interface that has that socket's local address;
2. otherwise the first interface, in index order, that is not a loopback.

A kubelet listening on every address (``0.0.0.0`` or ``::``, its default)
holds no interface's address, so step 2 decides; nodes with more than one
interface should set ``link_iface``. Read-only: a /proc read and two netlink
dumps per call.
"""

from pyroute2.netlink.rtnl.ifinfmsg import IFF_LOOPBACK

from kuryr_cni import errors
from kuryr_cni import netns

KUBELET_PORT = 10250


def find(host, host_netns):
    """The name of the default parent in the host namespace (``host``: its iproute)."""
    with netns.kernel_errors('find the parent interface of nested VIFs'):
        listening = netns.listening_addresses(KUBELET_PORT, host_netns)
        links = sorted(host.link('dump'), key=lambda link: link['index'])
        if len(listening) == 1:
            holders = {addr['index'] for addr in host.addr('dump')
                       if addr.get('address') == listening[0]}
            for link in links:
                if link['index'] in holders:
                    return link.get('ifname')
        for link in links:
            if not link['flags'] & IFF_LOOPBACK:
                return link.get('ifname')
    raise errors.BindingFailed('no parent interface for nested VIFs',
                               'the host has no interface but loopback: set [binding] link_iface')
