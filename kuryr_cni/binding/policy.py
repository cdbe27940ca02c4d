"""The operator's binding policy: which bridges and parent interfaces a VIF may name.

Whoever writes a pod's VIFs (the pod's editors under the annotation source,
kuryr-controller under the KuryrPort source) chooses where on the node its
interface is plugged; ``[binding] bridges`` and ``parents`` bound that choice
(doc/source/security.rst). :func:`refuse_unlisted` is asked before an ADD claims or
plugs anything, so a refused VIF changes nothing. Names are matched as shell
patterns (:func:`fnmatch.fnmatchcase`, case-sensitive as interface names
are). Pure: no I/O.
"""

import fnmatch

from kuryr_cni import errors
from kuryr_cni import vif as vif_model

# A hybrid-plugged port's private firewall bridge (os-vif's and Neutron's name):
# only that port's ovs-hybrid VIF may name one, whatever [binding] bridges says.
HYBRID_BRIDGE_PREFIX = 'qbr'


def refuse_unlisted(vif, options):
    """Raise :class:`errors.VIFNotAllowed` when ``vif`` names a bridge or parent
    ``options`` (:class:`kuryr_cni.binding.Options`) does not allow.

    Every bridge a VIF names must match ``options.bridges`` (an ovs-hybrid
    VIF names two: its port's qbr bridge and the integration bridge). A
    nested VIF that names its parent must name ``options.link_iface`` or
    match ``options.parents``; one that names none gets the default parent,
    which the operator chose (or which is found as upstream finds it).
    A ``bridge`` VIF never names a ``qbr…`` bridge: that is a hybrid-plugged
    port's own bridge (kuryr-daemon's or a Nova instance's, untagged), and a
    pod joining it would sit behind that port's security groups, outside its own.
    """
    if vif.kind == 'bridge' and vif.bridge.startswith(HYBRID_BRIDGE_PREFIX):
        raise errors.VIFNotAllowed(
            'VIF of port %s names bridge %s: a %s... bridge is a hybrid-plugged port\'s '
            'private bridge, which no bridge VIF may join'
            % (vif.port_id, vif.bridge, HYBRID_BRIDGE_PREFIX),
            'only an ovs-hybrid VIF of that port uses it')
    for name in vif.bridges:
        if not matches(name, options.bridges):
            raise errors.VIFNotAllowed(
                'VIF of port %s names bridge %s, which is not in [binding] bridges'
                % (vif.port_id, name), 'allowed: %s' % (', '.join(options.bridges) or 'none'))
    if vif.kind in vif_model.NESTED_KINDS and vif.parent is not None:
        allowed = ((options.link_iface,) if options.link_iface else ()) + tuple(options.parents)
        if not matches(vif.parent, allowed):
            raise errors.VIFNotAllowed(
                'VIF of port %s names parent %s, which is neither [binding] link_iface '
                'nor in [binding] parents' % (vif.port_id, vif.parent),
                'allowed: %s' % (', '.join(allowed) or 'none'))


def matches(name, patterns):
    """Whether interface ``name`` matches one of ``patterns`` (names or shell patterns)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
