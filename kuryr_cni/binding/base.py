"""The one small base every binding driver implements.

A driver turns one VIF (:class:`kuryr_cni.vif.VIF`) into one interface of
one sandbox (:class:`Plug`) and back: :meth:`Driver.connect`,
:meth:`Driver.disconnect`, :meth:`Driver.check`. Drivers hold no state
between calls except their configuration and what they may look up again
(a bridge, an OVSDB connection), so one instance serves every thread of a
worker. They reach namespaces only through
:mod:`kuryr_cni.netns`, and they judge ownership of host-side devices only by
the owner tag (:mod:`kuryr_cni.binding.owner_tag`), never by pod name.
Drivers know nothing of pods, registries or the CNI protocol.

Failure behaviour, common to every driver:

- A request the kernel refuses becomes :class:`errors.BindingFailed` (code
  101) whose ``details`` hold the netlink error (number, text and the
  kernel's extended-ack message when it sent one): see
  :func:`kuryr_cni.netns.kernel_errors`.
- A netlink request left unanswered raises
  :class:`kuryr_cni.netns.NetlinkTimeout` (code 11, try again later).
- A pod namespace path that is not a network namespace, or is the host's,
  raises :class:`errors.InvalidEnvironment` (code 4) before any netlink
  request is sent.
"""

import abc
import dataclasses

from kuryr_cni import errors


@dataclasses.dataclass(frozen=True)
class Options:
    """What drivers take from the ``[binding]`` options (:mod:`kuryr_cni.conf`).

    Built once per process from the parsed configuration (:meth:`from_conf`)
    and handed to :func:`kuryr_cni.binding.get_driver`; the defaults are the
    options' own, so tests and tools can build one without a configuration.
    """

    ovsdb_connection: str = 'unix:/run/openvswitch/db.sock'
    link_iface: str | None = None   # parent of vlan/macvlan VIFs that name none
    ipv6_link_local: str = 'with-ipv6'  # or 'always' (see the option's help)
    ovsdb_timeout: float = 10.0     # seconds for one OVSDB transaction, connect included
    bridges: tuple = ('kuryr-br0', 'br-int', 'qbr*')   # names or patterns a VIF may name
    parents: tuple = ()             # vlan/macvlan parents a VIF may name besides link_iface
    network_device_mtu: int = 0     # the largest MTU a pod interface gets; 0: the VIF's

    @classmethod
    def from_conf(cls, conf):
        return cls(ovsdb_connection=conf.binding.ovsdb_connection,
                   link_iface=conf.binding.link_iface,
                   ipv6_link_local=conf.binding.ipv6_link_local,
                   bridges=tuple(conf.binding.bridges),
                   parents=tuple(conf.binding.parents),
                   network_device_mtu=conf.binding.network_device_mtu)


@dataclasses.dataclass(frozen=True)
class Plug:
    """One interface of one sandbox: where it goes and who owns it."""

    container_id: str
    netns: str              # path of the pod's network namespace
    ifname: str             # name inside the pod
    default_route: bool     # put the VIF's default gateway route here
    mac: str | None = None  # the VIF's MAC: recognises an interface made before its alias
    # records.Adopted: the devices another daemon made, which this plug took over
    # (kuryr_cni.binding.foreign removes them), instead of the driver's own.
    adopted: object = None


class Driver(abc.ABC):
    """Connects VIFs of one ``kind`` to sandboxes.

    ``host_netns`` is the namespace holding the host side (bridges, host
    ends of veth pairs): None means the daemon's own; tests pass a throwaway
    namespace instead.
    """

    kind = None
    host_side = False   # whether it makes host-side devices tagged with their owner
    installed_signal = False    # whether it has wait_installed (a local readiness signal)

    def __init__(self, host_netns=None, options=None):
        self.host_netns = host_netns
        self.options = options or Options()

    def __repr__(self):
        return '<%s host_netns=%s>' % (type(self).__name__, self.host_netns or 'own')

    @abc.abstractmethod
    def connect(self, vif, plug):
        """Create and configure the plug's interface from ``vif``.

        Idempotent for the same plug: whatever this plug (same container ID
        and ifname) left before, complete or half made, is replaced, so a
        retried ADD converges on one working interface. Devices owned by
        anyone else are never touched. When a step fails, everything this
        call created is removed before the error is raised (shared
        infrastructure such as a bridge it had to create stays).
        """

    @abc.abstractmethod
    def disconnect(self, plug):
        """Remove this plug's devices.

        Host-side devices are found by their owner tag and removed only when
        the tag names this plug; the pod side is removed inside the plug's
        namespace. A namespace or device that is already gone is not an
        error, so repeating the call succeeds. Raises only when the kernel
        refuses a removal (BindingFailed) or the namespace path is invalid.
        """

    @abc.abstractmethod
    def check(self, vif, plug):
        """Raise :class:`errors.CheckFailed` listing how the plug differs from ``vif``.

        Returns None when everything the driver configured is still in place.
        Changes nothing.
        """

    def wait_installed(self, plug, timeout, on_connect=None):
        """Return once the node's networking agent says the plug's port works.

        Only drivers whose ``installed_signal`` is true have such a signal
        (see :meth:`kuryr_cni.binding.ovs.OvsDriver.wait_installed`);
        ``on_connect`` receives the socket the wait reads, so another thread
        may end it (``shutdown``). Raises code 11 errors when the signal does
        not come within ``timeout`` seconds.
        """
        raise NotImplementedError('%s has no local readiness signal' % self.kind)

    def remove_host_side(self, container_id, ifname):
        """Remove host-side devices of (``container_id``, ``ifname``) no record describes.

        Called when no record says which driver plugged the interface (a DEL
        for an unknown sandbox, start-up reconciliation), so only what
        carries this owner's tag is touched, and a service the driver uses
        being absent is not an error. The default is :meth:`disconnect` of
        a plug without namespace.
        """
        self.disconnect(Plug(container_id, '', ifname, False))


def check_mtu(vif, parent_mtu, parent):
    """Refuse a VIF whose MTU exceeds its parent's (``parent`` names it in the message).

    Frames the parent cannot carry would be dropped silently, so this is a
    configuration error (:class:`errors.InvalidVIF`), raised before anything
    is created.
    """
    if parent_mtu is not None and vif.mtu > parent_mtu:
        raise errors.InvalidVIF('VIF MTU %d is larger than the MTU %d of %s'
                                % (vif.mtu, parent_mtu, parent))
