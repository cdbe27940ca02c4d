"""Realistic os-vif primitives, as kuryr-controller writes them into KuryrPort status.vifs.

Shapes follow ``VersionedObject.obj_to_primitive()`` of os-vif objects
(``versioned_object.name/namespace/version/data``, nested objects as
primitives of their own, lists as ``...List`` objects holding ``objects``),
with the fields kuryr-controller sets: VIF ``id``, ``address``, ``active``,
``plugin``, ``vif_name``, ``has_traffic_filtering``, ``preserve_on_delete``,
the ``Network`` with its ``SubnetList``, ``FixedIPList`` and ``RouteList``,
and the port profile of OVS VIFs. Values are made up for these tests; the
shapes, field by field and version by version, are checked against what the
real kuryr-controller 10.0.0 writes by tests/openstack/test_fixtures.py, which
also records a real one in tests/fixtures/kuryr-controller-10.0.0/.
"""

import copy

PORT_ID = '8c5f3a10-2f4e-4c3b-9a61-0d6f2b7e4a21'
NETWORK_ID = 'b9b2c6a4-1f0c-4d4c-8c0e-2a7d5f1e9c33'


def obj(name, data, version='1.0', prefix='versioned_object'):
    return {prefix + '.name': name, prefix + '.namespace': 'os_vif',
            prefix + '.version': version, prefix + '.data': data}


def listed(name, items):
    return obj(name, {'objects': items})


def subnet(cidr, ips, gateway=None, routes=()):
    data = {'cidr': cidr, 'dns': [],
            'ips': listed('FixedIPList', [obj('FixedIP', {'address': ip}) for ip in ips]),
            'routes': listed('RouteList', [obj('Route', dict(r)) for r in routes])}
    if gateway is not None:
        data['gateway'] = gateway
    return obj('Subnet', data)


def network(subnets, mtu=1450, bridge='br-int'):
    """``bridge=None``: none, as kuryr-controller writes a nested pod's network."""
    data = {'id': NETWORK_ID, 'bridge': bridge, 'label': 'ns/default-net', 'mtu': mtu,
            'multi_host': False, 'should_provide_bridge': False, 'should_provide_vlan': False,
            'subnets': listed('SubnetList', list(subnets))}
    if bridge is None:
        del data['bridge']
    return obj('Network', data, version='1.1')


def dual_stack_network(n=5, mtu=1450, bridge='br-int'):
    return network([
        subnet('10.0.0.0/26', ['10.0.0.%d' % n], gateway='10.0.0.1',
               routes=[{'cidr': '192.168.0.0/16', 'gateway': '10.0.0.62'}]),
        subnet('fd00:10::/64', ['fd00:10::%x' % n], gateway='fd00:10::1'),
    ], mtu=mtu, bridge=bridge)


def ovs_vif(active=True, profile_version='1.4', n=5, **data):
    base = {'active': active, 'address': 'fa:16:3e:98:7b:%02x' % n,
            'bridge_name': 'br-int', 'has_traffic_filtering': True, 'id': PORT_ID,
            'network': dual_stack_network(n), 'plugin': 'ovs',
            # kuryr-controller sets the interface ID alone (no datapath_type, no create_port).
            'port_profile': obj('VIFPortProfileOpenVSwitch', {'interface_id': PORT_ID},
                                version=profile_version),
            'preserve_on_delete': False, 'vif_name': 'tap8c5f3a10-2f'}
    base.update(data)
    return obj('VIFOpenVSwitch', base)


def bridge_vif(active=True, n=5, **data):
    base = {'active': active, 'address': 'fa:16:3e:98:7b:%02x' % n,
            'bridge_name': 'kuryr-br0', 'has_traffic_filtering': False, 'id': PORT_ID,
            'network': dual_stack_network(n), 'plugin': 'linux_bridge',
            'preserve_on_delete': False, 'vif_name': 'tap8c5f3a10-2f'}
    base.update(data)
    return obj('VIFBridge', base)


def hybrid_vif(active=True, n=5, **data):
    """A hybrid-plugged port (ML2/OVS, iptables_hybrid firewall), as kuryr-controller
    writes it: a VIFBridge of plugin ovs into the port's qbr bridge, the
    integration bridge in its network."""
    base = {'active': active, 'address': 'fa:16:3e:98:7b:%02x' % n,
            'bridge_name': ('qbr' + PORT_ID)[:14], 'has_traffic_filtering': True,
            'id': PORT_ID, 'network': dual_stack_network(n), 'plugin': 'ovs',
            'port_profile': obj('VIFPortProfileOpenVSwitch',
                                {'interface_id': PORT_ID, 'datapath_type': 'system',
                                 'create_port': False}, version='1.4'),
            'preserve_on_delete': False, 'vif_name': 'tap8c5f3a10-2f'}
    base.update(data)
    return obj('VIFBridge', base)


def vlan_vif(active=True, vlan_id=100, n=5, **data):
    # No bridge in its network: kuryr-controller's nested-vlan driver sets none
    # (tests/fixtures/kuryr-controller-10.0.0/kuryrport-vlan-nested.json).
    base = {'active': active, 'address': 'fa:16:3e:12:34:%02x' % n, 'id': PORT_ID,
            'has_traffic_filtering': False, 'network': dual_stack_network(n, bridge=None),
            'plugin': 'noop', 'preserve_on_delete': False, 'vif_name': 'tap8c5f3a10-2f',
            'vlan_id': vlan_id}
    base.update(data)
    return obj('VIFVlanNested', base)


def macvlan_vif(active=True, n=5, **data):
    base = {'active': active, 'address': 'fa:16:3e:56:78:%02x' % n, 'id': PORT_ID,
            'has_traffic_filtering': False, 'network': dual_stack_network(n),
            'plugin': 'noop', 'preserve_on_delete': False, 'vif_name': 'tap8c5f3a10-2f'}
    base.update(data)
    return obj('VIFMacvlanNested', base)


def status_vifs(primary, extra=()):
    """``status.vifs``: eth0 (default) and eth1... as kuryr-controller names them."""
    vifs = {'eth0': {'default': True, 'vif': primary}}
    for index, vif in enumerate(extra, start=1):
        vifs['eth%d' % index] = {'default': False, 'vif': vif}
    return copy.deepcopy(vifs)


def kuryrport(namespace, name, node, pod_uid, vifs=None, static=False):
    """A KuryrPort object as kuryr-controller creates it (then fills status.vifs)."""
    return {'apiVersion': 'openstack.org/v1', 'kind': 'KuryrPort',
            'metadata': {'name': name, 'namespace': namespace,
                         'labels': {'kuryr.openstack.org/nodeName': node},
                         'finalizers': ['kuryr.openstack.org/kuryrport-finalizer'],
                         'ownerReferences': [{'apiVersion': 'v1', 'kind': 'Pod', 'name': name,
                                              'uid': pod_uid}]},
            'spec': {'podUid': pod_uid, 'podNodeName': node, 'podStatic': static},
            'status': {'vifs': vifs or {}}}
