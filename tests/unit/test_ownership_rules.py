"""The ownership rules of DESIGN §3, as a table: every command against every situation.

ADD, DEL, CHECK and GC × the request's sandbox being the owner, another
sandbox, or unknown × the same or another pod UID × the owner settled or its
ADD still in flight × before or after a daemon restart. Each case runs real
requests through the daemon's CNI API (:class:`kuryr_cni.daemon.api.CNIApp`)
against a real registry Manager, real binding files and real pod locks; the
kernel is the recording stand-in of the rules' port (tests/unit/
recording_kernel.py), so the table runs without root. Each case asserts the
answer, exactly which devices were created or removed, which metrics moved,
and who owns the pod afterwards. The real kernel's side of the same rules is
in tests/functional (test_sandbox_race, test_bridge, test_faults).

Metrics: the counters are moved through :mod:`kuryr_cni.metrics`' functions,
which the ``moved`` fixture records instead of exporting (their Prometheus
side is tested in tests/unit/test_monitoring.py and the functional tests).
"""

import collections
import concurrent.futures
import contextlib
import dataclasses
import json
import os
import threading
import time

import pytest

from kuryr_cni import errors
from kuryr_cni import metrics
from kuryr_cni import ownership as ownership_mod
from kuryr_cni import podlock
from kuryr_cni import registry as registry_mod
from kuryr_cni import state
from kuryr_cni import vif as vif_model
from kuryr_cni.daemon import api
from kuryr_cni.daemon import housekeeping
from kuryr_cni.daemon import recovery
from tests import wait
from tests.unit import recording_kernel

NETWORK = 'kuryr'
NAMESPACE, NAME = 'default', 'web-0'
POD = '%s/%s' % (NAMESPACE, NAME)
UID1, UID2 = 'uid-1', 'uid-2'
PATHS = {command: path for path, command in api.ROUTES.items()}


class WorkerKilled(BaseException):
    """Raised from inside a plug: the worker dies there (nothing of it catches this)."""


def bridge_vif(active=True):
    return vif_model.parse_vif({'kind': 'bridge', 'port_id': 'port-5', 'bridge': 'br0',
                                'mac': 'fa:16:3e:00:00:05', 'ips': ['10.0.0.5/24'],
                                'gateway': '10.0.0.1', 'active': active}).to_dict()


IN_FLIGHT_VIF_TIMEOUT = 60     # seconds; see World.start_add


class World:
    """One node: the daemon's rules behind its CNI API, one pod, sandboxes named by letter."""

    def __init__(self, tmp_path, kernel):
        self.state_dir = str(tmp_path / 'state')
        self.kernel = kernel
        self.managers = []
        self.pod_record = None
        self.results = {}               # container ID -> its ADD's result (prevResult)
        self.pool = concurrent.futures.ThreadPoolExecutor(4)
        self.in_flight = {}             # container ID -> future of its ADD
        self._start()

    def _start(self):
        manager, self.registry = registry_mod.Registry.start(
            title='kuryr-cni-daemon: registry (test)')
        self.managers.append(manager)
        self.ownership = ownership_mod.Ownership(
            registry=self.registry, store=state.BindingStore(self.state_dir),
            locks=podlock.PodLocks(state.ensure_dir(self.state_dir + '/locks')),
            kernel=self.kernel, vif_timeout=3)
        self.app = api.CNIApp(self.ownership, self.registry, request_timeout=30)
        if self.pod_record is not None:
            self.registry.put_pod(POD, self.pod_record)

    def close(self):
        self.activate()
        self.pool.shutdown(wait=True)
        for manager in self.managers:
            manager.shutdown()

    # The watcher's side ------------------------------------------------------------

    def publish(self, uid=UID1, active=True):
        self.pod_record = {'uid': uid, 'vifs': {'eth0': bridge_vif(active)}, 'error': None,
                           'deleting': False}
        self.registry.put_pod(POD, self.pod_record)

    def activate(self):
        if self.pod_record is not None:
            self.publish(self.pod_record['uid'], active=True)

    # The runtime's side ----------------------------------------------------------

    def request(self, command, cid, uid=UID1, netns=None, pod=True, valid=None):
        """Send one CNI request; returns ``'ok'`` or the CNI error code."""
        args = ['IgnoreUnknown=1']
        if pod:
            args += ['K8S_POD_NAMESPACE=%s' % NAMESPACE, 'K8S_POD_NAME=%s' % NAME]
            if uid:
                args.append('K8S_POD_UID=%s' % uid)
        config = {'cniVersion': '1.1.0', 'name': NETWORK, 'type': 'kuryr-cni'}
        if netns is None:
            netns = self.netns(cid) if command in ('ADD', 'DEL', 'CHECK') else ''
        if command == 'CHECK':
            # What the runtime cached from the ADD; one it never got answered, made up.
            config['prevResult'] = self.results.get(cid) or {
                'cniVersion': '1.1.0', 'interfaces': [{'name': 'eth0', 'sandbox': netns}],
                'ips': [{'address': '10.0.0.5/24', 'interface': 0}]}
        if valid is not None:
            config['cni.dev/valid-attachments'] = [{'containerID': c, 'ifname': 'eth0'}
                                                   for c in valid]
        body = {'CNI_COMMAND': command, 'CNI_CONTAINERID': cid if command != 'GC' else '',
                'CNI_NETNS': netns, 'CNI_IFNAME': 'eth0' if command != 'GC' else '',
                'CNI_ARGS': ';'.join(args), 'CNI_PATH': '/opt/cni/bin', 'config': config}
        status, payload = self.app.handle(PATHS[command], json.dumps(body).encode())
        if status == 200 and command == 'ADD':
            self.results[cid] = json.loads(payload)
        return 'ok' if status in (200, 204) else json.loads(payload)['code']

    def netns(self, cid):
        path = '/run/netns/' + cid
        if path not in self.kernel.namespaces:
            self.kernel.add_netns(path)
        return path

    def start_add(self, cid, uid=UID1):
        """An ADD that has claimed the pod, plugged, and waits for its VIFs to be active.

        activate() lets it go.
        """
        self.publish(uid, active=False)
        # Waiting is what it must still be doing when the case's request comes: a
        # loaded machine once took longer than the 3 s vif_timeout between here and
        # there, and the ADD timed out on its own (counted, answered) first. The
        # request's deadline (30 s) still bounds it.
        self.ownership.vif_timeout = IN_FLIGHT_VIF_TIMEOUT
        self.in_flight[cid] = self.pool.submit(self.request, 'ADD', cid, uid)
        wait.until(lambda: self.owner() == cid and cid in self.registry.bindings.adds_since(0),
                   what='the ADD of %s to claim the pod' % cid)
        # Claimed: its evictions (devices, metrics) happen under the pod's lock,
        # which it lets go only to wait for its VIFs.
        with self.ownership.locks.hold(POD, time.monotonic() + 10):
            pass

    def add_beside_in_flight(self, cid, **opts):
        """An ADD sent while another waits for active VIFs: it claims and plugs, then they
        turn active."""
        future = self.pool.submit(self.request, 'ADD', cid, **opts)
        # Claimed as the waiting ADD sees it: the registry's summary, which follows the
        # record on disk (an ADD that sees its VIFs active before then answers first).
        wait.until(lambda: self.registry_owner() == cid,
                   what='the ADD of %s to claim the pod' % cid)
        self.activate()
        return future.result(timeout=30)

    def finish(self, cid):
        """Let the in-flight ADD of ``cid`` go on; return its answer."""
        self.activate()
        return self.in_flight.pop(cid).result(timeout=30)

    # What the daemon knows ---------------------------------------------------------

    def owner(self):
        binding = self.ownership.store.load(POD)
        return binding.owner if binding else None

    def registry_owner(self):
        summary, _ = self.registry.bindings.summary_and_record(POD)
        return summary.owner if summary else None

    def restart(self):
        """The daemon restarts: a new registry, recovery from the state dir."""
        self.managers.pop().shutdown()
        self._start()
        recovery.restore(self.ownership, state.DelQueue(self.state_dir),
                         self.ownership.locks.directory)

    def crash_mid_plug(self, cid):
        """The worker serving the ADD of ``cid`` dies after creating its devices."""
        self.kernel.fail_connect = WorkerKilled()
        with pytest.raises(WorkerKilled):
            self.request('ADD', cid)

    def vanish(self, cid):
        """Someone deletes the pod end of ``cid``'s interface behind the daemon's back."""
        del self.kernel.namespaces[self.netns(cid)]['eth0']

    def lose_record(self):
        """The pod's binding file is lost (set aside after a crash, or wiped)."""
        self.ownership.store.remove(POD)

    def effects(self):
        """What changed in the kernel since the last call, in words."""
        words = []
        for verb, where, *rest in self.kernel.take_effects():
            cid = rest[-1] if where == 'pod' else rest[0]
            words.append('%s %s %s' % (verb, where, cid))
        return words


@pytest.fixture
def moved(monkeypatch):
    """The metrics the daemon moved, as ``(metric, labels...)`` tuples."""
    seen = []
    monkeypatch.setattr(metrics, 'observe_request',
                        lambda command, result, seconds: seen.append(('requests', command,
                                                                      result)))
    monkeypatch.setattr(metrics, 'stale_del_rejected',
                        lambda reason: seen.append(('stale_del', reason)))
    monkeypatch.setattr(metrics, 'sandbox_evicted', lambda: seen.append(('evictions',)))
    monkeypatch.setattr(metrics, 'vif_waited', lambda seconds: None)
    return seen


@pytest.fixture
def world(tmp_path, kernel):
    w = World(tmp_path, kernel)
    w.publish()
    yield w
    w.close()


@dataclasses.dataclass
class Case:
    name: str
    given: list            # steps: (verb, container ID, options)
    when: tuple            # (command, container ID, options)
    answer: object         # 'ok' or the CNI error code
    effects: list          # what the request changed in the kernel
    moved: list            # the metrics it moved besides requests_total
    owner: str | None      # who owns the pod afterwards
    result: str = None     # the DEL/GC outcome counted in requests_total (default by answer)
    then_in_flight: tuple = ()     # (container ID, its ADD's final answer)


def _given(world, steps):
    for verb, cid, opts in steps:
        if verb == 'add':
            assert world.request('ADD', cid, **opts) == 'ok', (verb, cid)
        elif verb == 'del':
            assert world.request('DEL', cid, **opts) == 'ok', (verb, cid)
        elif verb == 'publish':
            world.publish(**opts)
        elif verb == 'start_add':
            world.start_add(cid, **opts)
        elif verb == 'restart':
            world.restart()
        elif verb == 'lose_record':
            world.lose_record()
        elif verb == 'delete_netns':
            world.kernel.delete_netns(world.netns(cid))
        elif verb == 'netns':
            world.netns(cid)
        elif verb == 'crash_mid_plug':
            world.crash_mid_plug(cid)
        elif verb == 'vanish':
            world.vanish(cid)
        else:
            raise AssertionError('unknown step %s' % verb)


def step(verb, cid=None, **opts):
    return (verb, cid, opts)


HOST_A = ['remove host A', 'remove pod A']
MAKE_A = ['create pod A', 'create host A']
MAKE_B = ['create pod B', 'create host B']

CASES = [
    # ADD ----------------------------------------------------------------------
    Case('add/none', [], ('ADD', 'A', {}), 'ok', MAKE_A, [], 'A'),
    Case('add/owner-settled-retry-converges', [step('add', 'A')], ('ADD', 'A', {}), 'ok',
         HOST_A + MAKE_A, [], 'A'),
    Case('add/other-settled-same-uid-evicts', [step('add', 'A')], ('ADD', 'B', {}), 'ok',
         HOST_A + MAKE_B, [('evictions',)], 'B'),
    Case('add/other-settled-new-uid-evicts',
         [step('add', 'A'), step('publish', uid=UID2)], ('ADD', 'B', {'uid': UID2}), 'ok',
         HOST_A + MAKE_B, [('evictions',)], 'B'),
    Case('add/uid-the-watcher-does-not-show-times-out',
         [step('add', 'A')], ('ADD', 'B', {'uid': UID2}), 11, [], [], 'A'),
    Case('add/killed-mid-plug-retry-after-restart-converges',
         [step('crash_mid_plug', 'A'), step('restart')], ('ADD', 'A', {}), 'ok',
         HOST_A + MAKE_A, [], 'A'),
    Case('add/other-in-flight-is-replaced',
         # A fails as soon as it sees B own the pod, not at its timeout.
         [step('start_add', 'A')], ('ADD', 'B', {}), 'ok', HOST_A + MAKE_B,
         [('evictions',), ('requests', 'ADD', 'error')], 'B',
         then_in_flight=('A', 11)),
    Case('add/owner-after-restart-evicts-by-record',
         [step('add', 'A'), step('restart')], ('ADD', 'B', {}), 'ok', HOST_A + MAKE_B,
         [('evictions',)], 'B'),
    Case('add/owner-in-another-netns-is-refused', [step('add', 'A'), step('netns', 'B')],
         ('ADD', 'A', {'netns': '/run/netns/B'}), 4, [], [], 'A'),
    Case('add/record-lost-retry-converges', [step('add', 'A'), step('lose_record')],
         ('ADD', 'A', {}), 'ok', HOST_A + MAKE_A, [], 'A'),
    # DEL ----------------------------------------------------------------------
    Case('del/owner-settled', [step('add', 'A')], ('DEL', 'A', {}), 'ok', HOST_A, [], None,
         result='success'),
    Case('del/owner-second-del-without-netns', [step('add', 'A')],
         ('DEL', 'A', {'netns': ''}), 'ok', HOST_A, [], None, result='success'),
    Case('del/owner-repeated-is-noop', [step('add', 'A'), step('del', 'A')],
         ('DEL', 'A', {}), 'ok', [], [], None, result='noop'),
    Case('del/owner-without-pod-identity', [step('add', 'A')],
         ('DEL', 'A', {'pod': False}), 'ok', HOST_A, [], None, result='success'),
    Case('del/owner-without-pod-identity-after-restart', [step('add', 'A'), step('restart')],
         ('DEL', 'A', {'pod': False}), 'ok', HOST_A, [], None, result='success'),
    Case('del/owner-after-its-netns-went', [step('add', 'A'), step('delete_netns', 'A')],
         ('DEL', 'A', {'netns': ''}), 'ok', [], [], None, result='success'),
    Case('del/owner-killed-mid-plug-after-restart',
         [step('crash_mid_plug', 'A'), step('restart')], ('DEL', 'A', {}), 'ok', HOST_A, [],
         None, result='success'),
    Case('del/owner-in-flight', [step('start_add', 'A')], ('DEL', 'A', {}), 'ok', HOST_A,
         [('requests', 'ADD', 'error')], None, result='success', then_in_flight=('A', 11)),
    Case('del/other-settled-same-uid-is-stale', [step('add', 'A'), step('add', 'B')],
         ('DEL', 'A', {}), 'ok', [], [('stale_del', 'container_id_mismatch')], 'B',
         result='stale'),
    Case('del/other-settled-other-uid-is-stale',
         [step('add', 'A'), step('publish', uid=UID2), step('add', 'B', uid=UID2)],
         ('DEL', 'A', {}), 'ok', [], [('stale_del', 'pod_uid_mismatch')], 'B',
         result='stale'),
    Case('del/other-in-flight-is-stale', [step('add', 'A'), step('start_add', 'B')],
         ('DEL', 'A', {}), 'ok', [], [('stale_del', 'container_id_mismatch')], 'B',
         result='stale', then_in_flight=('B', 'ok')),
    Case('del/other-after-restart-is-stale',
         [step('add', 'A'), step('add', 'B'), step('restart')],
         ('DEL', 'A', {}), 'ok', [], [('stale_del', 'container_id_mismatch')], 'B',
         result='stale'),
    Case('del/unknown-is-noop', [], ('DEL', 'A', {}), 'ok', [], [], None, result='noop'),
    Case('del/unknown-while-another-owns-is-stale', [step('add', 'B')], ('DEL', 'A', {}),
         'ok', [], [('stale_del', 'container_id_mismatch')], 'B', result='stale'),
    Case('del/record-lost-removes-only-its-tagged-devices',
         [step('add', 'A'), step('lose_record')], ('DEL', 'A', {}), 'ok', HOST_A, [], None,
         result='noop'),
    Case('del/record-lost-other-sandbox-untouched',
         [step('add', 'A'), step('lose_record')], ('DEL', 'B', {}), 'ok', [], [], None,
         result='noop'),
    # CHECK --------------------------------------------------------------------
    Case('check/owner-settled', [step('add', 'A')], ('CHECK', 'A', {}), 'ok', [], [], 'A',
         result='success'),
    Case('check/owner-after-restart', [step('add', 'A'), step('restart')],
         ('CHECK', 'A', {}), 'ok', [], [], 'A', result='success'),
    Case('check/owner-whose-interface-went', [step('add', 'A'), step('vanish', 'A')],
         ('CHECK', 'A', {}), 100, [], [], 'A'),
    Case('check/owner-killed-mid-plug-after-restart',
         [step('crash_mid_plug', 'A'), step('restart')], ('CHECK', 'A', {}), 100, [], [], 'A'),
    Case('check/other-settled-is-unknown', [step('add', 'A'), step('add', 'B')],
         ('CHECK', 'A', {}), 3, [], [], 'B'),
    Case('check/unknown', [], ('CHECK', 'A', {}), 3, [], [], None),
    # GC -----------------------------------------------------------------------
    Case('gc/owner-settled-not-valid-is-collected', [step('add', 'A')],
         ('GC', None, {'valid': []}), 'ok', HOST_A, [], None, result='success'),
    Case('gc/owner-settled-valid-is-kept', [step('add', 'A')],
         ('GC', None, {'valid': ['A']}), 'ok', [], [], 'A', result='success'),
    Case('gc/owner-retry-in-flight-is-spared', [step('add', 'A'), step('start_add', 'A')],
         ('GC', None, {'valid': []}), 'ok', [], [], 'A', result='success',
         then_in_flight=('A', 'ok')),
    Case('gc/stale-other-sandbox-in-flight-owner-kept',
         [step('add', 'A'), step('start_add', 'B')], ('GC', None, {'valid': []}), 'ok', [],
         [], 'B', result='success', then_in_flight=('B', 'ok')),
    Case('gc/owner-after-restart-is-collected', [step('add', 'A'), step('restart')],
         ('GC', None, {'valid': []}), 'ok', HOST_A, [], None, result='success'),
    Case('gc/owner-of-another-network-is-kept', [step('add', 'A')],
         ('GC', None, {'valid': None}), 'ok', [], [], 'A', result='noop'),
]


@pytest.mark.parametrize('case', CASES, ids=[c.name for c in CASES])
def test_rule(world, moved, case):
    _given(world, case.given)
    world.effects()
    moved.clear()
    command, cid, opts = case.when
    if command == 'ADD' and world.in_flight:
        answer = world.add_beside_in_flight(cid, **opts)
    else:
        answer = world.request(command, cid, **opts)
    assert answer == case.answer
    assert world.effects() == case.effects
    result = case.result or ('success' if answer == 'ok' else 'error')
    # A multiset: an in-flight ADD that fails meanwhile is counted when its next poll
    # (up to 0.1 s after the answer above) sees it.
    expected = collections.Counter(case.moved + [('requests', command, result)])
    if case.then_in_flight:
        with contextlib.suppress(AssertionError):      # the assertion below says what differs
            wait.until(lambda: collections.Counter(moved) == expected, 5, 'the counters')
    assert collections.Counter(moved) == expected
    if case.then_in_flight:
        in_flight, final = case.then_in_flight
        assert world.finish(in_flight) == final
    assert world.owner() == case.owner


def test_an_older_add_still_waiting_for_the_vifs_never_takes_the_pod_from_a_newer_one(world):
    """ADD A (abandoned by the runtime) and ADD B both wait for the VIFs; whichever then
    gets the pod's lock first, B owns the pod and A is told to try again."""
    world.registry.drop_pod(POD)            # no VIFs published yet
    a = world.pool.submit(world.request, 'ADD', 'A')
    wait.until(lambda: 'A' in world.registry.bindings.adds_since(0), what='ADD A in flight')
    b = world.pool.submit(world.request, 'ADD', 'B')
    wait.until(lambda: 'B' in world.registry.bindings.adds_since(0), what='ADD B in flight')
    world.publish(active=True)
    assert (a.result(timeout=30), b.result(timeout=30)) == (11, 'ok')
    assert world.owner() == 'B'
    assert world.effects() == MAKE_B


def test_the_record_before_the_devices_is_durable_and_the_completed_one_is_not(
        world, monkeypatch):
    """A plugging record reaches the disk before any device exists, so whatever
    happens next finds what to remove; the record that the ADD completed is written
    atomically but not fsynced (``Ownership._plug`` says why)."""
    writes = []
    write = state.write_atomically

    def recording(directory, name, data, durable=True):
        write(directory, name, data, durable)
        attachment = json.loads(data)['sandboxes']['A']['attachments']['kuryr/eth0']
        writes.append((attachment['state'], durable, world.effects()))
    monkeypatch.setattr(state, 'write_atomically', recording)
    assert world.request('ADD', 'A') == 'ok'
    assert writes == [('plugging', True, []), ('ready', False, MAKE_A)]
    assert world.ownership.store.load(POD).sandboxes['A'].attachments[
        ('kuryr', 'eth0')].state == 'ready'


def test_the_plug_does_not_count_against_the_wait_for_active_vifs(world, monkeypatch):
    """vif_timeout (3 s here) bounds the ADD's waits, not its plug: a plug that takes
    2 s, then a port active 1.5 s later, 3.5 s after the ADD began, is a success."""
    connect = world.kernel.connect

    def slow(vif, plug):
        time.sleep(2)       # a node busy starting pods: the rtnl lock, the disk
        connect(vif, plug)
    monkeypatch.setattr(world.kernel, 'connect', slow)
    world.publish(active=False)
    started = time.monotonic()
    add = world.pool.submit(world.request, 'ADD', 'A')
    wait.until(lambda: world.kernel.plugged, what='the plug to end')
    activate = threading.Timer(1.5, world.activate)
    activate.start()
    try:
        assert add.result(timeout=30) == 'ok'
    finally:
        activate.join()
    assert time.monotonic() - started > world.ownership.vif_timeout


def test_the_two_waits_share_the_vif_timeout(world):
    """VIFs published 2 s into an ADD (vif_timeout 3 s) and never active: it fails
    with code 11 once it has waited 3 s in all, plugged for the runtime's DEL."""
    world.registry.drop_pod(POD)
    started = time.monotonic()
    add = world.pool.submit(world.request, 'ADD', 'A')
    wait.until(lambda: 'A' in world.registry.bindings.adds_since(0), what='ADD A in flight')
    publish = threading.Timer(2, world.publish, kwargs={'active': False})
    publish.start()
    try:
        assert add.result(timeout=30) == 11
    finally:
        publish.join()
    took = time.monotonic() - started
    assert world.ownership.vif_timeout <= took < world.ownership.vif_timeout + 1.5
    assert world.effects() == MAKE_A


def test_a_del_of_a_deleting_pods_sandbox_ends_its_wait_for_active_vifs_at_once(world):
    """kubelet deletes a pod whose ADD waits for its VIFs to be active, and DELs the
    sandbox: the ADD fails then (code 11), not when vif_timeout (3 s) runs out."""
    world.start_add('A')
    world.effects()
    world.registry.put_pod(POD, dict(world.pod_record, deleting=True))
    deleted = time.monotonic()
    assert world.request('DEL', 'A') == 'ok'
    assert world.in_flight.pop('A').result(timeout=30) == 11
    assert time.monotonic() - deleted < world.ownership.vif_timeout / 2
    assert world.effects() == HOST_A and world.owner() is None


@pytest.mark.parametrize('pod', [True, False], ids=['with the pod', 'without the pod'])
def test_a_del_of_a_sandbox_whose_add_waits_for_its_vifs_stops_that_add(world, pod):
    """The runtime gives up on sandbox A while its ADD waits for the VIFs to be
    published, and DELs it (with or without K8S_POD_NAME): the DEL succeeds with nothing
    to remove, and the ADD fails at once (code 11) having plugged and recorded nothing,
    where it used to plug the deleted sandbox for good once the VIFs appeared."""
    world.registry.drop_pod(POD)            # no VIFs published yet
    add = world.pool.submit(world.request, 'ADD', 'A')
    wait.until(lambda: 'A' in world.registry.bindings.adds_since(0), what='ADD A in flight')
    deleted = time.monotonic()
    assert world.request('DEL', 'A', pod=pod) == 'ok'
    assert add.result(timeout=30) == 11     # at once, not when vif_timeout (3 s) ends
    assert time.monotonic() - deleted < world.ownership.vif_timeout / 2
    world.publish(active=True)
    assert world.effects() == []
    assert world.ownership.store.load(POD) is None
    assert not os.path.exists(world.ownership.locks.path(POD))
    assert world.request('ADD', 'A') == 'ok'    # a later ADD of the sandbox is not refused


def _held(monkeypatch, owner, name):
    """Make ``owner.name`` stop when called until released, then do what it did:
    returns the events ``(entered, release)``."""
    entered, release = threading.Event(), threading.Event()
    original = getattr(owner, name)

    def held(*args):
        entered.set()
        release.wait(30)
        return original(*args)
    monkeypatch.setattr(owner, name, held)
    return entered, release


def _counted_holds(monkeypatch, world):
    """The pod keys the pod's lock is asked for, in order, from now on."""
    holds = []
    hold = world.ownership.locks.hold

    def counted(pod_key, deadline):
        holds.append(pod_key)
        return hold(pod_key, deadline)
    monkeypatch.setattr(world.ownership.locks, 'hold', counted)
    return holds


def test_a_del_while_the_add_waits_for_the_pods_lock_stops_that_add(world, monkeypatch):
    """ADD A has its VIFs and waits for the pod's lock (held here) when DEL A comes:
    whichever of the two gets the lock first, the ADD is refused at its claim (code 11)
    and nothing of A is made."""
    hold = world.ownership.locks.hold
    holds = _counted_holds(monkeypatch, world)
    with hold(POD, time.monotonic() + 30):
        add = world.pool.submit(world.request, 'ADD', 'A')
        wait.until(lambda: holds == [POD], what='the ADD to ask for the pod\'s lock')
        delete = world.pool.submit(world.request, 'DEL', 'A')
        wait.until(lambda: holds == [POD, POD], what='the DEL to ask for the pod\'s lock')
    assert (add.result(timeout=30), delete.result(timeout=30)) == (11, 'ok')
    assert world.effects() == []
    assert world.ownership.store.load(POD) is None


def test_a_del_without_the_pod_racing_with_the_claim_waits_for_it_and_removes_it(
        world, monkeypatch):
    """DEL A, without K8S_POD_NAME, arrives while A's ADD, admitted, holds the pod's lock
    and has recorded nothing yet: the DEL finds no binding of A, but the ADD in flight
    names the pod, so it waits for the pod's lock and removes what the ADD plugged."""
    admitted, release = _held(monkeypatch, world.ownership, '_refuse_moved_sandbox')
    holds = _counted_holds(monkeypatch, world)
    add = world.pool.submit(world.request, 'ADD', 'A')
    try:
        assert admitted.wait(30)
        delete = world.pool.submit(world.request, 'DEL', 'A', pod=False)
        wait.until(lambda: delete.done() or len(holds) == 2,
                   what='the DEL to answer or to ask for the pod\'s lock')
    finally:
        release.set()
    assert (add.result(timeout=30), delete.result(timeout=30)) == ('ok', 'ok')
    assert world.effects() == MAKE_A + HOST_A
    assert world.ownership.store.load(POD) is None


# -- the binding policy: refused before anything is claimed -----------------------------

@pytest.mark.parametrize('owned', [False, True], ids=['first ADD', 'ADD of a new sandbox'])
def test_a_vif_the_policy_refuses_changes_nothing(world, owned):
    world.publish()
    if owned:
        assert world.request('ADD', 'A') == 'ok'
        world.effects()
    before = world.ownership.store.load(POD)
    world.kernel.refused_bridges.add('br0')

    assert world.request('ADD', 'B') == 7

    assert world.effects() == []
    assert world.ownership.store.load(POD) == before       # no claim, A not evicted
    assert world.owner() == ('A' if owned else None)


def test_an_address_another_pod_holds_is_refused_and_changes_nothing(world):
    world.publish()
    assert world.request('ADD', 'A') == 'ok'
    other = 'default/copycat'
    body = json.loads(json.dumps(world.pod_record['vifs']))
    body['eth0']['port_id'] = 'port-x'
    world.registry.put_pod(other, dict(world.pod_record, uid='uid-x', vifs=body))
    world.effects()
    request = {'CNI_COMMAND': 'ADD', 'CNI_CONTAINERID': 'X', 'CNI_NETNS': world.netns('X'),
               'CNI_IFNAME': 'eth0', 'CNI_PATH': '/opt/cni/bin',
               'CNI_ARGS': 'K8S_POD_NAMESPACE=default;K8S_POD_NAME=copycat;K8S_POD_UID=uid-x',
               'config': {'cniVersion': '1.1.0', 'name': NETWORK, 'type': 'kuryr-cni'}}

    status, payload = world.app.handle(PATHS['ADD'], json.dumps(request).encode())

    assert status == 400 and json.loads(payload)['code'] == 7
    assert 'bound to another pod' in json.loads(payload)['msg']
    assert world.effects() == []
    assert world.ownership.store.load(other) is None
    assert not os.path.exists(world.ownership.locks.path(other))


# -- two ADDs of one sandbox (a runtime's retry while the first still runs) ------------

def test_the_first_of_two_adds_of_one_sandbox_to_end_leaves_the_other_in_flight(
        world, monkeypatch):
    """The runtime retries ADD A while the first ADD A waits for its VIFs to be active;
    the retry is plugging when the first ends. It stays in flight (a GC spares what it
    plugs) until it ends itself: each ADD has its own mark, not its sandbox's."""
    world.start_add('A')
    plugging, release = _held(monkeypatch, world.kernel, 'connect')
    retry = world.pool.submit(world.request, 'ADD', 'A')
    try:
        assert plugging.wait(30)
        assert world.finish('A') == 'ok'            # the first ADD ends
        in_flight = world.registry.bindings.adds_since(0)
    finally:
        release.set()
    assert 'A' in in_flight
    assert retry.result(timeout=30) == 'ok'
    assert 'A' not in world.registry.bindings.adds_since(0)
    assert world.owner() == 'A'


# -- a plug that fails, and whose rollback fails too ------------------------------------

def test_a_failed_plug_whose_rollback_fails_keeps_its_record_for_the_owners_del(
        world, monkeypatch):
    """The plug fails after making A's devices and removing them fails too (the kernel
    refuses once): the 'plugging' record stays, so the runtime's DEL A removes them."""
    world.kernel.fail_connect = errors.BindingFailed('the kernel refused the veth')
    disconnect = world.kernel.disconnect
    refusals = [errors.BindingFailed('the kernel refused to remove it')]

    def refusing_once(kind, plug):
        if refusals and (plug.container_id, plug.ifname) in world.kernel.host:
            raise refusals.pop()
        disconnect(kind, plug)
    monkeypatch.setattr(world.kernel, 'disconnect', refusing_once)

    assert world.request('ADD', 'A') == 101
    assert world.effects() == MAKE_A                # made, and still there
    attachment = world.ownership.store.load(POD).sandboxes['A'].attachments[
        ('kuryr', 'eth0')]
    assert attachment.state == 'plugging'
    assert world.request('DEL', 'A') == 'ok'
    assert world.effects() == HOST_A
    assert world.owner() is None and world.ownership.store.load(POD) is None


def test_a_failed_plug_whose_rollback_worked_leaves_no_attachment(world):
    world.kernel.fail_connect = errors.BindingFailed('the kernel refused the veth')
    assert world.request('ADD', 'A') == 101
    assert world.effects() == MAKE_A + HOST_A
    binding = world.ownership.store.load(POD)
    assert binding is None or not binding.sandboxes['A'].attachments


def test_the_owners_del_removes_its_tagged_devices_the_record_does_not_name(world):
    """The owner's record lost the attachment (a file restored from a backup, a
    hand edit): its DEL still removes the devices tagged for it, by their tag."""
    assert world.request('ADD', 'A') == 'ok'
    world.effects()
    binding = world.ownership.store.load(POD)
    binding.sandboxes['A'].attachments.clear()
    world.ownership.store.save(binding)
    assert world.request('DEL', 'A') == 'ok'
    assert world.effects() == HOST_A


# -- a queued DEL is never lost -------------------------------------------------------

def queue_del(world, cid):
    """What the shim does with DEL ``cid`` while the daemon is down: a queue entry."""
    body = {'CNI_COMMAND': 'DEL', 'CNI_CONTAINERID': cid, 'CNI_NETNS': world.netns(cid),
            'CNI_IFNAME': 'eth0', 'CNI_PATH': '/opt/cni/bin',
            'CNI_ARGS': 'K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s;K8S_POD_UID=%s'
                        % (NAMESPACE, NAME, UID1),
            'config': {'cniVersion': '1.1.0', 'name': NETWORK, 'type': 'kuryr-cni'}}
    queue = state.DelQueue(world.state_dir)
    state.write_atomically(queue.directory, '%d-1.json' % time.time_ns(),
                           json.dumps(body).encode())
    return queue


def test_a_queued_del_refused_once_by_the_kernel_is_kept_and_applied_by_the_retry(world):
    """Issue 31's probe: the kernel refuses the replayed DEL's unplug once (code 101)."""
    assert world.request('ADD', 'A') == 'ok'
    world.effects()
    queue = queue_del(world, 'A')
    disconnect = world.kernel.disconnect
    refusals = [errors.BindingFailed('the kernel refused to remove the veth')]

    def refusing_once(kind, plug):
        if refusals:
            raise refusals.pop()
        disconnect(kind, plug)
    world.kernel.disconnect = refusing_once

    world.restart()                             # the first pass, before the socket opens
    assert world.effects() == [] and world.owner() == 'A'
    assert queue.names() != []                  # kept, not set aside
    assert world.registry.status.queued_dels()['failing'] == 1
    keeper = housekeeping.Housekeeper(world.ownership, queue,
                                      retries=recovery.Retries(first=0))
    keeper.tick()                               # the retry, after the socket opened
    assert world.effects() == HOST_A
    assert world.ownership.store.load(POD) is None
    assert os.listdir(queue.directory) == []
    assert world.registry.status.queued_dels()['failing'] == 0


class FailingAt:
    """The recording kernel, whose N-th call of any method (and the store's N-th write,
    counted with them) fails as a kernel or OVSDB refusal or a full disk would."""

    def __init__(self, kernel, store, n):
        self._kernel, self.n, self.calls = kernel, n, 0
        for name in ('save', 'remove'):
            setattr(store, name, self._step(getattr(store, name), errors.StateFailure(
                'state dir: cannot write', 'error 28 (No space left on device)')))

    def _step(self, method, error):
        def step(*args, **kwargs):
            self.calls += 1
            if self.calls == self.n:
                raise error
            return method(*args, **kwargs)
        return step

    def __getattr__(self, name):
        return self._step(getattr(self._kernel, name),
                          errors.BindingFailed('refused at step %d' % self.n))


def test_a_queued_del_is_never_lost_whichever_step_of_its_replay_fails(tmp_path, kernel):
    """For every N, a world whose N-th step of the replayed DEL fails: the entry stays,
    and the next replay removes every device and record of the sandbox."""
    for n in range(1, 100):
        world = World(tmp_path / str(n), recording_kernel.RecordingKernel())
        try:
            world.publish()
            assert world.request('ADD', 'A') == 'ok'
            world.restart()                     # the daemon went down; the shim queues
            queue = queue_del(world, 'A')
            world.kernel.take_effects()
            failing = FailingAt(world.kernel, world.ownership.store, n)
            world.ownership.kernel = failing
            replayed = recovery.replay_queue(world.ownership, queue)
            world.ownership.kernel = world.kernel
            retried = recovery.replay_queue(world.ownership, queue,
                                            retries=recovery.Retries(first=0))
            assert (n, replayed + retried) == (n, 1)
            assert (n, os.listdir(queue.directory)) == (n, [])
            assert world.kernel.host == {} and set(world.kernel.namespaces[
                world.netns('A')]) == {'lo'}, n
            assert world.ownership.store.load(POD) is None, n
            if failing.calls < n:               # every step has had its fault
                assert n > 3
                break
        finally:
            world.close()
    else:
        raise AssertionError('the DEL never got past its faults')


# -- the address fence: by network, and one port per pod --------------------------------

def add_other_pod(world, name, **vif):
    """ADD of pod ``default/<name>``, whose eth0 is world's VIF with ``vif`` changed."""
    body = dict(bridge_vif(), **vif)
    world.registry.put_pod('default/' + name, {'uid': 'uid-' + name, 'vifs': {'eth0': body},
                                               'error': None, 'deleting': False})
    request = {'CNI_COMMAND': 'ADD', 'CNI_CONTAINERID': name, 'CNI_NETNS': world.netns(name),
               'CNI_IFNAME': 'eth0', 'CNI_PATH': '/opt/cni/bin',
               'CNI_ARGS': 'K8S_POD_NAMESPACE=default;K8S_POD_NAME=%s;K8S_POD_UID=uid-%s'
                           % (name, name),
               'config': {'cniVersion': '1.1.0', 'name': NETWORK, 'type': 'kuryr-cni'}}
    status, payload = world.app.handle(PATHS['ADD'], json.dumps(request).encode())
    return 'ok' if status == 200 else (json.loads(payload)['code'], json.loads(payload)['msg'])


def publish_on(world, network_id):
    world.pod_record = {'uid': UID1, 'vifs': {'eth0': dict(bridge_vif(),
                                                           network_id=network_id)},
                        'error': None, 'deleting': False}
    world.registry.put_pod(POD, world.pod_record)


OTHER_PORT = {'port_id': 'port-6', 'mac': 'fa:16:3e:00:00:06'}


def test_pods_on_two_networks_may_hold_the_same_addresses(world):
    """Two tenants' networks with overlapping subnets (and Neutron's MACs are unique per
    network only): the fence is per network where the VIFs name theirs."""
    publish_on(world, 'net-1')
    assert world.request('ADD', 'A') == 'ok'
    assert add_other_pod(world, 'other', network_id='net-2', port_id='port-6') == 'ok'


@pytest.mark.parametrize('network', ['net-1', None], ids=['same network', 'network unknown'])
def test_an_address_held_on_the_same_or_an_unknown_network_is_refused(world, network):
    publish_on(world, 'net-1')
    assert world.request('ADD', 'A') == 'ok'
    vif = dict(OTHER_PORT, mac='fa:16:3e:00:00:05')
    if network:
        vif['network_id'] = network
    code, msg = add_other_pod(world, 'other', **vif)
    assert (code, msg) == (7, '10.0.0.5, fa:16:3e:00:00:05 bound to another pod of this node')


def test_two_pods_never_share_a_port(world):
    """One Neutron port is one OVS iface-id: a second pod naming it is refused, whatever
    its addresses."""
    assert world.request('ADD', 'A') == 'ok'
    world.effects()
    code, msg = add_other_pod(world, 'other', mac='fa:16:3e:00:00:06', ips=['10.0.0.6/24'])
    assert (code, msg) == (7, 'port port-5 bound to another pod of this node')
    assert world.effects() == []
    assert world.ownership.store.load('default/other') is None
