"""Bridge binding: a veth pair from the pod into a Linux bridge.

::

    host namespace                        pod namespace
    [bridge vif.bridge] -- kc<hash> ====== <plug.ifname>  MAC, MTU, IPs, routes
                           alias kuryr-cni:<container>:<ifname>

The bridge is created (and brought up, with IPv6 address generation off)
when it is missing, used as it is when it exists, and never given an
address: the gateway lives on the network's router. The pod end is created
directly inside the pod namespace by the same netlink request that creates
the pair: moving a device between namespaces afterwards costs the kernel
~17 ms.

Per connect: one opening of the pod namespace (checked, then used both for
the netlink socket and as ``net_ns_fd``), and netlink round trips: host side
bridge lookup, veth creation (echoed, which gives both indexes), owner alias;
pod side link up, ``lo`` up, one per address and one per route.
"""

import contextlib
import errno
import ipaddress
import logging
import socket

from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.ifaddrmsg import IFA_F_NODAD
from pyroute2.netlink.rtnl.ifinfmsg import IFF_UP

from kuryr_cni import errors
from kuryr_cni import netns
from kuryr_cni.binding import base
from kuryr_cni.binding import owner_tag

LOG = logging.getLogger(__name__)

LOOPBACK_INDEX = 1              # lo is always ifindex 1 in a network namespace
RT_SCOPE_LINK = 253
RT_TABLE_MAIN = 254
_NO_IPV6_ADDRESSES = {'attrs': [('AF_INET6', {'attrs': [
    ('IFLA_INET6_ADDR_GEN_MODE', 1)]})]}   # IN6_ADDR_GEN_MODE_NONE: no link-local
_DEFAULT = {4: ipaddress.ip_network('0.0.0.0/0'), 6: ipaddress.ip_network('::/0')}

# Outcomes of _delete_host_end
DELETED, ABSENT, FOREIGN = 'deleted', 'absent', 'foreign'


class BridgeDriver(base.Driver):
    """Connects ``bridge`` VIFs: veth into the Linux bridge ``vif.bridge``."""

    kind = 'bridge'
    host_side = True

    def connect(self, vif, plug):
        """Create the veth pair, enslave the host end, configure the pod end.

        A device this plug left before (a retried ADD) is removed first; a
        host device of the same name carrying another owner's alias makes
        the call fail without touching it. Any failure after the pair exists
        deletes the pair (which removes both ends) before raising.
        """
        host_name = owner_tag.host_ifname(plug.container_id, plug.ifname)
        owner = owner_tag.alias(plug.container_id, plug.ifname)
        with netns.open_netns(plug.netns, host=self.host_netns) as pod_fd, \
                netns.iproute(self.host_netns, echo=True) as host, \
                netns.iproute(pod_fd) as pod:
            bridge_index = self._ensure_bridge(host, vif.bridge)
            reply = self._create_veth(
                host, pod, pod_fd, host_name, owner, bridge_index, vif, plug)
            try:
                host_index, pod_index = self._indexes(host, reply, host_name)
                with base.kernel_errors('set owner alias on %s' % host_name):
                    host.link('set', index=host_index, ifalias=owner)
                self._configure_pod(pod, pod_index, vif, plug)
            except BaseException:
                self._undo(host, host_name)
                raise

    def disconnect(self, plug):
        """Delete the host end if its alias names this plug, else the pod end.

        Deleting one end of a veth pair deletes the other, so the pod
        namespace is entered only when no host end of ours was there. An
        empty or vanished ``plug.netns`` leaves only the host side to do.
        """
        host_name = owner_tag.host_ifname(plug.container_id, plug.ifname)
        owner = owner_tag.alias(plug.container_id, plug.ifname)
        with contextlib.ExitStack() as stack:
            pod_fd = None
            if plug.netns:
                try:
                    pod_fd = stack.enter_context(
                        netns.open_netns(plug.netns, host=self.host_netns))
                except netns.NamespaceNotFound:
                    pass
            with netns.iproute(self.host_netns) as host:
                outcome = self._delete_host_end(host, host_name, owner)
            if outcome == FOREIGN:
                LOG.warning('Not deleting host device %s for %s: it carries another '
                            'owner\'s alias', host_name, owner)
            if outcome == DELETED or pod_fd is None:
                return
            with netns.iproute(pod_fd) as pod:
                self._delete_pod_end(pod, plug)

    def check(self, vif, plug):
        """Compare host end (alias, bridge, MTU, up) and pod end (MAC, MTU, IPs, routes)."""
        host_name = owner_tag.host_ifname(plug.container_id, plug.ifname)
        problems = []
        with netns.open_netns(plug.netns, host=self.host_netns) as pod_fd, \
                netns.iproute(self.host_netns) as host, \
                netns.iproute(pod_fd) as pod:
            with base.kernel_errors('inspect %s of container %s'
                                    % (plug.ifname, plug.container_id)):
                problems += self._check_host_end(host, host_name, vif, plug)
                problems += self._check_pod_end(pod, vif, plug)
        if problems:
            raise errors.CheckFailed(
                'interface %s of container %s differs from its VIF'
                % (plug.ifname, plug.container_id), '; '.join(problems))

    # -- connect steps -----------------------------------------------------

    def _ensure_bridge(self, host, name):
        """Return the index of bridge ``name``, creating it when missing."""
        with base.kernel_errors('look up bridge %s' % name):
            link = _get_link(host, name)
        if link is None:
            link = self._create_bridge(host, name)
        if link is None:
            raise errors.BindingFailed('bridge %s vanished while being created' % name)
        kind = link.get(('linkinfo', 'kind'))
        if kind != 'bridge':
            raise errors.BindingFailed('device %s exists and is not a bridge' % name,
                                       'kind %s' % kind)
        return link['index']

    def _create_bridge(self, host, name):
        """Create bridge ``name`` up and address-less; a concurrent creator wins.

        Returns its link message (None if it vanished at once).
        """
        with base.kernel_errors('create bridge %s' % name):
            try:
                host.link('add', ifname=name, kind='bridge')
            except NetlinkError as exc:
                if exc.code != errno.EEXIST:
                    raise
                LOG.debug('Bridge %s was created concurrently', name)
                return _get_link(host, name)
            link = _get_link(host, name)
            # Off before it goes up, or the kernel gives it an IPv6 link-local address.
            host.link('set', index=link['index'], IFLA_AF_SPEC=_NO_IPV6_ADDRESSES)
            host.link('set', index=link['index'], state='up')
        LOG.info('Created bridge %s', name)
        return link

    def _create_veth(self, host, pod, pod_fd, host_name, owner, bridge_index, vif, plug):
        """Create the pair in one request; return the kernel's (echoed) reply."""
        action = ('create veth %s (into bridge %s) and %s in %s'
                  % (host_name, vif.bridge, plug.ifname, plug.netns))
        with base.kernel_errors(action):
            for attempt in (1, 2):
                try:
                    reply = host.link(
                        'add', ifname=host_name, kind='veth', mtu=vif.mtu,
                        master=bridge_index, state='up',
                        peer={'ifname': plug.ifname, 'net_ns_fd': pod_fd,
                              'address': vif.mac, 'mtu': vif.mtu})
                    break
                except NetlinkError as exc:
                    if exc.code != errno.EEXIST or attempt == 2:
                        raise
                LOG.info('Replacing what %s left of %s in %s', owner, plug.ifname, plug.netns)
                self._remove_leftovers(host, pod, host_name, owner, plug)
        return reply

    def _indexes(self, host, reply, host_name):
        """(host index, pod index) of the new pair, from the echoed creation."""
        for msg in reply:
            if msg.get('ifname') == host_name and msg.get('link'):
                return msg['index'], msg.get('link')
        with base.kernel_errors('look up %s' % host_name):     # kernel without echo
            link = _get_link(host, host_name)
        if link is None or not link.get('link'):
            raise errors.BindingFailed('veth %s vanished while being set up' % host_name)
        return link['index'], link.get('link')

    def _remove_leftovers(self, host, pod, host_name, owner, plug):
        outcome = self._delete_host_end(host, host_name, owner)
        if outcome == FOREIGN:
            raise errors.BindingFailed(
                'host device %s exists and belongs to another owner' % host_name,
                'expected alias %s' % owner)
        self._delete_pod_end(pod, plug)

    def _configure_pod(self, pod, index, vif, plug):
        where = '%s in %s' % (plug.ifname, plug.netns)
        with base.kernel_errors('bring up %s' % where):
            pod.link('set', index=index, state='up')
        with base.kernel_errors('bring up lo in %s' % plug.netns):
            pod.link('set', index=LOOPBACK_INDEX, state='up')
        for cidr in vif.ips:
            iface = ipaddress.ip_interface(cidr)
            # NODAD: usable at once, not "tentative" for a second or more.
            extra = {'flags': IFA_F_NODAD} if iface.version == 6 else {}
            with base.kernel_errors('add address %s to %s' % (cidr, where)):
                pod.addr('add', index=index, address=str(iface.ip),
                         prefixlen=iface.network.prefixlen, **extra)
        for dst, gw in _wanted_routes(vif, plug):
            spec = {'dst': str(dst), 'oif': index, 'family': _family(dst)}
            if gw is None:
                spec['scope'] = RT_SCOPE_LINK
            else:
                spec['gateway'] = str(gw)
            with base.kernel_errors('add route %s via %s to %s' % (dst, gw or 'link', where)):
                pod.route('add', **spec)

    def _undo(self, host, host_name):
        """Delete a half-made pair (both ends go); never raises."""
        try:
            host.link('del', ifname=host_name)
        except Exception:   # the original error matters more
            LOG.exception('Could not remove half-made device %s', host_name)

    # -- disconnect steps --------------------------------------------------

    def _delete_host_end(self, host, host_name, owner):
        """Delete host device ``host_name`` if ``owner`` owns it.

        A device without alias is ours too: its name is derived from this
        owner and it was left by a connect that died before setting the
        alias. Returns DELETED, ABSENT or FOREIGN.
        """
        with base.kernel_errors('remove host device %s' % host_name):
            link = _get_link(host, host_name)
            if link is None:
                return ABSENT
            if link.get('ifalias') not in (owner, None, ''):
                return FOREIGN
            try:
                host.link('del', index=link['index'])
            except NetlinkError as exc:
                if exc.code != errno.ENODEV:
                    raise
                return ABSENT
        return DELETED

    def _delete_pod_end(self, pod, plug):
        with base.kernel_errors('remove %s in %s' % (plug.ifname, plug.netns)):
            try:
                pod.link('del', ifname=plug.ifname)
            except NetlinkError as exc:
                if exc.code != errno.ENODEV:
                    raise

    # -- check steps -------------------------------------------------------

    def _check_host_end(self, host, host_name, vif, plug):
        link = _get_link(host, host_name)
        if link is None:
            return ['host device %s is missing' % host_name]
        problems = []
        owner = owner_tag.alias(plug.container_id, plug.ifname)
        if link.get('ifalias') != owner:
            problems.append('host device %s has alias %r, not %r'
                            % (host_name, link.get('ifalias'), owner))
        bridge = _get_link(host, vif.bridge)
        if bridge is None:
            problems.append('bridge %s is missing' % vif.bridge)
        elif link.get('master') != bridge['index']:
            problems.append('host device %s is not enslaved to bridge %s'
                            % (host_name, vif.bridge))
        if link.get('mtu') != vif.mtu:
            problems.append('host device %s has MTU %s, not %d'
                            % (host_name, link.get('mtu'), vif.mtu))
        if not link['flags'] & IFF_UP:
            problems.append('host device %s is down' % host_name)
        return problems

    def _check_pod_end(self, pod, vif, plug):
        link = _get_link(pod, plug.ifname)
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
        routes = set()
        for route in pod.route('dump'):
            if route.get('oif') != index or route.get('table') != RT_TABLE_MAIN:
                continue
            dst = route.get('dst') or ('0.0.0.0' if route['family'] == socket.AF_INET else '::')
            dst = ipaddress.ip_network('%s/%d' % (dst, route['dst_len']))
            gw = route.get('gateway')
            routes.add((dst, None if gw is None else ipaddress.ip_address(gw)))
        for dst, gw in _wanted_routes(vif, plug):
            if (dst, gw) not in routes:
                problems.append('%s lacks route %s via %s' % (plug.ifname, dst, gw or 'link'))
        return problems


def _wanted_routes(vif, plug):
    """The (network, gateway or None) routes the pod end carries."""
    wanted = [(ipaddress.ip_network(r.dst),
               None if r.gw is None else ipaddress.ip_address(r.gw)) for r in vif.routes]
    if plug.default_route:
        for gw in vif.gateways:
            gw = ipaddress.ip_address(gw)
            wanted.append((_DEFAULT[gw.version], gw))
    return wanted


def _family(network):
    return socket.AF_INET if network.version == 4 else socket.AF_INET6


def _get_link(ipr, ifname):
    """The link message of ``ifname``, or None when there is no such device."""
    try:
        return ipr.link('get', ifname=ifname)[0]
    except NetlinkError as exc:
        if exc.code == errno.ENODEV:
            return None
        raise
