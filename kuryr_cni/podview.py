"""Read what a pod's network namespace holds, for CHECK: links, addresses, routes.

Read-only: one checked opening of the namespace (:mod:`kuryr_cni.netns`),
three netlink dumps, nothing changed. The result is the plain ``view``
:func:`kuryr_cni.cni.prevresult.differences` judges.
"""

import ipaddress
import socket

from kuryr_cni import netns

RT_TABLE_MAIN = 254


def observe(path, host=None):
    """``{"links": {ifname: {"mac", "addresses"}}, "routes": {(network, gateway)}}`` of ``path``.

    Addresses are ``ipaddress`` interfaces of every scope; routes are the main
    table's, both families, with None for a route without gateway. Raises
    :class:`errors.InvalidEnvironment` for a path that is no pod namespace,
    :class:`errors.BindingFailed` when the kernel refuses a dump.
    """
    with netns.open_netns(path, host=host) as fd, netns.iproute(fd) as ipr, \
            netns.kernel_errors('read the interfaces of %s' % path):
        names = {}
        links = {}
        for link in ipr.get_links():
            names[link['index']] = link.get('ifname')
            links[link.get('ifname')] = {'mac': link.get('address'), 'addresses': set()}
        for addr in ipr.addr('dump'):
            name = names.get(addr['index'])
            if name in links:
                links[name]['addresses'].add(ipaddress.ip_interface(
                    '%s/%d' % (addr.get('address'), addr['prefixlen'])))
        routes = {_route(route) for route in ipr.route('dump')
                  if route.get('table') == RT_TABLE_MAIN}
    return {'links': links, 'routes': routes}


def _route(route):
    dst = route.get('dst') or ('0.0.0.0' if route['family'] == socket.AF_INET else '::')
    gateway = route.get('gateway')
    return (ipaddress.ip_network('%s/%d' % (dst, route['dst_len']), strict=False),
            None if gateway is None else ipaddress.ip_address(gateway))
