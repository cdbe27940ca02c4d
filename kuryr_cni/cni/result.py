"""Build the ADD result, in the cniVersion the runtime asked for.

0.3.x and 0.4.0 results carry ``ips[].version``; 1.x results do not. Both
index ``ips[].interface`` into ``interfaces``. A ``prevResult`` (chained
plugins) is kept and ours is appended to it.
"""

import ipaddress

from kuryr_cni import cni


def build(cni_version, netns, plugged, prev_result=None):
    """``plugged``: list of ``(ifname, VIF, default_route)`` in the pod ``netns``."""
    result = _start_from(prev_result)
    version = cni.version_tuple(cni_version)
    with_version = version < (1, 0, 0)
    for ifname, vif, default_route in plugged:
        index = len(result['interfaces'])
        interface = {'name': ifname, 'mac': vif.mac, 'sandbox': netns}
        if version >= (1, 1, 0):
            interface['mtu'] = vif.mtu   # the field appeared in 1.1.0
        result['interfaces'].append(interface)
        for address in vif.ips:
            result['ips'].append(_ip(address, vif.gateways, index, with_version))
        result['routes'].extend(_routes(vif, default_route))
    result['cniVersion'] = cni_version
    return result


def _start_from(prev_result):
    prev = prev_result or {}
    return {
        'interfaces': list(prev.get('interfaces') or []),
        'ips': list(prev.get('ips') or []),
        'routes': list(prev.get('routes') or []),
        'dns': dict(prev.get('dns') or {}),
    }


def _ip(address, gateways, index, with_version):
    iface = ipaddress.ip_interface(address)
    entry = {'address': address, 'interface': index}
    gateway = next((g for g in gateways if ipaddress.ip_address(g) in iface.network), None)
    if gateway:
        entry['gateway'] = gateway
    if with_version:
        entry['version'] = str(iface.version)
    return entry


def _routes(vif, default_route):
    routes = [{'dst': r.dst, **({'gw': r.gw} if r.gw else {})} for r in vif.routes]
    if default_route:
        for gateway in vif.gateways:
            dst = '0.0.0.0/0' if ipaddress.ip_address(gateway).version == 4 else '::/0'
            routes.append({'dst': dst, 'gw': gateway})
    return routes
