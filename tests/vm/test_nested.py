"""Nested mode for real: pods as VLAN subports of their guest node's Neutron trunk.

Two guests are Kubernetes nodes behind the real control plane
(:class:`tests.vm.nested.Cluster`: neutron ML2/OVN with the trunk plugin,
kuryr-controller 10.0.0 with ``nested-vlan``), each with its trunk NIC on
br-int as its trunk's parent port. A pod's way, step by step and timed:
kuryr-controller creates a subport on the node's trunk and writes a
``VIFVlanNested`` KuryrPort; the daemon in the guest makes a VLAN device on
the trunk NIC inside the pod; Neutron's port is ACTIVE; the ADD answers.
Then traffic between pods on the two nodes through OVN, security groups in
both directions, the seed's race with a real subport, a VLAN ID held by a
device no record explains, and the fixtures kuryr-controller really writes.

What ML2/OVN showed here about ACTIVE: its trunk driver copies the parent's
status into a subport when it joins the trunk (neutron 29,
``OVNTrunkHandler._set_binding_profile``), and OVN binds a subport with its
parent (the VLAN tag is all it needs), so a subport of a running node is
ACTIVE before any device exists in the guest: in nested mode ``active`` says
the trunk is up, not that the pod is plugged.
"""

import json
import os
import shlex
import threading
import time
import uuid

import pytest

from tests import conftest
from tests import fixtures
from tests import wait
from tests.openstack import tcp
from tests.openstack import test_fixtures
from tests.unit import osvif_fixtures as fx
from tests.vm import nested
from tools.testbed import shim

NODES = ('nested1', 'nested2', 'nested3')     # the third for the scale test alone
IDLE_WINDOW = 30    # seconds of kube-apiserver CPU measured with and without the daemons
RECORDING = fixtures.KURYRPORT_RECORDING.parent / 'kuryrport-vlan-nested.json'


CLIENT = """
import socket, sys, time
end = time.monotonic() + 30
while True:
    try:
        c = socket.create_connection((sys.argv[1], %d), timeout=5)
        break
    except OSError:
        if time.monotonic() > end:
            raise
        time.sleep(0.2)
c.settimeout(15)
c.sendall(b'through OVN')
sys.stdout.write(c.recv(100).decode())
""" % tcp.PORT


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
    conftest.require_tier('vm', nested.missing())
    shim.built()
    made = nested.Cluster(str(tmp_path_factory.mktemp('nested')), NODES)
    try:
        for what, seconds in made.timings.items():
            nested.TIMINGS.append((what, seconds))
        for name, guest in made.guests.guests.items():
            nested.TIMINGS.append(('%s: boot to ready' % name, guest.boot_seconds))
        yield made
        for name in NODES:
            nested.TIMINGS.append(('%s: memory (MiB, resident guest RAM)' % name,
                                   made.guests.memory_mib(name)))
        # Every test's pods took their subports, ports and devices with them.
        for node in made.nodes.values():
            assert made.subports(node) == {}, node.name
            assert node.vlan_devices() == {}, node.name
        assert made.stack.neutron('GET', '/ports?device_owner=trunk:subport')['ports'] == []
    finally:
        made.close()


@pytest.fixture
def pods(cluster):
    """``pods.start(node)`` starts a pod (created, ADDed at once); all are DELed and
    deleted after the test, and kuryr-controller removes their subports."""
    class Pods:
        def __init__(self):
            self.made = []

        def start(self, node):
            pod = cluster.start_pod(node)
            self.made.append(pod)
            assert pod.outcome['code'] == 0, (pod.outcome, node.daemon_log())
            return pod

        def create(self, node):
            pod = cluster.create_pod(node)
            self.made.append(pod)
            return pod

    made = Pods()
    yield made
    for pod in made.made:
        pod.node.cni('del', pod)
        pod.node.sh('ip netns del %s' % pod.netns)
        cluster.delete_pod(pod)


def _record_steps(pod):
    for step, seconds in sorted(pod.at.items(), key=lambda item: item[1]):
        nested.TIMINGS.append(('pod on %s: %s' % (pod.node.name, step), seconds))


def _vlan_of(node, pod):
    link = node.links(pod.netns)['eth0']
    return link['linkinfo']['info_kind'], link['linkinfo']['info_data']['id']


# 1. One node: the subport, the KuryrPort, the VLAN device, ACTIVE, the answer; the DEL.

def test_a_pod_is_a_vlan_subport_of_its_nodes_trunk(cluster, pods):
    node = cluster.nodes[NODES[0]]
    pod = pods.start(node)
    _record_steps(pod)
    at = pod.at
    assert {'subport created', 'KuryrPort written', 'ACTIVE', 'plugged',
            'ADD answered'} <= set(at), at
    # (plugged is seen through the guest's spool, a fork away: its time is an upper bound,
    # and the ADD's result is the proof it came first.)
    assert at['subport created'] <= at['KuryrPort written'] <= at['ADD answered'], at
    vif = pod.vif
    # The subport is on this node's trunk, with the KuryrPort's VLAN ID.
    assert cluster.subports(node) == {vif['id']: vif['vlan_id']}
    port = cluster.stack.port(vif['id'])
    assert port['status'] == 'ACTIVE'
    assert port['device_owner'] == 'trunk:subport'
    assert port['binding:profile'] == {'parent_name': node.port['id'], 'tag': vif['vlan_id']}
    # OVN bound it as a container port of the node's trunk port.
    binding = cluster.stack.sbctl('--bare', '--columns=parent_port,tag,up', 'find',
                                  'Port_Binding', 'logical_port=' + vif['id']).split()
    assert binding == [node.port['id'], str(vif['vlan_id']), 'true']
    # In the guest: eth0 of the pod is that VLAN on the trunk NIC, with the port's MAC
    # and address, and nothing else holds the VLAN.
    assert _vlan_of(node, pod) == ('vlan', vif['vlan_id'])
    eth0 = node.links(pod.netns)['eth0']
    assert eth0['address'] == port['mac_address']
    assert eth0['link_index'] == json.loads(node.sh('ip -j link show %s' % nested.TRUNK_NIC)
                                            )[0]['ifindex']
    assert pod.address == port['fixed_ips'][0]['ip_address']
    assert node.vlan_devices() == {vif['vlan_id']: (pod.netns, 'eth0')}

    # The pod deleted: its VLAN device at the DEL, its subport, port and KuryrPort after.
    pods.made.remove(pod)
    started = time.monotonic()
    assert node.cni('del', pod)['code'] == 0
    nested.TIMINGS.append(('pod on %s: DEL answered' % node.name, time.monotonic() - started))
    assert node.vlan_devices() == {}
    node.sh('ip netns del %s' % pod.netns)
    started = time.monotonic()
    cluster.delete_pod(pod)
    nested.TIMINGS.append(('pod on %s: pod, KuryrPort gone after the API DELETE' % node.name,
                           time.monotonic() - started))
    assert cluster.subports(node) == {}
    assert cluster.stack.port(vif['id']) is None


# 2. Two nodes: ping and TCP through OVN; security groups in both directions.

def test_pods_on_two_nodes_reach_each_other_through_ovn(cluster, pods):
    node_a, node_b = (cluster.nodes[name] for name in NODES[:2])
    a = pods.start(node_a)
    b = pods.start(node_b)
    for pod in (a, b):
        _record_steps(pod)
    assert node_a.ping(a.netns, b.address, count=3)
    assert node_b.ping(b.netns, a.address, count=3)
    assert _echo(b, a) == 'through OVN'


def _echo(server, client):
    """What a TCP echo server in pod ``server`` sends back to a client in pod ``client``."""
    answer = {}
    thread = threading.Thread(target=lambda: answer.update(server=server.node.in_pod(
        server.netns, 'python3 -c %s' % shlex.quote(tcp.SERVER), timeout=60)))
    thread.start()
    try:
        out = client.node.in_pod(client.netns, 'python3 -c %s %s'
                                 % (shlex.quote(CLIENT), server.address), timeout=60)
    finally:
        thread.join(90)
    assert out.returncode == 0, (out.output, answer)
    return out.output.strip()


def test_security_groups_hold_both_ways(cluster, pods):
    stack = cluster.stack
    node_a, node_b = (cluster.nodes[name] for name in NODES[:2])
    a = pods.start(node_a)
    b = pods.start(node_b)
    assert node_a.ping(a.netns, b.address)
    # B's group of its own: no ingress rule (Neutron gives a new group egress ones only).
    closed = stack.neutron('POST', '/security-groups', {'security_group': {
        'name': 'closed-' + uuid.uuid4().hex[:6], 'project_id': stack.env['PROJECT']}}
    )['security_group']
    b_port = b.vif['id']
    try:
        stack.neutron('PUT', '/ports/' + b_port, {'port': {'security_groups': [closed['id']]}})
        # In: A cannot reach B; out: B still reaches A (and its answers come back).
        wait.until(lambda: not node_a.ping(a.netns, b.address, count=1, wait=1), 60,
                   'OVN to drop traffic into B', 0.1)
        assert not node_a.ping(a.netns, b.address, count=3, wait=1)
        assert node_b.ping(b.netns, a.address)
        # Out: B's egress rules gone, B reaches no one either.
        for rule in closed['security_group_rules']:
            stack.neutron('DELETE', '/security-group-rules/' + rule['id'])
        wait.until(lambda: not node_b.ping(b.netns, a.address, count=1, wait=1), 60,
                   'OVN to drop traffic out of B', 0.1)
        assert not node_b.ping(b.netns, a.address, count=3, wait=1)
        # And the rules' way back: ICMP in from the pods' subnet.
        stack.neutron('POST', '/security-group-rules', {'security_group_rule': {
            'security_group_id': closed['id'], 'project_id': stack.env['PROJECT'],
            'direction': 'ingress', 'ethertype': 'IPv4', 'protocol': 'icmp',
            'remote_ip_prefix': stack.env['POD_CIDR']}})
        wait.until(lambda: node_a.ping(a.netns, b.address, count=1, wait=1), 60,
                   'OVN to let ICMP into B', 0.1)
    finally:
        stack.neutron('PUT', '/ports/' + b_port,
                      {'port': {'security_groups': [stack.env['SECURITY_GROUP']]}})
        stack.neutron('DELETE', '/security-groups/' + closed['id'])


# 3. The seed's race with a real subport; a VLAN ID held by a device nobody recorded.

def test_late_dels_of_an_abandoned_sandbox_leave_the_new_one_connected(cluster, pods):
    node, peer_node = (cluster.nodes[name] for name in NODES[:2])
    peer = pods.start(peer_node)
    # A: the runtime gives up after 1 s, before kuryr-controller made the subport; the
    # controller is held meanwhile, since an idle one can make it within that second.
    cluster.stack.hold('kuryr-controller')
    try:
        pod = pods.create(node)
        abandoned = node.cni('add', pod, container_id='sandbox-a', shim_timeout=1)
    finally:
        cluster.stack.release('kuryr-controller')
    assert abandoned['output'].get('code') == 11, abandoned
    ns_a = pod.netns
    ns_b = 'ns-' + uuid.uuid4().hex[:8]
    node.sh('ip netns add %s && ip -n %s link set lo up' % (ns_b, ns_b))
    # The daemon went on with A: its VLAN device, in A's namespace.
    vlan_id = pod.wait_for_vif()['vlan_id']
    wait.until(lambda: node.vlan_devices().get(vlan_id) == (ns_a, 'eth0'), 120,
               'A to be plugged', 0.2)
    # B, the runtime's new sandbox of the same pod.
    pod.netns, pod.container_id = ns_b, 'sandbox-b'
    added = node.cni('add', pod)
    assert added['code'] == 0, (added, node.daemon_log())
    assert node.vlan_devices() == {vlan_id: (ns_b, 'eth0')}
    # A's late DELs: with its namespace, then the runtime's second one without.
    for netns in (ns_a, '-'):
        assert node.cni('del', pod, container_id='sandbox-a', netns=netns)['code'] == 0
    assert node.vlan_devices() == {vlan_id: (ns_b, 'eth0')}
    assert node.links(ns_b)['eth0']['address'] == cluster.stack.port(pod.vif['id'])[
        'mac_address']
    assert peer_node.ping(peer.netns, added['output']['ips'][0]['address'].split('/')[0])
    assert cluster.stack.port(pod.vif['id'])['status'] == 'ACTIVE'
    node.sh('ip netns del %s' % ns_a)


def test_a_vlan_id_held_by_an_unrecorded_device_fails_the_add_and_changes_nothing(
        cluster, pods):
    node = cluster.nodes[NODES[0]]
    pod = pods.create(node)
    vlan_id = pod.wait_for_vif()['vlan_id']
    # Upstream's bugs 1892388 and 1854928: a device the daemon has no record of (left by
    # a crashed daemon of another make, or made by hand) holds the subport's VLAN ID.
    squatter = 'squat%d' % vlan_id
    node.sh('ip link add link %s name %s type vlan id %d'
            % (nested.TRUNK_NIC, squatter, vlan_id))
    try:
        refused = node.cni('add', pod)
        assert refused['code'] != 0
        message = refused['output']['msg'] + refused['output'].get('details', '')
        assert 'VLAN %d on %s' % (vlan_id, nested.TRUNK_NIC) in message, refused
        # Nothing changed: the device is left alone, the pod has no eth0.
        assert node.vlan_devices() == {vlan_id: ('', squatter)}
        assert 'eth0' not in node.links(pod.netns)
    finally:
        node.sh('ip link del %s' % squatter)
    # Once it is gone, the runtime's retry succeeds.
    added = node.cni('add', pod)
    assert added['code'] == 0, (added, node.daemon_log())
    assert node.vlan_devices() == {vlan_id: (pod.netns, 'eth0')}


# 4. What kuryr-controller 10.0.0 writes for a nested pod, against the hand-written one.

def test_the_vlan_fixtures_are_what_kuryr_controller_writes(cluster, pods):
    node = cluster.nodes[NODES[0]]
    pod = pods.start(node)
    real = test_fixtures.recorded(cluster.stack.kuryrport(pod.name))
    if os.environ.get('OPENSTACK_RECORD_FIXTURES') == '1':
        with open(RECORDING, 'w') as f:
            json.dump(real, f, indent=2, sort_keys=True)
            f.write('\n')
    with open(RECORDING) as f:
        recording = json.load(f)
    assert test_fixtures.shape(real) == test_fixtures.shape(recording)
    vif = real['status']['vifs']['eth0']['vif']
    data = vif['versioned_object.data']
    assert (vif['versioned_object.name'], vif['versioned_object.version']) == \
        ('VIFVlanNested', '1.0')
    network = data['network']['versioned_object.data']
    [subnet] = network['subnets']['versioned_object.data']['objects']
    subnet = subnet['versioned_object.data']
    [ip] = subnet['ips']['versioned_object.data']['objects']
    # The hand-written one, shaped as this pod's network is (one IPv4 subnet, no routes),
    # field by field and version by version.
    # Only the subnets are replaced: the rest of vlan_vif's network is compared as it is.
    mine = fx.kuryrport('default', pod.name, node.name, pod.uid,
                        fx.status_vifs(fx.vlan_vif(active=True)))
    mine_network = mine['status']['vifs']['eth0']['vif']['versioned_object.data']['network']
    mine_network['versioned_object.data']['subnets'] = fx.listed('SubnetList', [fx.subnet(
        subnet['cidr'], [ip['versioned_object.data']['address']], gateway=subnet['gateway'])])
    assert test_fixtures.shape(mine) == test_fixtures.shape(real)
    mine_data = mine['status']['vifs']['eth0']['vif']['versioned_object.data']
    assert {k: v for k, v in data.items() if k in CONSTANT} == \
        {k: v for k, v in mine_data.items() if k in CONSTANT}
    assert data['vif_name'] == 'tap' + data['id'][:11]
    assert data['vlan_id'] == cluster.subports(node)[data['id']]


# Fields whose values are the same for every nested pod of an ML2/OVN cloud.
CONSTANT = ('active', 'has_traffic_filtering', 'plugin', 'preserve_on_delete')


# 5. Three nodes, one API server: each daemon's watch is its node's; what a node costs.

def test_each_daemon_watches_its_own_nodes_pods_only(cluster, pods):
    """Run last: it stops the daemons to measure the API server without them."""
    nodes = [cluster.nodes[name] for name in NODES]
    quiet = nodes[2]

    def events(node):       # of objects: bookmarks come to every watch
        return node.metric('kuryr_cni_watch_events_total', skip=('BOOKMARK',))

    before = {node.name: events(node) for node in nodes}
    for node in nodes[:2]:
        pods.start(node)
    after = {node.name: events(node) for node in nodes}
    # The busy nodes' watches saw their pods' KuryrPorts; the quiet node's saw nothing.
    assert after[quiet.name] == before[quiet.name], (before, after)
    for node in nodes[:2]:
        assert after[node.name] > before[node.name], (before, after)
        nested.TIMINGS.append(('%s: watch events for its one pod' % node.name,
                               after[node.name] - before[node.name]))
    # Every list and watch each daemon sent names its own node, none another's.
    requests = cluster.daemon_requests()
    for node in nodes:
        mine = [(verb, uri) for verb, uri in requests[cluster.guests.guests[node.name].address]
                if 'kuryrports' in uri]
        assert {verb for verb, _ in mine} >= {'list', 'watch'}, mine
        for _, uri in mine:
            assert node.name in uri and not any(other.name in uri for other in nodes
                                                if other is not node), uri
        nested.TIMINGS.append(('%s: requests to the API server so far' % node.name,
                               len(requests[cluster.guests.guests[node.name].address])))
    watchers = cluster.registered_watchers('KuryrPort')
    # kuryr-controller's own watch, and one per node.
    assert watchers == 1 + len(nodes), watchers
    for pod in list(pods.made):
        pods.made.remove(pod)
        assert pod.node.cni('del', pod)['code'] == 0
        pod.node.sh('ip netns del %s' % pod.netns)
        cluster.delete_pod(pod)
    # kube-apiserver's CPU, idle, with the three daemons' watches open and without them.
    with_daemons = _cpu_over(cluster, IDLE_WINDOW)
    for node in nodes:
        node.stop_daemon()
    wait.until(lambda: cluster.registered_watchers('KuryrPort') == 1, 60,
               'the daemons\' watches to end', 0.5)
    without = _cpu_over(cluster, IDLE_WINDOW)
    nested.TIMINGS.append(('kube-apiserver CPU s per s, idle, 3 daemons watching', with_daemons))
    nested.TIMINGS.append(('kube-apiserver CPU s per s, idle, no daemon', without))
    nested.TIMINGS.append(('kube-apiserver CPU ms per s per idle node',
                           1000 * (with_daemons - without) / len(nodes)))


def _cpu_over(cluster, seconds):
    """kube-apiserver's CPU seconds per second over the next ``seconds``."""
    used = cluster.apiserver_cpu_seconds()
    started = time.monotonic()
    time.sleep(seconds)         # a measurement window, not a wait for an event
    return (cluster.apiserver_cpu_seconds() - used) / (time.monotonic() - started)
