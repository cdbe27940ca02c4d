"""Everything the ownership rules ask of the kernel, as one small port.

:class:`kuryr_cni.ownership.Ownership` decides which sandbox may touch what;
this is how its decisions reach the kernel, and nothing else. The daemon uses
:class:`Kernel`, which hands each call to :mod:`kuryr_cni.netns`,
:mod:`kuryr_cni.podview` and the binding drivers (:mod:`kuryr_cni.binding`).
Unit tests hand the rules a recording stand-in with the same methods, so the
whole rule matrix runs without root.

Failure behaviour is the drivers' (see :mod:`kuryr_cni.binding.base`):
:class:`errors.InvalidEnvironment` for a path that is no pod namespace,
:class:`errors.BindingFailed` for a kernel refusal, code 11 for a netlink
request left unanswered.
"""

import dataclasses
import os

from kuryr_cni import binding as drivers
from kuryr_cni import errors
from kuryr_cni import netns
from kuryr_cni import podview
from kuryr_cni.binding import foreign
from kuryr_cni.binding import owner_tag
from kuryr_cni.binding import podside
from kuryr_cni.binding import policy


class Kernel:
    """The real port: host devices in ``host_netns`` (None: the daemon's own)."""

    def __init__(self, host_netns=None, binding_options=None):
        self.host_netns = host_netns
        self.binding_options = binding_options      # kuryr_cni.binding.Options; None: defaults

    # Pod namespaces ----------------------------------------------------------

    def check_netns(self, path):
        """Raise InvalidEnvironment unless ``path`` is a pod's network namespace."""
        netns.check_netns(path, host=self.host_netns)

    def netns_exists(self, path):
        """Whether ``path`` still names a network namespace (a DEL may come after it went)."""
        return netns.exists(path)

    def netns_vanished(self, path):
        """Whether ``path`` is gone from a directory still there: a missing directory
        proves nothing (a mount this process does not see)."""
        return not netns.exists(path) and os.path.isdir(os.path.dirname(path))

    def link_names(self, path):
        """The interface names in the pod namespace ``path``."""
        return netns.link_names(path, host=self.host_netns)

    def link_owner(self, path, ifname):
        """``(container_id, ifname)`` of the owner tag of ``ifname`` in ``path``, else None."""
        with netns.open_netns(path, host=self.host_netns) as fd, netns.iproute(fd) as ipr:
            link = podside.get_link(ipr, ifname)
        return owner_tag.parse_alias(link.get('ifalias')) if link else None

    def observe(self, path):
        """What CHECK compares with prevResult: see :func:`kuryr_cni.podview.observe`."""
        return podview.observe(path, host=self.host_netns)

    # Plugging, through the driver of the VIF's kind --------------------------------

    def admit(self, vif):
        """Raise VIFNotAllowed when the node's binding policy refuses ``vif``.

        Asked before anything is claimed or plugged (:mod:`kuryr_cni.binding.policy`);
        touches nothing.
        """
        policy.refuse_unlisted(vif, self.binding_options or drivers.Options())

    def connect(self, vif, plug):
        self._driver(vif.kind).connect(self._sized(vif), plug)

    def disconnect(self, kind, plug):
        if plug.adopted is not None:
            self._foreign().release(plug.adopted, plug)
        else:
            self._driver(kind).disconnect(plug)

    def check(self, vif, plug):
        if plug.adopted is not None:
            self._foreign().check(vif, plug)
        else:
            self._driver(vif.kind).check(self._sized(vif), plug)

    # Devices another CNI daemon made (kuryr_cni.binding.foreign) ---------------------

    def find_foreign(self, vif, netns_paths=(), views=None):
        """Findings of kuryr-daemon's devices for ``vif``, the pod end looked for in
        ``netns_paths`` (those no longer there are skipped) or in ``views``, what
        :meth:`link_views` read of them."""
        if views is None:
            views = self.link_views(netns_paths)
        return self._foreign().probe(vif, views)

    def link_views(self, netns_paths):
        """``{path: links}`` of each namespace still there, one netlink dump each."""
        views = {}
        for path in netns_paths:
            try:
                views[path] = foreign.dump(path, host=self.host_netns)
            except errors.InvalidEnvironment:
                continue        # gone meanwhile, or no namespace
        return views

    def foreign_iface_ids(self):
        """The ``iface-id`` of every OVS row we did not tag; None when OVSDB cannot
        be reached (a node without Open vSwitch, or it is down)."""
        try:
            return self._foreign().foreign_iface_ids()
        except (errors.TryAgainLater, errors.InvalidConfig):
            return None

    def tag_foreign(self, finding, container_id, ifname):
        self._foreign().tag(finding, container_id, ifname)

    def discard_foreign(self, finding):
        self._foreign().discard(finding)

    def _foreign(self):
        return foreign.Finder(self.host_netns, self.binding_options)

    def _sized(self, vif):
        """``vif`` with its MTU lowered to ``[binding] network_device_mtu``, when set and lower."""
        largest = (self.binding_options or drivers.Options()).network_device_mtu
        return dataclasses.replace(vif, mtu=largest) if largest and vif.mtu > largest else vif

    def has_installed_signal(self, vif):
        """Whether ``vif``'s driver can tell when the agent has installed its port."""
        return self._driver(vif.kind).installed_signal

    def wait_installed(self, vif, plug, timeout, on_connect=None):
        """See :meth:`kuryr_cni.binding.base.Driver.wait_installed`."""
        self._driver(vif.kind).wait_installed(plug, timeout, on_connect)

    # Host devices known by their owner tag alone ------------------------------------

    def tagged_host_devices(self):
        """``(container_id, pod_ifname)`` of every host device carrying our owner tag."""
        return drivers.tagged_host_devices(self.host_netns)

    def remove_tagged(self, container_id, ifname):
        """Remove the host devices tagged (``container_id``, ``ifname``), if any."""
        drivers.remove_tagged_host_device(container_id, ifname, self.host_netns,
                                          self.binding_options)

    def _driver(self, kind):
        return drivers.get_driver(kind, self.host_netns, self.binding_options)
