"""CHECK's judgement of a ``prevResult`` against what a pod's namespace holds.

The runtime's ``prevResult`` is the final result of the whole plugin chain,
so it may list interfaces, addresses and routes of other plugins, and later
plugins may have changed routes. What it says about *our* interfaces (named
by the attachment, in its ``sandbox``) must hold in the kernel: each is
listed, has the MAC listed, carries every address listed for it; and every
route of the main table it lists exists in the namespace.

No I/O here: the namespace's state comes in as a plain ``view`` (see
:func:`differences`), read by :mod:`kuryr_cni.podview`.
"""

import ipaddress

RT_TABLE_MAIN = 254


def differences(prev, netns, ifnames, view):
    """List, in words, how ``view`` differs from ``prev``; empty when it matches.

    ``ifnames`` are the attachment's interface names inside ``netns``.
    ``view`` is ``{"links": {ifname: {"mac": str, "addresses": {ip_interface}}},
    "routes": {(ip_network, ip_address or None)}}``.
    """
    problems = []
    ours = _our_interfaces(prev, netns, ifnames, problems)
    for entry in ours.values():
        problems += _interface_differences(entry, view['links'].get(entry['name']))
    for ip in _list(prev, 'ips'):
        index = ip.get('interface')
        if index in ours:
            problems += _address_difference(ip, ours[index]['name'], view['links'])
    for route in _list(prev, 'routes'):
        problems += _route_difference(route, view['routes'])
    return problems


def _list(prev, key):
    items = prev.get(key)
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def _our_interfaces(prev, netns, ifnames, problems):
    """``{index in prev["interfaces"]: entry}`` of the attachment's interfaces."""
    ours = {}
    interfaces = prev.get('interfaces') if isinstance(prev.get('interfaces'), list) else []
    for index, entry in enumerate(interfaces):
        if (isinstance(entry, dict) and entry.get('name') in ifnames
                and entry.get('sandbox') == netns):
            ours[index] = entry
    for name in sorted(set(ifnames) - {entry['name'] for entry in ours.values()}):
        problems.append('prevResult lists no interface %s in %s' % (name, netns))
    return ours


def _interface_differences(entry, link):
    if link is None:
        return ['%s is missing' % entry['name']]
    mac = entry.get('mac')
    if isinstance(mac, str) and mac and mac.lower() != (link['mac'] or '').lower():
        return ['%s has MAC %s, prevResult says %s' % (entry['name'], link['mac'], mac)]
    return []


def _address_difference(ip, ifname, links):
    try:
        address = ipaddress.ip_interface(ip.get('address'))
    except ValueError:
        return ['prevResult address %r is not an address in CIDR form' % (ip.get('address'),)]
    link = links.get(ifname)
    if link is not None and address not in link['addresses']:
        return ['%s lacks address %s listed in prevResult' % (ifname, address)]
    return []


def _route_difference(route, routes):
    if route.get('table') not in (None, RT_TABLE_MAIN):
        return []       # another table: set up by another plugin, not ours to judge
    try:
        dst = ipaddress.ip_network(route.get('dst'), strict=False)
        gw = None if route.get('gw') in (None, '') else ipaddress.ip_address(route['gw'])
    except (TypeError, ValueError):
        return ['prevResult route %r is malformed' % (route,)]
    found = {via for network, via in routes if network == dst}
    if not found or (gw is not None and gw not in found):
        return ['route %s%s listed in prevResult is missing'
                % (dst, '' if gw is None else ' via %s' % gw)]
    return []
