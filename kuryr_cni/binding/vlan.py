"""VLAN binding: an 802.1Q sub-interface of the VM's trunk interface, inside the pod.

Nested pods whose port is a subport of the VM's trunk: the pod's interface
is the VLAN ``vif.vlan_id`` of ``vif.parent`` (or ``[binding] link_iface``),
with the subport's MAC. The flow, its costs and its ownership are those of
:mod:`kuryr_cni.binding.nested`.

A VLAN ID is unique per parent in the kernel, wherever the sub-interface
lives, so an interface left by an older sandbox of the same pod blocks the
new one until it is gone. The ownership rules evict it before plugging (the
older sandbox's namespace is in the pod binding, and its interface is
deleted there only when its alias names that sandbox); a conflict that is
still there, which no record explains, fails the ADD with the VLAN named,
rather than deleting a device this daemon cannot prove is stale.
"""

from kuryr_cni import errors
from kuryr_cni.binding import nested


class VlanDriver(nested.NestedDriver):
    """Connects ``vlan`` VIFs."""

    kind = 'vlan'

    def link_attributes(self, vif):
        return {'vlan_id': vif.vlan_id}

    def check_link(self, link, vif):
        vlan_id = link.get(('linkinfo', 'data', 'vlan_id'))
        if vlan_id != vif.vlan_id:
            return ['%s has VLAN ID %s, not %d' % (link.get('ifname'), vlan_id, vif.vlan_id)]
        return []

    def taken(self, vif, parent):
        return errors.BindingFailed(
            'VLAN %d on %s is held by an interface that is not this sandbox\'s'
            % (vif.vlan_id, parent),
            'no record names its owner; it is left alone (the ADD succeeds once it is gone)')
