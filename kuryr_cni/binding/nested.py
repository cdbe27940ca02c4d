"""Nested pods: a sub-interface of the VM's trunk port, made inside the pod.

The flow shared by the ``macvlan`` and ``vlan`` drivers (each adds only its
link kind and the attributes of that kind)::

    host namespace                   pod namespace
    [parent]  <-  lower device of -- <plug.ifname>  MAC, MTU, IPs, routes
    (vif.parent, [binding] link_iface               alias kuryr-cni:<container>:<ifname>
     or found as upstream finds it: default_parent.py)

The sub-interface is created by one netlink request sent in the host
namespace (where ``IFLA_LINK`` names the parent) with ``IFLA_NET_NS_FD``
naming the pod namespace, so the kernel creates it there, under its final
name. The alternative -- create it under a temporary name in the host
namespace, then move and rename it -- was measured here (kernel 6.18,
median of 30 MACVLAN creations): 1.1 ms direct against 16 ms with the move
(``dev_change_net_namespace`` waits for RCU grace periods), and the kernel
accepts the direct creation for both kinds. So there is no host-side device
at all: the owner tag (``IFLA_IFALIAS``) is set on the pod-side device, and
evicting an older sandbox means deleting its device inside that sandbox's
namespace (recorded in the pod binding), only if the alias names it. The
kernel enforces what makes eviction necessary: a VLAN ID is unique per
parent (a second one is refused with EEXIST), and a MACVLAN with an address
already up on the parent cannot come up (EADDRINUSE).

Per connect: parent lookup, creation, alias; then the pod-side steps of
:func:`kuryr_cni.binding.podside.configure`.
"""

import errno

from oslo_log import log as logging
from pyroute2.netlink.exceptions import NetlinkError

from kuryr_cni import errors
from kuryr_cni import netns
from kuryr_cni.binding import base
from kuryr_cni.binding import owner_tag
from kuryr_cni.binding import default_parent
from kuryr_cni.binding import podside

LOG = logging.getLogger(__name__)


class NestedDriver(base.Driver):
    """Connects VIFs as sub-interfaces of a parent (trunk) interface.

    Subclasses set ``kind`` (the VIF kind, also the kernel link kind) and
    implement :meth:`link_attributes` and :meth:`check_link`.
    """

    host_side = False

    def link_attributes(self, vif):
        """Extra attributes of the creation request (pyroute2 keywords)."""
        raise NotImplementedError

    def check_link(self, link, vif):
        """Problems of the kind-specific attributes of ``link`` (a list)."""
        raise NotImplementedError

    def taken(self, vif, parent):
        """The error for a creation refused with EEXIST by something not this plug's."""
        return errors.BindingFailed(
            'cannot create the %s interface on %s: the kernel says it exists' % (self.kind, parent))

    # -- the three operations ------------------------------------------------

    def connect(self, vif, plug):
        """Create the sub-interface inside the pod namespace, tag it, configure it.

        A device this plug left before (a retried ADD: same name, our alias,
        or no alias and our MAC) is removed and the creation retried once;
        anything else in the way makes the call fail untouched. Any failure
        after creation deletes the new interface before raising.
        """
        with netns.open_netns(plug.netns, host=self.host_netns) as pod_fd, \
                netns.iproute(self.host_netns) as host, \
                netns.iproute(pod_fd) as pod:
            parent_name = self.parent_of(vif, host)
            parent = self._parent_link(host, parent_name)
            base.check_mtu(vif, parent.get('mtu'), 'parent %s' % parent_name)
            self._create(host, pod, pod_fd, parent, vif, plug)
            try:
                with netns.kernel_errors('look up %s in %s' % (plug.ifname, plug.netns)):
                    link = podside.get_link(pod, plug.ifname)
                if link is None:
                    raise errors.BindingFailed('%s vanished from %s while being set up'
                                               % (plug.ifname, plug.netns))
                with netns.channel(pod_fd) as channel:
                    podside.configure(channel, link['index'], vif, plug,
                                      self.options.ipv6_link_local)
            except BaseException:
                self._undo(pod, plug)
                raise

    def disconnect(self, plug):
        """Delete the plug's interface in its namespace if the alias names this plug.

        There is nothing on the host side; a namespace already gone took the
        interface with it, and an empty ``plug.netns`` (a runtime's second
        DEL) leaves nothing to do.
        """
        if not plug.netns:
            return
        try:
            with netns.open_netns(plug.netns, host=self.host_netns) as pod_fd, \
                    netns.iproute(pod_fd) as pod:
                outcome = podside.delete_owned(pod, plug)
        except netns.NamespaceNotFound:
            return
        if outcome == podside.FOREIGN:
            LOG.warning('Not deleting %s in %s: it is not tagged for sandbox %s',
                        plug.ifname, plug.netns, plug.container_id)

    def check(self, vif, plug):
        """Compare the pod interface: kind, parent, owner, kind attributes, MAC, IPs, routes."""
        owner = owner_tag.alias(plug.container_id, plug.ifname)
        problems = []
        with netns.open_netns(plug.netns, host=self.host_netns) as pod_fd, \
                netns.iproute(self.host_netns) as host, \
                netns.iproute(pod_fd) as pod, \
                netns.kernel_errors('inspect %s of container %s'
                                    % (plug.ifname, plug.container_id)):
            parent_name = self.parent_of(vif, host)
            parent = podside.get_link(host, parent_name)
            link = podside.get_link(pod, plug.ifname)
            if parent is None:
                problems.append('parent %s is missing' % parent_name)
            if link is not None:
                kind = link.get(('linkinfo', 'kind'))
                if kind != self.kind:
                    problems.append('%s is a %s interface, not %s' % (plug.ifname, kind, self.kind))
                if link.get('ifalias') != owner:
                    problems.append('%s has alias %r, not %r'
                                    % (plug.ifname, link.get('ifalias'), owner))
                if parent is not None and link.get('link') != parent['index']:
                    problems.append('%s is not on parent %s' % (plug.ifname, parent_name))
                problems += self.check_link(link, vif)
            problems += podside.check(pod, vif, plug)
        if problems:
            raise errors.CheckFailed(
                'interface %s of container %s differs from its VIF'
                % (plug.ifname, plug.container_id), '; '.join(problems))

    # -- steps ------------------------------------------------------------------

    def parent_of(self, vif, host):
        """The parent interface's name: the VIF's, else ``[binding] link_iface``, else
        the one upstream would find (:mod:`kuryr_cni.binding.default_parent`)."""
        return vif.parent or self.options.link_iface or default_parent.find(host, self.host_netns)

    def _parent_link(self, host, name):
        with netns.kernel_errors('look up parent interface %s' % name):
            link = podside.get_link(host, name)
        if link is None:
            raise errors.BindingFailed('parent interface %s does not exist' % name)
        return link

    def _create(self, host, pod, pod_fd, parent, vif, plug):
        parent_name = parent.get('ifname')
        action = ('create %s %s on %s in %s'
                  % (self.kind, plug.ifname, parent_name, plug.netns))
        with netns.kernel_errors(action):
            for attempt in (1, 2):
                try:
                    host.link('add', ifname=plug.ifname, kind=self.kind, link=parent['index'],
                              net_ns_fd=pod_fd, address=vif.mac, mtu=vif.mtu,
                              **self.link_attributes(vif))
                    return
                except NetlinkError as exc:
                    if exc.code != errno.EEXIST or attempt == 2:
                        raise
                owner = owner_tag.alias(plug.container_id, plug.ifname)
                outcome = podside.delete_owned(pod, plug)
                if outcome == podside.FOREIGN:
                    raise errors.BindingFailed('%s exists in %s and belongs to another owner'
                                               % (plug.ifname, plug.netns),
                                               'expected alias %s' % owner)
                if outcome == podside.ABSENT:
                    raise self.taken(vif, parent_name)
                LOG.info('Replaced what %s left of %s in %s', owner, plug.ifname, plug.netns)

    def _undo(self, pod, plug):
        """Delete the half-made interface of this plug; never raises."""
        try:
            podside.delete_owned(pod, plug)
        except Exception:   # the original error matters more
            LOG.exception('Could not remove half-made %s in %s', plug.ifname, plug.netns)
