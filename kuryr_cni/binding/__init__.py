"""Binding drivers: how a VIF of each ``kind`` is plugged into a sandbox.

Public face: :func:`get_driver`, :class:`Plug`, :class:`Driver`,
:class:`Options` (the ``[binding]`` configuration drivers need, passed
explicitly: nothing is read from a global configuration). One driver
per module behind :class:`kuryr_cni.binding.base.Driver`; the registry below
maps a VIF's ``kind`` to its driver class. Drivers sit above
:mod:`kuryr_cni.netns` and below the daemon's services: they never import the
registry, the watcher or the CNI layer.
"""

from kuryr_cni import errors
from kuryr_cni import netns
from kuryr_cni.binding import bridge
from kuryr_cni.binding import hybrid
from kuryr_cni.binding import macvlan
from kuryr_cni.binding import noop
from kuryr_cni.binding import ovs
from kuryr_cni.binding import vlan
from kuryr_cni.binding.base import Driver
from kuryr_cni.binding.base import Options
from kuryr_cni.binding.base import Plug
from kuryr_cni.binding import owner_tag

__all__ = ['DRIVERS', 'Driver', 'Options', 'Plug', 'get_driver', 'remove_tagged_host_device',
           'tagged_host_devices']

# kind -> driver class.
DRIVERS = {
    bridge.BridgeDriver.kind: bridge.BridgeDriver,
    ovs.OvsDriver.kind: ovs.OvsDriver,
    hybrid.HybridDriver.kind: hybrid.HybridDriver,
    vlan.VlanDriver.kind: vlan.VlanDriver,
    macvlan.MacvlanDriver.kind: macvlan.MacvlanDriver,
    noop.NoopDriver.kind: noop.NoopDriver,
}

_instances = {}     # (kind, host_netns, options) -> driver; stateless, shared by threads


def get_driver(kind, host_netns=None, options=None):
    """Return the driver for VIFs of ``kind`` (one shared instance per kind,
    host namespace and options).

    ``host_netns`` is the namespace path holding the host side; None means the
    daemon's own. ``options`` is an :class:`Options` (None: the defaults).
    Raises :class:`errors.InvalidVIF` for a kind no driver handles.
    """
    options = options or Options()
    key = (kind, host_netns, options)
    driver = _instances.get(key)
    if driver is None:
        try:
            cls = DRIVERS[kind]
        except (KeyError, TypeError):
            raise errors.InvalidVIF('no binding driver for VIF kind %r (known: %s)'
                                    % (kind, ', '.join(sorted(DRIVERS)))) from None
        # setdefault is atomic: racing threads may both build one, all get the same.
        driver = _instances.setdefault(key, cls(host_netns=host_netns, options=options))
    return driver


def tagged_host_devices(host_netns=None):
    """``(container_id, pod_ifname)`` of every host device carrying our owner tag."""
    with netns.iproute(host_netns) as ipr:
        return [(d.container_id, d.pod_ifname) for d in owner_tag.find_host_devices(ipr)]


def remove_tagged_host_device(container_id, ifname, host_netns=None, options=None):
    """Remove the host-side device owned by (``container_id``, ``ifname``), if any.

    Used when no record says which driver made it (a DEL for an unknown
    sandbox, start-up reconciliation): every driver with host-side devices
    removes its own (:meth:`Driver.remove_host_side`), and only what carries
    this owner's tag.
    """
    for kind, cls in DRIVERS.items():
        if cls.host_side:
            get_driver(kind, host_netns, options).remove_host_side(container_id, ifname)
