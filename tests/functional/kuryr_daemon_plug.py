"""A stand-in for kuryr-daemon 10.0.0 plugging a pod: the devices it leaves, made as it
makes them (from its binding drivers and os-vif 3.5's ovs plugin; no code of theirs).

* ``ovs`` (``VIFOpenVSwitchDriver``): a veth made in the pod namespace, ``<ifname>``
  there and ``tap<port[:11]>`` moved to the host; MTU, the VIF's MAC on the pod
  end, both up; then ``ovs-vsctl -- --if-exists del-port tap… -- add-port
  <bridge> tap… -- set Interface tap… external-ids:iface-id=<port>
  external-ids:iface-status=active external-ids:attached-mac=<mac>
  external-ids:vm-uuid=kuryr``.
* ``ovs-hybrid`` (os-vif's ``_plug_bridge``, then kuryr's ``BridgeDriver``): the
  bridge ``qbr…`` (MAC ageing 0, IPv6 off, up), the veth ``qvb…``/``qvo…`` (up,
  promiscuous, MTU), ``qvb…`` in the ``qbr…``, ``qvo…`` added to the integration
  bridge with the same external_ids but ``vm-uuid=<pod UID>``; then the pod's
  veth as for ``ovs``, its host end ``tap…`` in the ``qbr…``.
* ``vlan``/``macvlan`` (``NestedDriver``): ``tap…`` made on the trunk parent in the
  host (``vlan id <vlan_id>``; ``macvlan mode bridge``), moved into the pod
  namespace, renamed ``<ifname>``, MTU, the VIF's MAC, up.

Then kuryr's ``_configure_l3``: the VIF's addresses and the default route.
``overrides`` plant a device that differs from the VIF (the proof tests).
"""

import os

from kuryr_cni import vif as vif_model
from tools.testbed import host as testhost


def names(port_id):
    return {prefix: vif_model.hybrid_device_name(prefix, port_id)
            for prefix in ('tap', 'qbr', 'qvb', 'qvo')}


def plug(node_ns, pod_path, vif, switch=None, parent='trunk0', pod_uid='kuryr',
         ifname='eth0', attached_mac=None, iface_id=None, mac=None, vlan_id=None):
    """Plug ``vif`` (a spec dict) into ``pod_path`` as kuryr-daemon would; node in ``node_ns``."""
    pod_ns = os.path.basename(pod_path)
    n = names(vif['port_id'])
    mtu = str(vif['mtu'])
    mac = mac or vif['mac']
    kind = vif['kind']
    if kind in ('vlan', 'macvlan'):
        extra = (['type', 'vlan', 'id', str(vlan_id or vif['vlan_id'])] if kind == 'vlan'
                 else ['type', 'macvlan', 'mode', 'bridge'])
        testhost.ip('-n', node_ns, 'link', 'add', n['tap'], 'link', parent, *extra)
        testhost.ip('-n', node_ns, 'link', 'set', n['tap'], 'netns', pod_ns)
        testhost.ip('-n', pod_ns, 'link', 'set', n['tap'], 'name', ifname)
        testhost.ip('-n', pod_ns, 'link', 'set', ifname, 'mtu', mtu, 'address', mac, 'up')
    else:
        ids = ['external-ids:iface-id=%s' % (iface_id or vif['port_id']),
               'external-ids:iface-status=active',
               'external-ids:attached-mac=%s' % (attached_mac or vif['mac'])]
        if kind == 'ovs-hybrid':
            qbr, qvb, qvo = n['qbr'], n['qvb'], n['qvo']
            testhost.ip('-n', node_ns, 'link', 'add', qbr, 'type', 'bridge', 'ageing_time', '0')
            testhost.ip('netns', 'exec', node_ns, 'sysctl', '-qw',
                        'net.ipv6.conf.%s.disable_ipv6=1' % qbr)
            testhost.ip('-n', node_ns, 'link', 'set', qbr, 'up')
            testhost.ip('-n', node_ns, 'link', 'add', qvb, 'type', 'veth', 'peer', 'name', qvo)
            for dev in (qvb, qvo):
                testhost.ip('-n', node_ns, 'link', 'set', dev, 'up', 'promisc', 'on',
                            'mtu', mtu)
            testhost.ip('-n', node_ns, 'link', 'set', qvb, 'master', qbr)
            switch.vsctl('--', '--if-exists', 'del-port', qvo, '--', 'add-port',
                         vif['integration_bridge'], qvo, '--', 'set', 'Interface', qvo,
                         *ids, 'external-ids:vm-uuid=%s' % pod_uid)
        testhost.ip('-n', pod_ns, 'link', 'add', ifname, 'type', 'veth', 'peer', 'name',
                    n['tap'], 'netns', node_ns)
        testhost.ip('-n', pod_ns, 'link', 'set', ifname, 'mtu', mtu, 'address', mac, 'up')
        testhost.ip('-n', node_ns, 'link', 'set', n['tap'], 'mtu', mtu, 'up')
        if kind == 'ovs-hybrid':
            testhost.ip('-n', node_ns, 'link', 'set', n['tap'], 'master', n['qbr'])
        else:
            switch.vsctl('--', '--if-exists', 'del-port', n['tap'], '--', 'add-port',
                         vif['bridge'], n['tap'], '--', 'set', 'Interface', n['tap'],
                         *ids, 'external-ids:vm-uuid=kuryr')
    for address in vif['ips']:
        testhost.ip('-n', pod_ns, 'addr', 'add', address, 'dev', ifname,
                    *(['nodad'] if ':' in address else []))
    for gateway in vif.get('gateway', [])[:1]:
        testhost.ip('-n', pod_ns, 'route', 'add', 'default', 'via', gateway, 'dev', ifname)
