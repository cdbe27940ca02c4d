"""MACVLAN binding: a bridge-mode MACVLAN of the VM's trunk interface, inside the pod.

Nested pods whose port is an allowed address pair of the VM's port: the
pod's interface is a MACVLAN sub-interface of ``vif.parent`` (or ``[binding]
link_iface``) in mode ``bridge``, so pods on one VM reach each other
directly. The flow, its costs and its ownership are those of
:mod:`kuryr_cni.binding.nested`.
"""

from kuryr_cni.binding import nested

MODE = 'bridge'


class MacvlanDriver(nested.NestedDriver):
    """Connects ``macvlan`` VIFs."""

    kind = 'macvlan'

    def link_attributes(self, vif):
        return {'macvlan_mode': MODE}

    def check_link(self, link, vif):
        mode = link.get(('linkinfo', 'data', 'macvlan_mode'))
        if mode != MODE:
            return ['%s is in MACVLAN mode %s, not %s' % (link.get('ifname'), mode, MODE)]
        return []
