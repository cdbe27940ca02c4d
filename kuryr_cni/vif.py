"""The VIF model and the strict reader of the ``kuryr.openstack.org/vifs`` annotation.

Everything a binding driver hands to the kernel comes through here first, so
every field is validated and normalised at this edge; no I/O happens here.
VIFs cross process boundaries (watcher → Manager → workers) as the small plain
dicts of :meth:`VIF.to_dict`.
"""

import dataclasses
import ipaddress
import json
import re

from kuryr_cni import errors

ANNOTATION = 'kuryr.openstack.org/vifs'
KINDS = ('bridge', 'ovs', 'ovs-hybrid', 'vlan', 'macvlan')
BRIDGED_KINDS = ('bridge', 'ovs', 'ovs-hybrid')     # kinds that name a bridge
NESTED_KINDS = ('vlan', 'macvlan')                  # kinds that hang off a parent
MAX_ANNOTATION_BYTES = 64 * 1024
MAX_INTERFACES = 16
MAX_ROUTES = 64

# Linux IFNAMSIZ is 16 including the NUL; '/' and whitespace are refused by the kernel
# and ':' is reserved for aliases. Keep to a conservative, shell-safe alphabet.
_IFNAME = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}\Z')
_PORT_ID = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z')
_MAC = re.compile(r'^[0-9a-f]{2}(:[0-9a-f]{2}){5}\Z')


def valid_ifname(name):
    return isinstance(name, str) and bool(_IFNAME.match(name)) and name not in ('.', '..')


@dataclasses.dataclass(frozen=True)
class Route:
    dst: str                 # network in CIDR form
    gw: str | None = None


@dataclasses.dataclass(frozen=True)
class VIF:
    kind: str
    port_id: str
    mac: str
    mtu: int
    ips: tuple               # interface addresses in CIDR form, e.g. '10.0.0.5/24'
    gateways: tuple = ()     # at most one per IP family
    routes: tuple = ()
    active: bool = False
    default: bool = False
    bridge: str | None = None    # bridge and ovs kinds; ovs-hybrid: its port's qbr bridge
    parent: str | None = None    # vlan and macvlan kinds
    vlan_id: int | None = None   # vlan kind
    integration_bridge: str | None = None   # ovs-hybrid kind: the OVS bridge (br-int)
    # The Neutron network of the port, when the VIF source says it: addresses
    # are unique per network, not per node (kuryr_cni.records.vif_addresses).
    network_id: str | None = None

    @property
    def bridges(self):
        """Every bridge this VIF names (what ``[binding] bridges`` must allow)."""
        return tuple(b for b in (self.bridge, self.integration_bridge) if b is not None)

    def to_dict(self):
        d = dataclasses.asdict(self)
        d['ips'] = list(self.ips)
        d['gateways'] = list(self.gateways)
        d['routes'] = [dataclasses.asdict(r) for r in self.routes]
        for later in _LATER_FIELDS:
            if d[later] is None:
                del d[later]    # records without it stay as before the field existed
        return d

    @classmethod
    def from_dict(cls, d):
        d = dict(d)
        d['ips'] = tuple(d['ips'])
        d['gateways'] = tuple(d['gateways'])
        d['routes'] = tuple(Route(**r) for r in d['routes'])
        return cls(**d)


def inactive_note(vifs):
    """' (inactive: eth0 port 5d0b…)' for the inactive ones of ``vifs`` ({ifname: VIF dict})."""
    inactive = ['%s port %s' % (name, vif.get('port_id'))
                for name, vif in sorted((vifs or {}).items()) if not vif.get('active')]
    return ' (inactive: %s)' % ', '.join(inactive) if inactive else ''


_FIELDS = frozenset(f.name for f in dataclasses.fields(VIF))
# Fields added after records were first written: a record may lack them.
_LATER_FIELDS = frozenset({'integration_bridge', 'network_id'})

# Neutron and os-vif name a hybrid-plugged port's devices after its ID, cut to
# 14 characters: the qbr bridge, and the qvb (in the qbr) / qvo (on OVS) veth pair.
HYBRID_NAME_LEN = 14


def hybrid_device_name(prefix, port_id):
    """The name of a hybrid-plugged port's ``qbr``, ``qvb`` or ``qvo`` device."""
    return (prefix + port_id)[:HYBRID_NAME_LEN]


def from_record(data):
    """A VIF as :meth:`VIF.to_dict` wrote it into a binding record, validated again.

    Files can be damaged or edited, so a persisted VIF passes the same checks
    as an annotation's; raises InvalidVIF.
    """
    if not isinstance(data, dict) or not _FIELDS - _LATER_FIELDS <= set(data) <= _FIELDS:
        raise errors.InvalidVIF('persisted VIF must be an object with the fields %s'
                                % ', '.join(sorted(_FIELDS)))
    spec = dict(data, gateway=data['gateways'])
    del spec['gateways']
    return parse_vif(spec)


def parse_annotation(text):
    """Parse the annotation text into ``{ifname: VIF}``; raise InvalidVIF."""
    # surrogatepass: a JSON-decoded annotation may hold lone surrogates.
    if not isinstance(text, str) or \
            len(text.encode(errors='surrogatepass')) > MAX_ANNOTATION_BYTES:
        raise errors.InvalidVIF('VIF annotation missing or larger than %d bytes'
                                % MAX_ANNOTATION_BYTES)
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:   # RecursionError: too deeply nested
        raise errors.InvalidVIF('VIF annotation is not JSON', str(exc)) from None
    return parse_vifs(raw)


def parse_vifs(raw):
    """Validate the decoded annotation object; return ``{ifname: VIF}``."""
    if not isinstance(raw, dict) or not raw:
        raise errors.InvalidVIF('VIF annotation must be a non-empty JSON object')
    if len(raw) > MAX_INTERFACES:
        raise errors.InvalidVIF('VIF annotation has more than %d interfaces' % MAX_INTERFACES)
    vifs = {}
    for ifname, spec in raw.items():
        if not valid_ifname(ifname):
            raise errors.InvalidVIF('invalid interface name %r in VIF annotation' % ifname)
        try:
            vifs[ifname] = parse_vif(spec)
        except errors.InvalidVIF as exc:
            raise errors.InvalidVIF('VIF %s: %s' % (ifname, exc.msg), exc.details) from None
    defaults = [name for name, vif in vifs.items() if vif.default]
    if len(defaults) > 1:
        raise errors.InvalidVIF('more than one VIF is marked default: %s' % ', '.join(defaults))
    return vifs


def parse_vif(spec):
    """Validate one VIF object of the annotation."""
    if not isinstance(spec, dict):
        raise errors.InvalidVIF('must be a JSON object')
    kind = spec.get('kind')
    if kind not in KINDS:
        raise errors.InvalidVIF('kind must be one of %s, not %r' % (', '.join(KINDS), kind))
    ips = _interfaces(spec.get('ips'))
    gateways = _gateways(spec.get('gateway'), ips)
    vif = VIF(
        kind=kind,
        port_id=_match(spec.get('port_id'), _PORT_ID, 'port_id'),
        mac=_mac(spec.get('mac')),
        mtu=_int(spec.get('mtu', 1500), 'mtu', 68, 65535),
        ips=tuple(str(i) for i in ips),
        gateways=tuple(str(g) for g in gateways),
        routes=tuple(_routes(spec.get('routes', []), ips, gateways)),
        active=_bool(spec.get('active', False), 'active'),
        default=_bool(spec.get('default', False), 'default'),
        bridge=_optional_ifname(spec.get('bridge'), 'bridge'),
        parent=_optional_ifname(spec.get('parent'), 'parent'),
        vlan_id=(None if spec.get('vlan_id') is None
                 else _int(spec['vlan_id'], 'vlan_id', 1, 4094)),
        integration_bridge=_optional_ifname(spec.get('integration_bridge'),
                                            'integration_bridge'),
        network_id=(None if spec.get('network_id') is None
                    else _match(spec['network_id'], _PORT_ID, 'network_id')),
    )
    if kind in BRIDGED_KINDS and vif.bridge is None:
        raise errors.InvalidVIF('kind %s needs a "bridge"' % kind)
    if kind == 'vlan' and vif.vlan_id is None:
        raise errors.InvalidVIF('kind vlan needs a "vlan_id"')
    if kind == 'ovs-hybrid':
        _check_hybrid(vif)
    elif vif.integration_bridge is not None:
        raise errors.InvalidVIF('only kind ovs-hybrid has an "integration_bridge"')
    return vif


def _check_hybrid(vif):
    """A hybrid VIF's qbr bridge is its port's: named after the port ID, as Neutron does.

    So a VIF can never name another port's private bridge (and slip past that
    port's firewall), and the qvb/qvo names derived from the port ID are valid.
    """
    if vif.integration_bridge is None:
        raise errors.InvalidVIF('kind ovs-hybrid needs an "integration_bridge"')
    for prefix in ('qbr', 'qvb', 'qvo'):
        if not valid_ifname(hybrid_device_name(prefix, vif.port_id)):
            raise errors.InvalidVIF('port_id %r makes no valid %s device name'
                                    % (vif.port_id, prefix))
    expected = hybrid_device_name('qbr', vif.port_id)
    if vif.bridge != expected:
        raise errors.InvalidVIF('an ovs-hybrid VIF\'s bridge is its port\'s %s, not %s'
                                % (expected, vif.bridge))
    if vif.integration_bridge == vif.bridge:
        raise errors.InvalidVIF('an ovs-hybrid VIF\'s integration bridge cannot be its '
                                'qbr bridge')


def _match(value, pattern, field):
    if not isinstance(value, str) or not pattern.match(value):
        raise errors.InvalidVIF('invalid %s %r' % (field, value))
    return value


def _mac(value):
    mac = value.lower() if isinstance(value, str) else value
    _match(mac, _MAC, 'mac')
    if int(mac[:2], 16) & 1:
        raise errors.InvalidVIF('mac %s is multicast' % mac)
    if mac == '00:00:00:00:00:00':
        raise errors.InvalidVIF('mac is all zeros')
    return mac


def _int(value, field, low, high):
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise errors.InvalidVIF('%s must be an integer in %d..%d, not %r'
                                % (field, low, high, value))
    return value


def _bool(value, field):
    if not isinstance(value, bool):
        raise errors.InvalidVIF('%s must be true or false, not %r' % (field, value))
    return value


def _optional_ifname(value, field):
    if value is None:
        return None
    if not valid_ifname(value):
        raise errors.InvalidVIF('invalid %s interface name %r' % (field, value))
    return value


def _interfaces(value):
    if not isinstance(value, list) or not value or len(value) > 16:
        raise errors.InvalidVIF('ips must be a list of 1 to 16 addresses in CIDR form')
    result = []
    for item in value:
        iface = _ip(item, 'ips', ipaddress.ip_interface)
        if '/' not in item:
            raise errors.InvalidVIF('address %r has no prefix length' % item)
        net = iface.network
        edges = (net.network_address, net.broadcast_address)
        if iface.ip in edges and net.prefixlen < net.max_prefixlen - 1:
            raise errors.InvalidVIF('address %s is its network or broadcast address' % item)
        if iface.ip.is_multicast or iface.ip.is_unspecified or iface.ip.is_loopback:
            raise errors.InvalidVIF('address %s is not a unicast host address' % item)
        result.append(iface)
    return result


def _gateways(value, ips):
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    gateways = [_ip(v, 'gateway', ipaddress.ip_address) for v in values]
    versions = [g.version for g in gateways]
    if len(set(versions)) != len(versions):
        raise errors.InvalidVIF('at most one gateway per IP family')
    for gw in gateways:
        if not any(gw in i.network for i in ips):
            raise errors.InvalidVIF('gateway %s is on none of the VIF\'s subnets' % gw)
        if any(gw == i.ip for i in ips):
            raise errors.InvalidVIF('gateway %s is the VIF\'s own address' % gw)
    return gateways


def _routes(value, ips, gateways):
    if not isinstance(value, list) or len(value) > MAX_ROUTES:
        raise errors.InvalidVIF('routes must be a list of at most %d routes' % MAX_ROUTES)
    # The kernel refuses a second route to one destination ("File exists"), and
    # a gateway already makes the default route of its family.
    taken = {ipaddress.ip_network('0.0.0.0/0' if g.version == 4 else '::/0') for g in gateways}
    routes = []
    for item in value:
        if not isinstance(item, dict) or set(item) - {'dst', 'gw'} or 'dst' not in item:
            raise errors.InvalidVIF('a route is {"dst": CIDR, "gw": address}, not %r' % (item,))
        dst = _ip(item['dst'], 'route dst', lambda v: ipaddress.ip_network(v, strict=True))
        if dst in taken:
            raise errors.InvalidVIF('route to %s given twice (a gateway makes the default '
                                    'route of its family)' % dst)
        taken.add(dst)
        gw = item.get('gw')
        if gw is not None:
            gw = _ip(gw, 'route gw', ipaddress.ip_address)
            if gw.version != dst.version:
                raise errors.InvalidVIF('route %s has a gateway of another family' % dst)
            if not any(gw in i.network for i in ips):
                raise errors.InvalidVIF('route gateway %s is on none of the VIF\'s subnets' % gw)
        routes.append(Route(str(dst), None if gw is None else str(gw)))
    return routes


def _ip(value, field, parse):
    # '%' would bring an IPv6 scope (zone) the kernel's address requests cannot carry.
    if not isinstance(value, str) or len(value) > 64 or '%' in value:
        raise errors.InvalidVIF('invalid %s %r' % (field, value))
    try:
        return parse(value)
    except ValueError as exc:
        raise errors.InvalidVIF('invalid %s %r' % (field, value), str(exc)) from None
