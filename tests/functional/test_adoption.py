"""Taking over pods kuryr-daemon plugged (issue 33 item 1), through the real shim and daemon.

Each test plants what kuryr-daemon 10.0.0 leaves for a pod
(:mod:`tests.functional.kuryr_daemon_plug`) before the daemon starts: for
``ovs`` and ``ovs-hybrid`` against a private Open vSwitch (userspace
datapath) whose ``br-int`` holds the gateway, for ``macvlan`` and ``vlan`` on
a trunk veth whose peer, in a router namespace, holds it (``vlan`` skips on
a kernel without 802.1Q: the vm tier runs it, see tests/vm/kernel_suite.py).
The start-up adoption identifies a sandbox by its process's cgroup: the
tests that need it run a process in the pod namespace inside a cgroup named
as containerd names a sandbox's (a throwaway subtree, removed after).
"""

import json
import os
import uuid

import pytest

from kuryr_cni import ctl
from kuryr_cni import vif as vif_model
from kuryr_cni.binding import owner_tag
from tools.testbed import host as testhost
from tools.testbed import ovs as testovs
from tools.testbed import runtime as testruntime

from tests import wait
from tests.functional import conftest
from tests.functional import crash
from tests.functional import helpers
from tests.functional import kuryr_daemon_plug

pytestmark = pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON)

POD = 'web-0'
POD_KEY = 'default/' + POD
MAC = 'fa:16:3e:00:00:07'
PORT_ID = '7d3c9a10-2f4e-4c3b-9a61-0d6f2b7e4a21'
VLAN_ID = 100
GATEWAY = '10.50.0.1'
ADDRESS = '10.50.0.7/24'
OVS_KINDS = ('ovs', 'ovs-hybrid')


class World:
    """The node's data path for one kind, the pod's VIF, and looks at what is plugged."""

    def __init__(self, node, kind):
        self.node = node
        self.kind = kind
        self.ovs = None
        self.uid = str(uuid.uuid4())
        if kind in OVS_KINDS:
            self.ovs = testovs.PrivateOVS(node.ns)
            self.ovs.add_bridge('br-int')
            testhost.ip('-n', node.ns, 'addr', 'add', GATEWAY + '/24', 'dev', 'br-int')
            testhost.ip('-n', node.ns, 'link', 'set', 'br-int', 'up')
            self.config = '\n[binding]\novsdb_connection = %s\n' % self.ovs.connection
        else:
            router = os.path.basename(node.pod_netns())      # removed with the node
            testhost.ip('-n', node.ns, 'link', 'add', 'trunk0', 'type', 'veth', 'peer',
                        'name', 'peer0', 'netns', router)
            testhost.ip('-n', node.ns, 'link', 'set', 'trunk0', 'up')
            testhost.ip('-n', router, 'link', 'set', 'peer0', 'up')
            device = 'peer0'
            if kind == 'vlan':
                device = 'peer0.%d' % VLAN_ID
                testhost.ip('-n', router, 'link', 'add', 'link', 'peer0', 'name', device,
                            'type', 'vlan', 'id', str(VLAN_ID))
            testhost.ip('-n', router, 'addr', 'add', GATEWAY + '/24', 'dev', device)
            testhost.ip('-n', router, 'link', 'set', device, 'up')
            self.config = '\n[binding]\nlink_iface = trunk0\n'

    def vif(self):
        vif = {'kind': self.kind, 'port_id': PORT_ID, 'mac': MAC, 'mtu': 1450,
               'ips': [ADDRESS], 'gateway': [GATEWAY], 'active': True}
        if self.kind == 'ovs':
            vif['bridge'] = 'br-int'
        if self.kind == 'ovs-hybrid':
            vif['bridge'] = vif_model.hybrid_device_name('qbr', PORT_ID)
            vif['integration_bridge'] = 'br-int'
        if self.kind == 'vlan':
            vif['vlan_id'] = VLAN_ID
        return vif

    def create_pod(self):
        self.node.api.create_pod('default', POD, testhost.NODE, uid=self.uid, annotations={
            'kuryr.openstack.org/vifs': json.dumps({'eth0': self.vif()})})

    def sandbox(self, letter):
        return testruntime.Sandbox('sandbox-%s-%s' % (letter, uuid.uuid4().hex[:40]),
                                   self.node.pod_netns(), POD, pod_uid=self.uid)

    def plant(self, sandbox, **overrides):
        """Plug ``sandbox`` as kuryr-daemon would (``overrides``: a device without proof)."""
        kuryr_daemon_plug.plug(self.node.ns, sandbox.netns, self.vif(), switch=self.ovs,
                               pod_uid=self.uid, **overrides)

    def start(self):
        self.node.start_daemon(workers=2, vif_timeout=5, extra=self.config)

    def kuryr_daemons(self):
        """What kuryr-daemon made for the port that exists: ``{name: ifindex}`` of host
        devices, plus ``ovs:<port>`` for each OVS port carrying the port's iface-id."""
        links = self.node.links()
        found = {name: links[name]['index'] for name in kuryr_daemon_plug.names(PORT_ID).values()
                 if name in links}
        for port in self.iface_id_ports():
            found['ovs:' + port] = 0
        return found

    def iface_id_ports(self):
        if self.ovs is None:
            return []
        rows = {port: self.ovs.interface(port) for port in self.ovs.ports('br-int')}
        return sorted(port for port, row in rows.items()    # None: removed meanwhile
                      if row and dict(row['external_ids'][1]).get('iface-id') == PORT_ID)

    def pod_end(self, sandbox):
        return self.node.links(sandbox.netns).get('eth0') if os.path.exists(sandbox.netns) \
            else None

    def pings(self, sandbox):
        return self.node.ping(sandbox.netns, GATEWAY)

    def close(self):
        if self.ovs is not None:
            self.ovs.close()


@pytest.fixture(params=['ovs', 'ovs-hybrid', 'macvlan', 'vlan'])
def world(request, node):
    yield from _world(request.param, node)


@pytest.fixture(params=sorted(OVS_KINDS))
def ovs_world(request, node):
    yield from _world(request.param, node)


def _world(kind, node):
    reason = testovs.missing() if kind in OVS_KINDS else helpers.kernel_lacks(kind)
    if reason:
        pytest.skip(reason)
    world = World(node, kind)
    try:
        yield world
    finally:
        node.stop_daemon()
        world.close()


def adoptions(node):
    status, entries = ctl.fetch(node.socket, '/v1/adoptions')
    assert status == 200, entries
    return entries


def adoption_count(node, result, reason):
    return helpers.metric(node, 'kuryr_cni_adoptions_total', result=result, reason=reason)


def _hex_sandbox(world):
    """A sandbox whose container ID is 64 hex digits, as containerd's are."""
    sandbox = world.sandbox('x')
    return testruntime.Sandbox(uuid.uuid4().hex + uuid.uuid4().hex, sandbox.netns, POD,
                               pod_uid=world.uid)


# -- the DEL of the sandbox kuryr-daemon plugged -------------------------------

def test_owner_del_removes_everything_kuryr_daemon_made(world, runtime):
    node = world.node
    world.create_pod()
    a = world.sandbox('a')
    world.plant(a)
    planted = world.kuryr_daemons()
    assert world.pod_end(a) is not None and world.pings(a)
    world.start()

    assert runtime.delete(a).ok
    assert world.kuryr_daemons() == {}, 'kuryr-daemon\'s devices are debris'
    assert world.pod_end(a) is None
    assert helpers.leftovers(node) == helpers.NOTHING
    adopted = [e for e in adoptions(node) if e['result'] == 'adopted']
    assert [(e['container_id'], e['kind']) for e in adopted] == [(a.container_id, world.kind)]
    assert adoption_count(node, 'adopted', 'proven') == 1
    assert len(planted) == {'ovs': 2, 'ovs-hybrid': 5}.get(world.kind, 0)


def test_stale_del_changes_nothing(world, runtime):
    node = world.node
    world.create_pod()
    a, z = world.sandbox('a'), world.sandbox('z')
    world.plant(a)
    planted, pod_end = world.kuryr_daemons(), world.pod_end(a)['index']
    world.start()

    assert runtime.delete(z).ok             # a DEL of another sandbox of the pod
    assert runtime.delete(z, netns='').ok   # and the runtime's second, without netns
    assert world.kuryr_daemons() == planted
    assert world.pod_end(a)['index'] == pod_end and world.pings(a)
    assert helpers.binding(node, POD_KEY) is None
    if world.kind in OVS_KINDS:
        left = [e for e in adoptions(node) if e['result'] == 'left']
        assert {e['reason'] for e in left} == {'pod_end_elsewhere'}, left

    assert runtime.delete(a).ok             # its own DEL still removes everything
    assert world.kuryr_daemons() == {} and world.pod_end(a) is None
    assert helpers.leftovers(node) == helpers.NOTHING


def test_new_sandbox_evicts_what_kuryr_daemon_plugged_ovs(ovs_world, runtime):
    # Nested devices are evicted once adopted: the start-up test shows it.
    world = ovs_world
    node = world.node
    world.create_pod()
    a, b = world.sandbox('a'), world.sandbox('b')
    world.plant(a)
    world.start()

    assert runtime.add(b).ok
    assert world.iface_id_ports() == [owner_tag.host_ifname(b.container_id, 'eth0')
                                      if world.kind == 'ovs'
                                      else vif_model.hybrid_device_name('qvo', PORT_ID)]
    assert world.pod_end(a) is None and world.pings(b)
    assert adoption_count(node, 'removed', 'evicted') == 1
    assert runtime.delete(a).ok             # late DEL of the old sandbox: stale
    assert world.pings(b)
    assert runtime.delete(b).ok
    assert world.kuryr_daemons() == {} and world.iface_id_ports() == []
    assert helpers.leftovers(node) == helpers.NOTHING


def test_a_queued_del_of_a_sandbox_kuryr_daemon_plugged_is_applied_once_pods_are_listed(
        ovs_world, runtime):
    """The shim queues the DEL while kuryr-cni is down. Replayed before the watcher's
    list, it has no VIF to prove kuryr-daemon's port with: it waits in the queue, and
    housekeeping applies it once the pods are listed. (The code before: replayed as a
    no-op and dropped, the port stayed on br-int.)"""
    world = ovs_world
    node = world.node
    world.create_pod()
    a = world.sandbox('a')
    world.plant(a)
    assert runtime.delete(a).ok             # no daemon: the shim queues it
    assert len(crash.queue_entries(node)) == 1
    world.start()

    wait.until(lambda: crash.queue_entries(node) == [], 30, 'the queued DEL to be applied')
    assert world.kuryr_daemons() == {}, "kuryr-daemon's devices of the deleted sandbox remain"
    assert world.pod_end(a) is None
    assert helpers.leftovers(node) == helpers.NOTHING
    assert helpers.metric(node, 'kuryr_cni_queued_del_replayed_total') == 1
    assert helpers.metric(node, 'kuryr_cni_queued_del_failures_total') == 0
    assert [(e['container_id'], e['result']) for e in adoptions(node)] == [
        (a.container_id, 'adopted')]


def test_a_del_before_the_pods_are_listed_fails_until_they_are_then_removes_everything(
        ovs_world, runtime):
    """kuryr-cni has just started and the API server does not answer yet: a DEL of a
    sandbox kuryr-daemon plugged cannot prove its devices, so it waits for the pods' list
    until its deadline and then fails (code 11), changing nothing; the runtime's retry,
    once the pods are listed, removes them all. (The code before: a no-op answered
    success, and the runtime, told the sandbox was gone, never sent another DEL: the
    port stayed on br-int.)"""
    world = ovs_world
    node = world.node
    world.create_pod()
    a = world.sandbox('a')
    world.plant(a)
    planted = world.kuryr_daemons()
    node.api.stop()
    node.start_daemon(workers=2, vif_timeout=5, wait=False,
                      extra=world.config + '\n[cni_daemon]\nrequest_timeout = 6\n')
    wait.until(lambda: os.path.exists(node.socket), 60, "the daemon's socket")

    refused = runtime.delete(a)
    assert not refused.ok and refused.error_code == 11, refused.output
    assert 'not listed yet' in refused.output['msg'], refused.output
    assert world.kuryr_daemons() == planted and world.pings(a)
    assert crash.queue_entries(node) == []

    node.api.start()
    wait.until(lambda: runtime.delete(a).ok, 90, 'a retried DEL to succeed')
    assert world.kuryr_daemons() == {}, "kuryr-daemon's devices of the deleted sandbox remain"
    assert world.pod_end(a) is None
    assert helpers.leftovers(node) == helpers.NOTHING


def test_an_add_naming_a_port_kuryr_daemon_plugged_for_another_pod_is_refused(
        ovs_world, runtime):
    """Pod web-1's annotation names web-0's port (hostile or mistaken) while kuryr-daemon's
    devices of web-0's VIF, not adopted yet, carry it: web-1's ADD is refused as if
    web-0's binding held the port, and web-0 keeps its traffic. (The code before plugged
    a second port of that iface-id, then adopted web-0's: two pods held one port.)"""
    world = ovs_world
    node = world.node
    world.create_pod()
    a = world.sandbox('a')                  # no sandbox process: the scan leaves it
    world.plant(a)
    planted = world.kuryr_daemons()
    uid = str(uuid.uuid4())
    borrowed = dict(world.vif(), mac='fa:16:3e:00:00:08', ips=['10.50.0.8/24'])
    node.api.create_pod('default', 'web-1', testhost.NODE, uid=uid, annotations={
        'kuryr.openstack.org/vifs': json.dumps({'eth0': borrowed})})
    b = testruntime.Sandbox('sandbox-b-%s' % uuid.uuid4().hex[:40], node.pod_netns(),
                            'web-1', pod_uid=uid)
    world.start()

    refused = runtime.add(b)
    assert not refused.ok and refused.error_code == 7, refused.output
    assert 'port %s bound to another pod' % PORT_ID in refused.output['msg'], refused.output
    assert world.kuryr_daemons() == planted and world.pings(a)
    assert helpers.binding(node, 'default/web-1') is None
    assert runtime.delete(b).ok
    assert runtime.delete(a).ok             # web-0's own DEL still removes everything
    assert world.kuryr_daemons() == {} and world.pod_end(a) is None
    assert helpers.leftovers(node) == helpers.NOTHING


# -- start-up adoption, traffic across it --------------------------------------

def test_startup_adopts_keeps_traffic_then_a_new_sandbox_evicts(world, runtime):
    node = world.node
    world.create_pod()
    a, b = _hex_sandbox(world), world.sandbox('b')
    world.plant(a)
    with helpers.sandbox_process(a, world.uid):
        wait.until(lambda: world.pings(a), 20, 'the planted pod to ping')
        pinger = helpers.Pinger(a.netns, GATEWAY)
        try:
            world.start()
            # Noted once recorded and tagged.
            wait.until(lambda: [e for e in adoptions(node) if e['result'] == 'adopted'], 30,
                       'the start-up adoption of %s' % a.container_id)
            binding = helpers.binding(node, POD_KEY)
            assert world.pings(a)
        finally:
            sent, lost = pinger.stop()
        print('ping across the daemon start and adoption (%s): %d sent, %d lost'
              % (world.kind, sent, lost))
        assert sent >= 10 and lost == 0
        assert binding['owner'] == a.container_id and binding['format'] == 4
        assert binding['sandboxes'][a.container_id]['netns'] == a.netns
        owner = owner_tag.alias(a.container_id, 'eth0')
        assert world.pod_end(a).get('ifalias') == owner

        assert runtime.add(b).ok            # a new sandbox of the pod evicts A's devices
        assert world.pod_end(a) is None and world.pings(b)
        assert kuryr_daemon_plug.names(PORT_ID)['tap'] not in world.kuryr_daemons()
        assert len(world.iface_id_ports()) == (1 if world.ovs else 0)
        assert runtime.delete(a).ok         # stale
        assert world.pings(b)
        assert runtime.delete(b).ok
    assert world.kuryr_daemons() == {}
    assert helpers.leftovers(node) == helpers.NOTHING


# -- no proof, no adoption -----------------------------------------------------

def _unproven(kind):
    if kind in OVS_KINDS:
        return {'attached_mac': 'fa:16:3e:00:00:99'}, 'attached_mac_mismatch'
    if kind == 'vlan':
        return {'vlan_id': VLAN_ID + 1}, 'vlan_id_mismatch'
    return {'mac': 'fa:16:3e:00:00:99'}, 'mac_mismatch'


def test_devices_without_proof_are_left_alone_and_reported(world, runtime):
    node = world.node
    world.create_pod()
    a = _hex_sandbox(world)
    overrides, reason = _unproven(world.kind)
    world.plant(a, **overrides)
    planted, pod_end = world.kuryr_daemons(), world.pod_end(a)['index']
    with helpers.sandbox_process(a, world.uid):
        world.start()
        found = wait.until(lambda: adoptions(node), 30, 'the start-up scan to report')
        assert [e['result'] for e in found] == ['left'], 'taken without proof: %s' % found
        assert found[0]['reason'] == reason, found
        assert runtime.delete(a).ok
        assert world.kuryr_daemons() == planted
        assert world.pod_end(a)['index'] == pod_end
        assert helpers.binding(node, POD_KEY) is None
        left = [e for e in adoptions(node) if e['result'] == 'left']
        assert left and {e['reason'] for e in left} == {reason}, left
        assert not [e for e in adoptions(node) if e['result'] != 'left']
        assert adoption_count(node, 'left', reason) >= 2   # the scan's, the DEL's
        text = _ctl_adoptions(node)
        assert reason in text and 'left' in text
    if world.ovs is not None:
        for port in world.iface_id_ports():
            world.ovs.vsctl('del-port', port)


def _ctl_adoptions(node):
    import io
    out = io.StringIO()
    assert ctl.main(['adoptions', '--socket', node.socket], out=out) in (0, None)
    return out.getvalue()


def test_an_adopted_sandbox_is_a_binding_across_restarts(world, runtime):
    """Adopted at start-up, then the daemon restarts: a stale DEL is rejected as for
    our own sandboxes, and the owner's DEL still removes everything."""
    node = world.node
    world.create_pod()
    a, z = _hex_sandbox(world), world.sandbox('z')
    world.plant(a)
    with helpers.sandbox_process(a, world.uid):
        world.start()
        wait.until(lambda: [e for e in adoptions(node) if e['result'] == 'adopted'], 30,
                   'the start-up adoption of %s' % a.container_id)
        planted = world.kuryr_daemons()
        node.stop_daemon()
        world.start()
        assert runtime.delete(z).ok
        assert helpers.stale_dels(node)['container_id_mismatch'] == 1
        assert world.kuryr_daemons() == planted and world.pings(a)
        assert not adoptions(node), 'adopted again after the restart'
        assert runtime.delete(a).ok
    assert world.kuryr_daemons() == {} and world.pod_end(a) is None
    assert helpers.leftovers(node) == helpers.NOTHING


def test_a_veth_pair_elsewhere_with_the_same_indexes_is_not_the_pod_end(ovs_world, runtime):
    """Interface indexes are per namespace: a namespace holding a veth whose index is
    the pod end's, peering an index that is the tap's (each pod's eth0 is index 2 or
    so), seen first by the scan, must not stand for the pod end (the openstack tier
    met one on a busy machine: the pod was left alone, ``mac_mismatch``)."""
    world = ovs_world
    node = world.node
    world.create_pod()
    a = _hex_sandbox(world)
    world.plant(a)
    tap = node.links()[kuryr_daemon_plug.names(PORT_ID)['tap']]['index']
    pod_end = world.pod_end(a)['index']
    decoy, decoy_host = node.pod_netns(), node.pod_netns()
    testhost.ip('-n', os.path.basename(decoy), 'link', 'add', 'eth0', 'index', str(pod_end),
                'type', 'veth', 'peer', 'name', 'decoy0', 'index', str(tap),
                'netns', os.path.basename(decoy_host))
    with helpers.sandbox_process(a, world.uid):
        world.start()
        found = wait.until(lambda: adoptions(node), 30, 'the start-up scan to report')
        assert [e['result'] for e in found] == ['adopted'], found
    assert runtime.delete(a).ok
    assert world.kuryr_daemons() == {} and world.pod_end(a) is None
    assert helpers.leftovers(node) == helpers.NOTHING
