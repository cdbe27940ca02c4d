"""Strict reader of the os-vif primitives kuryr-controller stores in KuryrPorts.

kuryr-controller writes each pod's VIFs into its KuryrPort as
``status.vifs = {ifname: {"default": bool, "vif": <primitive>}}``, where the
primitive is ``VersionedObject.obj_to_primitive()`` of an os-vif object::

    {"versioned_object.name": "VIFVlanNested",
     "versioned_object.namespace": "os_vif",
     "versioned_object.version": "1.0",
     "versioned_object.data": {"id": ..., "address": ..., "active": ...,
                               "network": {<Network primitive>}, "vlan_id": ...}}

(``nova_object.`` is the same shape with the other serial prefix.) This
module reads exactly what plugging needs from them, without os-vif or
oslo.versionedobjects, and hands the result to :func:`kuryr_cni.vif.parse_vif`
so a KuryrPort VIF passes the same validation as an annotation VIF. No I/O.

Mapping: ``VIFBridge`` -> ``bridge`` and ``VIFOpenVSwitch`` -> ``ovs`` (into
``bridge_name``; the OVS ``iface-id`` is the port profile's
``interface_id``, else the VIF ``id``); a ``VIFBridge`` of plugin ``ovs``
(ML2/OVS with the iptables_hybrid firewall) -> ``ovs-hybrid``, its
``bridge_name`` the port's ``qbr…`` and its integration bridge the
network's ``bridge``; ``VIFVlanNested`` -> ``vlan``
(``vlan_id``), ``VIFMacvlanNested`` -> ``macvlan``; the parent of nested
kinds is ``[binding] link_iface``. Addresses are the fixed IPs of every
subnet with the subnet's prefix length, gateways the subnets' (one per IP
family), host routes the subnets' routes, the MTU the network's (1500 when
it has none), ``active`` the VIF's (os-vif's default, true, when absent).

Strict: every object must carry exactly the primitive keys, namespace
``os_vif`` and a version of major 1 (minor versions add fields and are
accepted: the port profile's 1.3 and 1.4 among them); an unknown VIF class,
a missing field or a value of the wrong type raises :class:`errors.InvalidVIF`
naming where it was found. Fields plugging does not use are ignored.
"""

import ipaddress
import re

from kuryr_cni import errors
from kuryr_cni import vif as vif_model

PREFIXES = ('versioned_object', 'nova_object')
NAMESPACE = 'os_vif'
KINDS = {'VIFBridge': 'bridge', 'VIFOpenVSwitch': 'ovs', 'VIFVlanNested': 'vlan',
         'VIFMacvlanNested': 'macvlan'}
PORT_PROFILES = ('VIFPortProfileOpenVSwitch', 'VIFPortProfileFPOpenVSwitch',
                 'VIFPortProfileOVSRepresentor', 'VIFPortProfileFPBridge',
                 'VIFPortProfileK8sDPDK', 'VIFPortProfileBase')
DEFAULT_MTU = 1500
# VIF classes kuryr-daemon 10.0.0 plugged that kuryr-cni refuses: the pods of
# such ports must stay on a node that runs kuryr-daemon (doc/source/migration.rst).
KURYR_DAEMON_ONLY = {
    'VIFVHostUser': 'a vhost-user socket for an OVS-DPDK bridge',
    'VIFDPDKNested': 'a nested port bound to a DPDK driver inside the pod',
}
_VERSION = re.compile(r'^(\d+)\.(\d+)\Z')


def parse_status_vifs(status_vifs):
    """``{ifname: VIF}`` from a KuryrPort's ``status.vifs``; raises InvalidVIF.

    An empty or absent mapping is no VIF yet (kuryr-controller has not
    filled it in), returned as ``{}``.
    """
    if status_vifs is None:
        return {}
    if not isinstance(status_vifs, dict):
        raise errors.InvalidVIF('status.vifs must be an object, not %s'
                                % type(status_vifs).__name__)
    if len(status_vifs) > vif_model.MAX_INTERFACES:
        raise errors.InvalidVIF('status.vifs has more than %d interfaces'
                                % vif_model.MAX_INTERFACES)
    vifs = {}
    for ifname, entry in status_vifs.items():
        if not vif_model.valid_ifname(ifname):
            raise errors.InvalidVIF('invalid interface name %r in status.vifs' % (ifname,))
        try:
            vifs[ifname] = parse_entry(entry)
        except errors.InvalidVIF as exc:
            raise errors.InvalidVIF('status.vifs.%s: %s' % (ifname, exc.msg),
                                    exc.details) from None
    defaults = [name for name, vif in vifs.items() if vif.default]
    if len(defaults) > 1:
        raise errors.InvalidVIF('more than one VIF is marked default: %s'
                                % ', '.join(sorted(defaults)))
    return vifs


def parse_entry(entry):
    """One ``{"default": bool, "vif": <primitive>}`` entry -> VIF."""
    if not isinstance(entry, dict) or set(entry) != {'default', 'vif'}:
        raise errors.InvalidVIF('an entry is {"default": bool, "vif": <os-vif primitive>}')
    if not isinstance(entry['default'], bool):
        raise errors.InvalidVIF('default must be true or false')
    return parse_vif(entry['vif'], default=entry['default'])


def parse_vif(primitive, default=False):
    """An os-vif VIF primitive -> :class:`kuryr_cni.vif.VIF`."""
    name, data = read_object(primitive, tuple(KINDS), 'vif')
    kind = KINDS[name]
    network = _network(_field(data, 'network', dict, 'vif'))
    spec = {
        'kind': kind,
        'port_id': _field(data, 'id', str, name),
        'mac': _field(data, 'address', str, name),
        'mtu': network['mtu'],
        'ips': network['ips'],
        'gateway': network['gateways'],
        'routes': network['routes'],
        'active': _optional(data, 'active', bool, name, True),
        'default': default,
        'network_id': network['id'],
    }
    if kind == 'bridge' and _hybrid(data, name):
        kind = spec['kind'] = 'ovs-hybrid'
        spec['integration_bridge'] = network['bridge']
        if spec['integration_bridge'] is None:
            raise errors.InvalidVIF('a hybrid-plugged VIFBridge\'s network names no bridge')
    if kind in vif_model.BRIDGED_KINDS:
        spec['bridge'] = _field(data, 'bridge_name', str, name)
    if kind in ('ovs', 'ovs-hybrid'):
        interface_id = _interface_id(data.get('port_profile'))
        if interface_id:
            spec['port_id'] = interface_id
    if kind == 'vlan':
        spec['vlan_id'] = _field(data, 'vlan_id', int, name)
    return vif_model.parse_vif(spec)


def _hybrid(data, name):
    """Whether a VIFBridge is hybrid-plugged: os-vif's OVS plugin, not linux_bridge, plugs it.

    os-vif picks the plugin by the VIF's ``plugin`` field; when it is absent,
    an Open vSwitch port profile says the same.
    """
    plugin = _optional(data, 'plugin', str, name, None)
    if plugin is not None:
        return plugin == 'ovs'
    profile = data.get('port_profile')
    return profile is not None and read_object(
        profile, PORT_PROFILES, 'vif.port_profile')[0] == 'VIFPortProfileOpenVSwitch'


def read_object(primitive, names, where):
    """``(name, data)`` of a versioned-object primitive whose name is one of ``names``."""
    if not isinstance(primitive, dict):
        raise errors.InvalidVIF('%s is not an os-vif object primitive' % where)
    prefix = next((p for p in PREFIXES if p + '.name' in primitive), None)
    if prefix is None:
        raise errors.InvalidVIF('%s is not an os-vif object primitive (no %s.name)'
                                % (where, PREFIXES[0]))
    keys = {prefix + '.' + k for k in ('name', 'namespace', 'version', 'data')}
    extra = set(primitive) - keys - {prefix + '.changes'}
    if not keys <= set(primitive) or extra:
        raise errors.InvalidVIF('%s has keys %s; an object primitive has %s'
                                % (where, sorted(primitive), sorted(keys)))
    name = primitive[prefix + '.name']
    if name not in names:
        only_there = ('; %s (%s) is plugged by kuryr-daemon only: its pods must stay on '
                      'kuryr-daemon' % (name, KURYR_DAEMON_ONLY[name])
                      if name in KURYR_DAEMON_ONLY and where == 'vif' else '')
        raise errors.InvalidVIF('%s is a %r; supported: %s%s'
                                % (where, name, ', '.join(names), only_there))
    if primitive[prefix + '.namespace'] != NAMESPACE:
        raise errors.InvalidVIF('%s %s has namespace %r, not %r'
                                % (where, name, primitive[prefix + '.namespace'], NAMESPACE))
    version = primitive[prefix + '.version']
    match = _VERSION.match(version) if isinstance(version, str) else None
    if match is None or match.group(1) != '1':
        raise errors.InvalidVIF('%s %s has version %r; only 1.x is understood'
                                % (where, name, version))
    data = primitive[prefix + '.data']
    if not isinstance(data, dict):
        raise errors.InvalidVIF('%s %s has no data object' % (where, name))
    return name, data


def _network(primitive):
    _, data = read_object(primitive, ('Network',), 'vif.network')
    mtu = data.get('mtu')
    if mtu is None:
        mtu = DEFAULT_MTU
    subnets = _objects(_field(data, 'subnets', dict, 'Network'), 'SubnetList', 'Subnet',
                       'Network.subnets')
    ips, gateways, routes = [], [], []
    for index, subnet in enumerate(subnets):
        where = 'Network.subnets[%d]' % index
        cidr = _cidr(_field(subnet, 'cidr', str, where), where)
        for fixed in _objects(_field(subnet, 'ips', dict, where), 'FixedIPList', 'FixedIP',
                              where + '.ips'):
            address = _field(fixed, 'address', str, where + '.ips')
            ips.append(_on_subnet(address, cidr, where))
        gateway = subnet.get('gateway')
        if gateway is not None:
            if not isinstance(gateway, str):
                raise errors.InvalidVIF('%s.gateway must be an address' % where)
            gateways.append(gateway)
        for route in _objects(subnet.get('routes') or _EMPTY_ROUTES, 'RouteList', 'Route',
                              where + '.routes'):
            entry = {'dst': _field(route, 'cidr', str, where + '.routes')}
            if route.get('gateway') is not None:
                entry['gw'] = _field(route, 'gateway', str, where + '.routes')
            routes.append(entry)
    if not ips:
        raise errors.InvalidVIF('the VIF\'s network has no fixed IP')
    return {'mtu': mtu, 'ips': ips, 'gateways': gateways, 'routes': routes,
            'bridge': _optional(data, 'bridge', str, 'Network', None),
            'id': _optional(data, 'id', str, 'Network', None)}


_EMPTY_ROUTES = {'versioned_object.name': 'RouteList', 'versioned_object.namespace': NAMESPACE,
                 'versioned_object.version': '1.0', 'versioned_object.data': {'objects': []}}


def _objects(primitive, list_name, item_name, where):
    """The data of every item of an os-vif ``...List`` object."""
    _, data = read_object(primitive, (list_name,), where)
    items = _field(data, 'objects', list, list_name)
    return [read_object(item, (item_name,), '%s[%d]' % (where, i))[1]
            for i, item in enumerate(items)]


def _interface_id(primitive):
    if primitive is None:
        return None
    name, data = read_object(primitive, PORT_PROFILES, 'vif.port_profile')
    return _optional(data, 'interface_id', str, name, None)


def _cidr(value, where):
    try:
        return ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        raise errors.InvalidVIF('%s.cidr %r is not a network' % (where, value),
                                str(exc)) from None


def _on_subnet(address, network, where):
    try:
        ip = ipaddress.ip_address(address)
    except ValueError as exc:
        raise errors.InvalidVIF('%s has an invalid fixed IP %r' % (where, address),
                                str(exc)) from None
    if ip not in network:
        raise errors.InvalidVIF('fixed IP %s is not on %s %s' % (ip, where, network))
    return '%s/%d' % (ip, network.prefixlen)


def _field(data, key, kind, where):
    value = data.get(key)
    if value is None:
        raise errors.InvalidVIF('%s has no %s' % (where, key))
    return _typed(value, key, kind, where)


def _optional(data, key, kind, where, default):
    value = data.get(key)
    return default if value is None else _typed(value, key, kind, where)


def _typed(value, key, kind, where):
    # bool is an int in Python: never accept one for the other.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise errors.InvalidVIF('%s.%s must be %s, not %r'
                                % (where, key, kind.__name__, value))
    return value
