"""A live kuryr-daemon 10.0.0 node taken over by kuryr-cni, and handed back (issue 33).

The real kuryr-daemon (tools/testbed/kuryr_daemon.py) plugs pods behind the
real kuryr-controller and Neutron/OVN; each pod's sandbox has a process in a
cgroup named as containerd names a sandbox's (the start-up adoption's proof
of which sandbox owns a namespace, :mod:`kuryr_cni.sandboxes`). One pod's OVS
row is then made to lie (its ``attached-mac`` another MAC), a device that
does not match the pod's VIF. The node is switched by the steps of
``doc/source/migration.rst`` (kuryr-daemon stops, the runtime's executable
becomes our shim, kuryr-cni starts on kuryr-daemon's own ``kuryr.conf``, a
file after it giving only the test's paths), while one pod pings another
every 0.1 s. Then, each step checked for an ``iface-id`` on two br-int
ports: what ``kuryr-cni-ctl adoptions`` lists; a stale DEL of an adopted
sandbox changes nothing; its own DEL removes everything kuryr-daemon made; a
new pod, a restart, deletes; kuryr-daemon started again after kuryr-cni (going
back), and what becomes of the pod kuryr-cni plugged; at the end nothing on
br-int or the node.
"""

import collections
import concurrent.futures
import io
import uuid

from kuryr_cni import ctl

from tests import wait
from tests.functional import helpers
from tests.openstack import conftest
from tests.openstack import steps
from tools.testbed import runtime as testruntime

LIE_MAC = 'fa:16:3e:de:ad:01'       # the attached-mac the planted mismatch claims
ADOPTED_WITHIN = 60


def _hex_id():
    return uuid.uuid4().hex + uuid.uuid4().hex


def _sandbox(node, pod, container_id=None):
    return testruntime.Sandbox(container_id or _hex_id(), node.pod_netns(),
                               pod['metadata']['name'], pod_uid=pod['metadata']['uid'])


def _tap(port_id):
    return 'tap' + port_id[:11]


def _address(stack, port_id):
    return stack.port(port_id)['fixed_ips'][0]['ip_address']


def _one_port_per_iface_id(stack, when):
    ports = stack.br_int_ports()
    counts = collections.Counter(ids.get('iface-id') for ids in ports.values())
    twice = {i: n for i, n in counts.items() if i and n > 1}
    assert not twice, 'an iface-id on two br-int ports %s: %s' % (when, ports)
    return ports


def _node_devices(stack_node):
    """Host devices of the node a CNI daemon makes for pods (kuryr-daemon's, ours)."""
    return sorted(name for name in stack_node.links()
                  if name.startswith(('tap', 'qbr', 'qvb', 'qvo', 'kc')))


def _tell_the_truth(stack):
    """Undo the planted lie: each row claiming LIE_MAC gets its Neutron port's MAC."""
    for name, ids in stack.br_int_ports().items():
        if ids.get('attached-mac') == LIE_MAC:
            mac = stack.port(ids['iface-id'])['mac_address']
            stack.vsctl('set', 'Interface', name, 'external_ids:attached-mac="%s"' % mac)


def _adoptions(node):
    status, entries = ctl.fetch(node.socket, '/v1/adoptions')
    assert status == 200, entries
    return entries


def _ctl_adoptions(node):
    out = io.StringIO()
    assert ctl.main(['adoptions', '--socket', node.socket], out=out) in (0, None)
    return out.getvalue()


class Swap:
    """The node's two CNI daemons and the runtime's two executables, one at a time."""

    def __init__(self, stack, kuryr, node, cache_dir):
        self.stack = stack
        self.kuryr = kuryr
        self.node = node
        self.old = conftest.kuryr_runtime(kuryr, cache_dir)
        self.new = conftest.Runtime(node.socket, node.state_dir, cache_dir,
                                    cni_version='1.0.0', shim=node.install_shim())
        # migration.rst: kuryr.conf as it is; after it, only what the test host moves
        # (socket, state, log, the node's own OVSDB instead of the tier's scratch one).
        self.config_files = [kuryr.conf, node.write_config(
            workers=2, vif_timeout=conftest.VIF_TIMEOUT,
            extra=stack.daemon_config(conftest.VIF_TIMEOUT))]

    def to_kuryr_cni(self):
        self.kuryr.stop()
        self.node.start_daemon(config_files=self.config_files)

    def to_kuryr_daemon(self):
        assert self.node.stop_daemon() == 0
        self.kuryr.start()


def test_takeover_of_a_live_kuryr_daemon_node(stack, kuryr, pod_host, pods, tmp_path,
                                              capsys):
    node = conftest.Node(stack)
    swap = Swap(stack, kuryr, node, str(tmp_path / 'cni-cache'))
    plugged_by_kuryr_daemon = []
    try:
        _takeover(stack, kuryr, node, pod_host, pods, swap, plugged_by_kuryr_daemon, capsys)
    finally:
        # Whatever failed: kuryr-cni DELs every sandbox, the adoption takes what it proves.
        _tell_the_truth(stack)
        if node.daemon is None or node.daemon.poll() is not None:
            kuryr.stop()
            node.start_daemon(config_files=swap.config_files)
        for sandbox in plugged_by_kuryr_daemon + swap.new.sandboxes:
            swap.new.delete(sandbox)
        node.stop_daemon()
        node.close()


def _takeover(stack, kuryr, node, pod_host, pods, swap, plugged, capsys):
    # Three pods plugged by kuryr-daemon: A pings B across the swap, C's row is made to lie.
    made = [pods() for _ in range(3)]
    sandboxes = [_sandbox(pod_host, pod) for pod in made]
    plugged.extend(sandboxes)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        outcomes = list(pool.map(swap.old.add, sandboxes))
    for outcome in outcomes:
        assert outcome.ok, (outcome.output, kuryr.log_tail())
    a, b, c = sandboxes
    port = {s.container_id: stack.ports_of(s.pod_uid)[0]['id'] for s in sandboxes}
    for sandbox in sandboxes:
        stack.wait_for_status(port[sandbox.container_id], 'ACTIVE')
    ports = _one_port_per_iface_id(stack, 'after kuryr-daemon plugged')
    assert sorted(ports) == sorted(_tap(p) for p in port.values())
    stack.vsctl('set', 'Interface', _tap(port[c.container_id]),
                'external_ids:attached-mac="%s"' % LIE_MAC)
    address_b = _address(stack, port[b.container_id])

    with helpers.sandbox_process(a, a.pod_uid), helpers.sandbox_process(b, b.pod_uid), \
            helpers.sandbox_process(c, c.pod_uid):
        wait.until(lambda: pod_host.ping(a.netns, address_b), 30, 'A to reach B', 0.1)
        pinger = helpers.Pinger(a.netns, address_b)
        try:
            swap.to_kuryr_cni()
            # The scan's findings, one per pod: A's and B's adopted, C's left alone.
            wait.until(lambda: len(_adoptions(node)) >= 3, ADOPTED_WITHIN,
                       'the start-up scan of A, B and C', 0.1)
            _one_port_per_iface_id(stack, 'after the start-up adoption')
            assert pod_host.ping(a.netns, address_b)
        finally:
            sent, lost = pinger.stop()
    found = _adoptions(node)
    adopted = sorted(e['container_id'] for e in found if e['result'] == 'adopted')
    left = [e for e in found if e['result'] == 'left']
    with capsys.disabled():
        print('\ntakeover: ping A->B every 0.1 s across the swap: %d sent, %d lost; '
              'adopted %d sandboxes, left %d findings (%s)'
              % (sent, lost, len(adopted), len(left),
                 ', '.join(sorted({e['reason'] for e in left}))))
    conftest.record('takeover: pings lost across the swap (of %d)' % sent, lost)
    assert sent >= 10 and lost == 0, (sent, lost)
    assert adopted == sorted([a.container_id, b.container_id]), found
    assert [(e['pod'].split('/')[1], e['reason']) for e in left] == \
        [(c.pod_name, 'attached_mac_mismatch')], found
    text = _ctl_adoptions(node)
    for sandbox in (a, b):
        assert sandbox.container_id[:20] in text and sandbox.pod_name in text
    assert 'attached_mac_mismatch' in text and c.pod_name in text

    # A stale DEL of A (another sandbox of its pod, with and without a namespace).
    before = stack.br_int_ports(), _node_devices(pod_host)
    stale = _sandbox(pod_host, {'metadata': {'name': a.pod_name, 'uid': a.pod_uid}})
    assert swap.new.delete(stale).ok and swap.new.delete(stale, netns='').ok
    assert (stack.br_int_ports(), _node_devices(pod_host)) == before
    assert pod_host.ping(a.netns, address_b)

    # A's own DEL removes everything kuryr-daemon made for it; again, nothing changes.
    tap_a = _tap(port[a.container_id])
    assert swap.new.delete(a).ok
    assert tap_a not in stack.br_int_ports(), 'kuryr-daemon\'s OVS port is debris'
    assert tap_a not in _node_devices(pod_host)
    assert 'eth0' not in pod_host.links(a.netns)
    after = _one_port_per_iface_id(stack, 'after A\'s DEL'), _node_devices(pod_host)
    assert swap.new.delete(a).ok
    assert (stack.br_int_ports(), _node_devices(pod_host)) == after

    # C's lying row is left alone by its DEL, and reported; told the truth, the next
    # DEL of the sandbox removes it (the planted lie was the test's own).
    tap_c = _tap(port[c.container_id])
    assert swap.new.delete(c).ok
    assert tap_c in stack.br_int_ports() and tap_c in _node_devices(pod_host)
    assert [e['reason'] for e in _adoptions(node) if e['result'] == 'left'
            and e['container_id'] == c.container_id] == ['attached_mac_mismatch']
    _tell_the_truth(stack)
    assert swap.new.delete(c).ok
    assert tap_c not in stack.br_int_ports() and tap_c not in _node_devices(pod_host)

    # A new pod, plugged by kuryr-cni, reaches B (adopted) and the other way round.
    d = steps.start_pod(stack, pod_host, swap.new, pods)
    assert d.outcome.ok, (d.outcome.output, node.log_tail())
    address_d = _address(stack, d.port_id)
    assert pod_host.ping(b.netns, address_d, count=2, wait=5)
    assert pod_host.ping(d.sandbox.netns, address_b, count=2, wait=5)
    _one_port_per_iface_id(stack, 'after a new pod')

    # A kuryr-cni restart: the adopted B is a binding like D; nothing is adopted again.
    assert node.stop_daemon() == 0
    node.start_daemon(config_files=swap.config_files)
    assert pod_host.ping(b.netns, address_d, count=2, wait=5)
    assert not _adoptions(node), 'adopted again after the restart'
    _one_port_per_iface_id(stack, 'after a restart')

    _going_back(stack, kuryr, node, pod_host, pods, swap, b, d, address_b)
    assert stack.br_int_ports() == {}
    assert _node_devices(pod_host) == []
    assert helpers.leftovers(node) == helpers.NOTHING


def _going_back(stack, kuryr, node, pod_host, pods, swap, b, d, address_b):
    """kuryr-daemon started again after kuryr-cni: D (kuryr-cni's) and B (adopted) keep
    working; a new pod E is plugged by it; the DELs of D, B, E come to kuryr-daemon;
    then kuryr-cni again."""
    ports_before = stack.br_int_ports()
    swap.to_kuryr_daemon()
    assert pod_host.ping(d.sandbox.netns, address_b, count=2, wait=5)
    e = steps.start_pod(stack, pod_host, swap.old, pods)
    assert e.outcome.ok, (e.outcome.output, kuryr.log_tail())
    _one_port_per_iface_id(stack, 'after going back, a new pod')
    assert pod_host.ping(e.sandbox.netns, address_b, count=2, wait=5)
    for sandbox in (b, d.sandbox, e.sandbox):
        assert swap.old.delete(sandbox).ok, kuryr.log_tail()
        pod_host.remove_netns(sandbox.netns)        # as a runtime does after the DEL
    left = stack.br_int_ports()
    print('going back: br-int before %s, after kuryr-daemon\'s DELs %s'
          % (sorted(ports_before), sorted(left)))
    # Its DEL of the pod kuryr-cni plugged removed `tap<port>`, which is not there:
    # kuryr-cni's port stays, tagged; B (adopted, kuryr-daemon's names) and E went.
    assert [(ids['iface-id'], 'kuryr-cni-owner' in ids) for ids in left.values()] == \
        [(d.port_id, True)], left
    # Forward again: kuryr-cni applies the DEL its record's sandbox never got (its
    # namespace is gone), unasked.
    swap.to_kuryr_cni()
    wait.until(lambda: stack.br_int_ports() == {}, 30,
               'kuryr-cni to remove the port of the sandbox kuryr-daemon DELed', 0.1)
