"""Bridge binding: a veth pair from the pod into a Linux bridge.

::

    host namespace                        pod namespace
    [bridge vif.bridge] -- kc<hash> ====== <plug.ifname>  MAC, MTU, IPs, routes
                           alias kuryr-cni:<container>:<ifname>

The bridge must exist: it is used as it is, never created (a bridge nobody
made is one nobody connected to a network; security.rst says why the
daemon makes none) and never given an address: the gateway lives on the
network's router. Nor is the host end,
which is only a port: with the kernel's IPv6 link-local address, each port
would repeat DAD, MLD reports and router solicitations (the last without
end) that the bridge floods to every other port, work that grows with the
square of the pods on the bridge. A VIF whose MTU exceeds the bridge's is
refused. The pod end is configured by
:mod:`kuryr_cni.binding.podside`, as every driver's is. The pod end is created
directly inside the pod namespace by the same netlink request that creates
the pair: moving a device between namespaces afterwards costs the kernel
~17 ms.

Per connect: one opening of the pod namespace (checked, then used both for
the netlink socket and as ``net_ns_fd``), the host side bridge lookup (at
most once a second, ``BRIDGE_TRUSTED_FOR``), and three batches of netlink
requests (:mod:`kuryr_cni.rtnl`), each one write and its answers: the veth
creation (echoed, which gives both indexes); the host end's owner alias, IPv6
address generation off and link up; the pod end's IPv6 address generation
off (for a VIF without IPv6 addresses), tag and link up, ``lo`` up, its
addresses and its routes.
"""

import contextlib
import errno
import time
import typing

from oslo_log import log as logging
from pyroute2.netlink.rtnl.ifinfmsg import IFF_UP

from kuryr_cni import errors
from kuryr_cni import netns
from kuryr_cni import rtnl
from kuryr_cni.binding import base
from kuryr_cni.binding import owner_tag
from kuryr_cni.binding import podside
from kuryr_cni.binding import policy

LOG = logging.getLogger(__name__)

# Outcomes of podside.delete_owned_link
DELETED, ABSENT, FOREIGN = podside.DELETED, podside.ABSENT, podside.FOREIGN

# Seconds a looked-up bridge is used without asking the kernel again: the
# lookup is the dearest request of a connect (~0.5 ms of CPU, a whole link
# message to decode), and a burst of ADDs needs it only once. It bounds how
# long a changed bridge MTU goes unnoticed.
BRIDGE_TRUSTED_FOR = 1.0


class _Bridge(typing.NamedTuple):
    index: int
    mtu: int | None


class BridgeDriver(base.Driver):
    """Connects ``bridge`` VIFs: veth into the Linux bridge ``vif.bridge``."""

    kind = 'bridge'
    host_side = True

    def __init__(self, host_netns=None, options=None):
        super().__init__(host_netns, options)
        self._bridges = {}      # name -> (_Bridge, monotonic time it is trusted until)

    def connect(self, vif, plug):
        """Create the veth pair, enslave the host end, configure the pod end.

        A device this plug left before (a retried ADD) is removed first; a
        host device of the same name carrying another owner's alias makes
        the call fail without touching it. Any failure after the pair exists
        deletes the pair (which removes both ends) before raising.
        """
        with self._namespaces(plug) as (host, pod_fd):
            bridge = self._bridge(host, vif)
            base.check_mtu(vif, bridge.mtu, 'bridge %s' % vif.bridge)
            self._plug_veth(host, pod_fd, bridge.index, vif, plug)

    def disconnect(self, plug):
        """Delete the host end if its alias names this plug, else the pod end if it does.

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
                if podside.delete_owned(pod, plug) == FOREIGN:
                    LOG.warning('Not deleting %s in %s: it is not tagged for %s',
                                plug.ifname, plug.netns, owner)

    def check(self, vif, plug):
        """Compare host end (alias, bridge, MTU, up) and pod end (MAC, MTU, IPs, routes)."""
        host_name = owner_tag.host_ifname(plug.container_id, plug.ifname)
        problems = []
        with netns.open_netns(plug.netns, host=self.host_netns) as pod_fd, \
                netns.iproute(self.host_netns) as host, \
                netns.iproute(pod_fd) as pod:
            with netns.kernel_errors('inspect %s of container %s'
                                     % (plug.ifname, plug.container_id)):
                problems += self._check_host_end(host, host_name, vif, plug)
                problems += podside.check(pod, vif, plug)
        if problems:
            raise errors.CheckFailed(
                'interface %s of container %s differs from its VIF'
                % (plug.ifname, plug.container_id), '; '.join(problems))

    # -- connect steps -----------------------------------------------------

    @contextlib.contextmanager
    def _namespaces(self, plug):
        """``(host, pod_fd)``: pyroute2 in the host namespace, the pod namespace's descriptor."""
        with netns.open_netns(plug.netns, host=self.host_netns) as pod_fd, \
                netns.iproute(self.host_netns) as host:
            yield host, pod_fd

    def _plug_veth(self, host, pod_fd, master, vif, plug, attach=None):
        """Make the plug's veth pair, host end into bridge index ``master`` (None: no
        kernel master), tagged and up; ``attach(host_name)`` when given; then the pod end.

        Three batches of netlink requests (:mod:`kuryr_cni.rtnl`): the pair, the
        host end's tag and state, the pod end's configuration. Any failure after
        the pair exists deletes the pair before raising.
        """
        host_name = owner_tag.host_ifname(plug.container_id, plug.ifname)
        owner = owner_tag.alias(plug.container_id, plug.ifname)
        with netns.channel(self.host_netns) as host_channel:
            created = self._create_veth(host_channel, host, pod_fd, host_name, owner, master,
                                        vif, plug)
            try:
                host_index, pod_index = self._indexes(created, host_name, plug, pod_fd)
                self._finish_host_end(host_channel, host_index, host_name, owner)
                if attach is not None:
                    attach(host_name)
                with netns.channel(pod_fd) as pod:
                    podside.configure(pod, pod_index, vif, plug, self.options.ipv6_link_local)
            except BaseException:
                self._undo(host, host_name)
                raise

    def _bridge(self, host, vif):
        """The index and MTU of bridge ``vif.bridge``, remembered or looked up.

        A bridge looked up less than BRIDGE_TRUSTED_FOR ago is used as it was
        then if its index still names it (indexes are not reused soon) and
        its MTU was large enough for ``vif`` (it may have been raised since).
        """
        remembered, until = self._bridges.get(vif.bridge, (None, 0))
        if time.monotonic() < until and (remembered.mtu or 0) >= vif.mtu \
                and netns.link_name(remembered.index, self.host_netns) == vif.bridge:
            return remembered
        link = self._ensure_bridge(host, vif.bridge)
        # Plain values: pyroute2 decodes a message's attributes when first read,
        # which threads sharing one message could see half done.
        bridge = _Bridge(link['index'], link.get('mtu'))
        self._bridges[vif.bridge] = (bridge, time.monotonic() + BRIDGE_TRUSTED_FOR)
        return bridge

    def _ensure_bridge(self, host, name):
        """Return the link message of the existing bridge ``name``.

        The daemon creates no shared bridge (see security.rst): one nobody
        made is one nobody connected to a network. A bridge carrying an
        owner tag, or named ``qbr…``, is a hybrid-plugged port's private
        bridge, never shared (the policy refuses such a VIF first; this holds
        for a caller that skipped it).
        """
        if name.startswith(policy.HYBRID_BRIDGE_PREFIX):
            raise errors.VIFNotAllowed('bridge %s is a hybrid-plugged port\'s private bridge'
                                       % name, 'no bridge VIF may join it')
        with netns.kernel_errors('look up bridge %s' % name):
            link = podside.get_link(host, name)
        if link is None:
            raise errors.BindingFailed('bridge %s does not exist' % name,
                                       'the daemon creates no bridge: create it and '
                                       'connect it to the network first')
        kind = link.get(('linkinfo', 'kind'))
        if kind != 'bridge':
            raise errors.BindingFailed('device %s exists and is not a bridge' % name,
                                       'kind %s' % kind)
        if owner_tag.parse_alias(link.get('ifalias')):
            raise errors.BindingFailed('bridge %s is the private bridge of a hybrid-plugged '
                                       'port' % name, 'owner %s' % link.get('ifalias'))
        return link

    def _create_veth(self, channel, host, pod_fd, host_name, owner, bridge_index, vif, plug):
        """Create the pair, both ends down, in one request; return it, answered and echoed.

        ``bridge_index`` None leaves the host end without a master.
        """
        action = ('create veth %s (into bridge %s) and %s in %s'
                  % (host_name, vif.bridge, plug.ifname, plug.netns))
        for attempt in (1, 2):
            request, = channel.send([rtnl.new_veth(host_name, vif.mtu, bridge_index, plug.ifname,
                                                   pod_fd, vif.mac, action)])
            if getattr(request.error, 'code', None) != errno.EEXIST or attempt == 2:
                break
            LOG.info('Replacing what %s left of %s in %s', owner, plug.ifname, plug.netns)
            with netns.iproute(pod_fd) as pod:
                self._remove_leftovers(host, pod, host_name, owner, plug)
        netns.check_answers([request])
        return request

    def _finish_host_end(self, channel, index, host_name, owner):
        """Tag the host end with its owner, without IPv6 addresses, and bring it up.

        One request: the kernel turns address generation off after bringing
        the link up, which is in time only because the pod end is still down
        (no carrier, so no link-local address yet). A kernel without IPv6
        refuses it; then only tag and state are set.
        """
        action = 'tag and bring up %s' % host_name
        requests = channel.send([rtnl.set_link(index, action, up=True, alias=owner,
                                               no_ipv6=True)])
        if rtnl.is_unsupported_family(requests[0].error):
            requests = channel.send([rtnl.set_link(index, action, up=True, alias=owner)])
        netns.check_answers(requests)

    def _indexes(self, created, host_name, plug, pod_fd):
        """(host index, pod index) of the new pair, from the echoed creation."""
        indexes = rtnl.created_link(created, host_name)
        if indexes is not None:
            return indexes
        try:        # a kernel that does not echo a link's creation
            return (netns.link_index(host_name, self.host_netns),
                    netns.link_index(plug.ifname, pod_fd))
        except OSError:
            raise errors.BindingFailed('veth %s vanished while being set up'
                                       % host_name) from None

    def _remove_leftovers(self, host, pod, host_name, owner, plug):
        """Remove what this plug left (a retried ADD); refuse to touch anyone else's."""
        if self._delete_host_end(host, host_name, owner) == FOREIGN:
            raise errors.BindingFailed(
                'host device %s exists and belongs to another owner' % host_name,
                'expected alias %s' % owner)
        if podside.delete_owned(pod, plug) == FOREIGN:
            raise errors.BindingFailed(
                '%s exists in %s and belongs to another owner' % (plug.ifname, plug.netns),
                'expected alias %s' % owner)

    def _undo(self, host, host_name):
        """Delete a half-made device (a pair: both ends go); never raises."""
        try:
            host.link('del', ifname=host_name)
        except Exception:   # the original error matters more
            LOG.exception('Could not remove half-made device %s', host_name)

    # -- disconnect steps --------------------------------------------------

    def _delete_host_end(self, host, host_name, owner):
        # Untagged, it is still ours: its name is derived from its owner.
        return podside.delete_owned_link(host, host_name, owner, 'on the host',
                                         untagged_ours=True)

    # -- check steps -------------------------------------------------------

    def _check_host_end(self, host, host_name, vif, plug):
        link = podside.get_link(host, host_name)
        if link is None:
            return ['host device %s is missing' % host_name]
        problems = []
        owner = owner_tag.alias(plug.container_id, plug.ifname)
        if link.get('ifalias') != owner:
            problems.append('host device %s has alias %r, not %r'
                            % (host_name, link.get('ifalias'), owner))
        problems += self._check_enslaved(host, link, vif, plug)
        if link.get('mtu') != vif.mtu:
            problems.append('host device %s has MTU %s, not %d'
                            % (host_name, link.get('mtu'), vif.mtu))
        if not link['flags'] & IFF_UP:
            problems.append('host device %s is down' % host_name)
        return problems

    def _check_enslaved(self, host, link, vif, plug):
        bridge = podside.get_link(host, vif.bridge)
        if bridge is None:
            return ['bridge %s is missing' % vif.bridge]
        if link.get('master') != bridge['index']:
            return ['host device %s is not enslaved to bridge %s'
                    % (link.get('ifname'), vif.bridge)]
        return []
