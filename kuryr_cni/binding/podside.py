"""The pod end of every binding: one interface inside the pod's namespace.

Every driver ends the same way, whatever made the interface (the peer of a
veth pair, a MACVLAN or VLAN sub-interface): it is tagged with its owner
(``IFLA_IFALIAS``, :mod:`kuryr_cni.binding.owner_tag`), brought up with
``lo``, given the VIF's addresses and routes (the default route only on the
plug marked ``default_route``), later compared with the VIF, and removed only
when its tag names the plug. Those steps live here, shared; each works on a
netlink handle already bound to the pod namespace
(:func:`kuryr_cni.netns.iproute`) and raises what
:func:`kuryr_cni.netns.kernel_errors` makes of a kernel refusal.
"""

import errno
import ipaddress
import socket

from oslo_log import log as logging
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.ifinfmsg import IFF_UP

from kuryr_cni import netns
from kuryr_cni import rtnl
from kuryr_cni.binding import owner_tag

LOG = logging.getLogger(__name__)

LOOPBACK_INDEX = 1              # lo is always ifindex 1 in a network namespace
RT_TABLE_MAIN = rtnl.RT_TABLE_MAIN
_DEFAULT = {4: ipaddress.ip_network('0.0.0.0/0'), 6: ipaddress.ip_network('::/0')}

# Outcomes of delete_owned_link
DELETED, ABSENT, FOREIGN = 'deleted', 'absent', 'foreign'

NO_IPV6_ADDRESSES = rtnl.NO_IPV6_ADDRESSES[1]     # IFLA_AF_SPEC's value


def configure(pod, index, vif, plug, ipv6_link_local='with-ipv6'):
    """Tag interface ``index``, bring it and ``lo`` up; add the VIF's addresses and routes.

    ``pod``: a :class:`kuryr_cni.rtnl.Channel` in the pod namespace. One batch:
    owner tag and link up, ``lo`` up, the addresses, the routes. On a VIF
    without IPv6 addresses the tag goes instead with a first request turning
    off the kernel's IPv6 link-local address (unless ``ipv6_link_local`` is
    ``'always'``: see ``[binding] ipv6_link_local``), which must reach the
    kernel before the link is up. The kernel ignores an alias in the request
    that creates a link, so the tag cannot come sooner. IPv6 addresses are
    added without duplicate address detection so they are usable at once.
    """
    where = '%s in %s' % (plug.ifname, plug.netns)
    alias = owner_tag.alias(plug.container_id, plug.ifname)
    no_ipv6 = ipv6_link_local != 'always' and not _has_ipv6(vif)
    if no_ipv6:
        requests = [rtnl.set_link(index, 'tag %s and turn off its IPv6 address generation'
                                  % where, alias=alias, no_ipv6=True),
                    rtnl.set_link(index, 'bring up %s' % where, up=True)]
    else:
        requests = [rtnl.set_link(index, 'bring up %s' % where, up=True, alias=alias)]
    requests.append(rtnl.set_link(LOOPBACK_INDEX, 'bring up lo in %s' % plug.netns, up=True))
    requests += [rtnl.add_address(index, cidr, 'add address %s to %s' % (cidr, where))
                 for cidr in vif.ips]
    routes = [(dst, gw, rtnl.add_route(index, dst, gw, 'add route %s via %s to %s'
                                       % (dst, gw or 'link', where)))
              for dst, gw in wanted_routes(vif, plug)]
    requests += [request for _, _, request in routes]
    pod.send(requests)
    if no_ipv6 and rtnl.is_unsupported_family(requests[0].error):
        # A kernel without IPv6 has nothing to turn off; the tag is still wanted.
        requests[0:1] = pod.send([rtnl.set_link(index, 'tag %s' % where, alias=alias)])
    for dst, gw, request in routes:
        if dst.prefixlen == 0 and getattr(request.error, 'code', None) == errno.EEXIST:
            # Another plugin's, there first: under Multus the cluster network's
            # delegate runs before every other and owns the default route (its
            # default-route selection moves it afterwards itself). kuryr-daemon
            # kept it too (Launchpad bug 1852382).
            LOG.info('%s: the pod has a default route already: kept, the one via %s '
                     'not added', where, gw)
            request.error = None
    netns.check_answers(requests)


def _has_ipv6(vif):
    return any(ipaddress.ip_interface(cidr).version == 6 for cidr in vif.ips)


def set_without_ipv6_addresses(ipr, index, **attrs):
    """Turn off IPv6 address generation on down link ``index``, setting ``attrs`` too.

    On a link that is up already, the kernel has made its link-local address.
    A kernel without IPv6 refuses the whole request (EAFNOSUPPORT): then only
    ``attrs`` are set, as there is nothing to turn off.
    """
    try:
        ipr.link('set', index=index, IFLA_AF_SPEC=NO_IPV6_ADDRESSES, **attrs)
    except NetlinkError as exc:
        if exc.code != errno.EAFNOSUPPORT:
            raise
        if attrs:
            ipr.link('set', index=index, **attrs)


def check(pod, vif, plug):
    """How the plug's interface differs from ``vif`` (MAC, MTU, up, addresses, routes).

    Returns a list of problems, empty when everything is in place.
    """
    link = get_link(pod, plug.ifname)
    if link is None:
        return ['%s is missing in %s' % (plug.ifname, plug.netns)]
    problems = []
    index = link['index']
    if link.get('address') != vif.mac:
        problems.append('%s has MAC %s, not %s' % (plug.ifname, link.get('address'), vif.mac))
    if link.get('mtu') != vif.mtu:
        problems.append('%s has MTU %s, not %d' % (plug.ifname, link.get('mtu'), vif.mtu))
    if not link['flags'] & IFF_UP:
        problems.append('%s is down' % plug.ifname)
    have = {ipaddress.ip_interface('%s/%d' % (a.get('address'), a['prefixlen']))
            for a in pod.addr('dump') if a['index'] == index}
    for cidr in vif.ips:
        if ipaddress.ip_interface(cidr) not in have:
            problems.append('%s lacks address %s' % (plug.ifname, cidr))
    routes, defaults_elsewhere = set(), set()
    for route in pod.route('dump'):
        if route.get('table') != RT_TABLE_MAIN:
            continue
        dst = route.get('dst') or ('0.0.0.0' if route['family'] == socket.AF_INET else '::')
        dst = ipaddress.ip_network('%s/%d' % (dst, route['dst_len']))
        if route.get('oif') != index:
            if not dst.prefixlen:
                defaults_elsewhere.add(dst)
            continue
        gw = route.get('gateway')
        routes.add((dst, None if gw is None else ipaddress.ip_address(gw)))
    for dst, gw in wanted_routes(vif, plug):
        # A default route another plugin had set is kept in its place (configure).
        if (dst, gw) not in routes and dst not in defaults_elsewhere:
            problems.append('%s lacks route %s via %s' % (plug.ifname, dst, gw or 'link'))
    return problems


def delete_owned(pod, plug):
    """Delete the plug's interface in the pod namespace if its owner tag names the plug.

    An interface without tag is the plug's only if it has the plug's MAC: one
    made by a connect that died before tagging it. Anything else of that name
    (another sandbox's, another plugin's) is left alone. Returns DELETED,
    ABSENT or FOREIGN.
    """
    owner = owner_tag.alias(plug.container_id, plug.ifname)
    return delete_owned_link(pod, plug.ifname, owner, 'in %s' % plug.netns,
                             untagged_mac=plug.mac)


def delete_owned_link(ipr, ifname, owner, where, untagged_mac=None, untagged_ours=False):
    """Delete link ``ifname`` of ``ipr``'s namespace if its alias is ``owner``.

    A link without alias is deleted when ``untagged_ours`` (a host device,
    whose name is derived from its owner) or when its MAC is
    ``untagged_mac``. Returns DELETED, ABSENT or FOREIGN (left alone).
    """
    with netns.kernel_errors('remove %s %s' % (ifname, where)):
        link = get_link(ipr, ifname)
        if link is None:
            return ABSENT
        alias = link.get('ifalias')
        if alias != owner and not (not alias and (
                untagged_ours or (untagged_mac and link.get('address') == untagged_mac))):
            return FOREIGN
        try:
            ipr.link('del', index=link['index'])
        except NetlinkError as exc:
            if exc.code != errno.ENODEV:
                raise
            return ABSENT
    return DELETED


def wanted_routes(vif, plug):
    """The (network, gateway or None) routes the pod end carries."""
    wanted = [(ipaddress.ip_network(r.dst),
               None if r.gw is None else ipaddress.ip_address(r.gw)) for r in vif.routes]
    if plug.default_route:
        for gw in vif.gateways:
            gw = ipaddress.ip_address(gw)
            wanted.append((_DEFAULT[gw.version], gw))
    return wanted


def get_link(ipr, ifname):
    """The link message of ``ifname``, or None when there is no such device."""
    try:
        return ipr.link('get', ifname=ifname)[0]
    except NetlinkError as exc:
        if exc.code == errno.ENODEV:
            return None
        raise
