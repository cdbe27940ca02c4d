"""The storm: hundreds of pod sandboxes through the real shim while the daemon is abused.

Three waves of pods against a daemon with 4 CNI workers. Each pod follows a
script a runtime really produces, picked and ordered from a printed seed
(``KURYR_STORM_SEED`` replays one):

* ``plain``: ADD;
* ``fail-retry``: ADD fails (VIF not active within vif_timeout), then the
  runtime's retry of the same sandbox succeeds;
* ``replace-failed``: ADD A fails, DEL A, ADD B (DESIGN §1), then late DELs of A;
* ``replace-live``: ADD A, ADD B without DEL A (A is evicted), then late DELs of A;
* ``reincarnate``: ADD A, the pod is deleted and re-created with a new UID,
  ADD B, then late DELs of A (fenced by the UID);
* ``delete``: ADD, DEL, DEL again, DEL without netns;
* from the second wave on, pods of earlier waves are deleted the same way.

In each wave's first phase CNI workers are SIGKILLed at random moments; the
runtime retries what failed (code 11), as kubelet does. Between waves the
daemon is stopped (SIGTERM) and started again; while it is down DELs go
through the shim into its queue (owner DELs and late DELs) and an ADD waits
for a daemon until its own timeout (2 s for this one), then fails with code 11.

Why the stale-DEL count can be exact: a stale DEL is counted when the daemon
judges it, before it answers, so a kill between the two would make the
runtime's retry count it twice. Late DELs are therefore sent only in each
wave's second phase, when nothing is killed, and while the daemon is down
(replayed exactly once by the restarted parent, before any kill). A DEL of
the first phase that the shim had to queue (its worker died before reading
it) is waited for until the daemon has replayed it, before the script goes
on, so that no queued DEL can be judged after a newer sandbox exists. The
counter restarts with every daemon (its files are wiped at start), so it is
read before each stop and summed.

Afterwards every live pod has exactly its interface and pings its gateway;
every other sandbox left no device; the state dir holds exactly the live
pods' bindings and locks and an empty queue; the daemon's registry (GET
/v1/pods) holds exactly the live pods; the stale-DEL counter equals the late
DELs sent, per reason; worker restarts equal kills, per daemon life.
"""

import collections
import concurrent.futures
import dataclasses
import json
import os
import random
import threading
import time

import pytest

from kuryr_cni import state
from kuryr_cni.binding import owner_tag
from tools.testbed import host as testhost
from tools.testbed import runtime as testruntime

from tests import wait
from tests.functional import conftest
from tests.functional import crash
from tests.functional import helpers

pytestmark = [pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON),
              pytest.mark.slow]

VIF_TIMEOUT = 2
WAVES = 3
# Scripts per wave: 48 pods, 70 sandboxes.
SCRIPTS = {'plain': 12, 'fail-retry': 7, 'replace-failed': 10, 'replace-live': 7,
           'reincarnate': 5, 'delete': 7}
RETIRE_SHARE = 0.3          # of the live pods of earlier waves, deleted in each later wave
CONCURRENCY = 12            # runtime operations at once
KILL_EVERY = (0.3, 1.0)     # seconds between two kills, uniformly drawn
TRIES = 10                  # attempts of one operation before the storm gives up
DOWNTIME_LATE_DELS = 3
DOWNTIME_OWNER_DELS = 3


@dataclasses.dataclass
class Pod:
    name: str
    index: int
    script: str
    uid: str
    live: testruntime.Sandbox | None = None
    late: list = dataclasses.field(default_factory=list)      # [(sandbox, reason)]
    gone: list = dataclasses.field(default_factory=list)      # sandboxes without devices

    @property
    def key(self):
        return 'default/' + self.name


class Storm:
    def __init__(self, node, runtime, seed):
        self.node = node
        self.runtime = runtime
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.pods = []
        self.requests = collections.Counter()       # (command, outcome) -> count
        self.add_latency = []
        self.expected_stale = collections.Counter()   # reason -> late DELs sent
        self.counted_stale = collections.Counter()    # reason -> counted, summed over lives
        self.kills = 0
        self.restarts = 0
        self.queued_in_flight = 0     # DELs the shim queued because their worker died
        self.lives = []               # per daemon life: (kills, worker restarts, replayed)
        self._life_kills = 0
        self._life_queued = 0
        self._next_index = 2
        self._sandboxes = 0

    # The runtime ---------------------------------------------------------------------

    def sandbox(self, pod, uid=None):
        with self.lock:
            self._sandboxes += 1
            number = self._sandboxes
        return testruntime.Sandbox('storm-%d-%s' % (number, pod.name), self.node.pod_netns(),
                                   pod.name, pod_uid=uid or pod.uid)

    def _count(self, command, outcome, seconds=None):
        with self.lock:
            self.requests[command, 'ok' if outcome.ok else 'code %s' % outcome.error_code] += 1
            if command == 'ADD' and outcome.ok and seconds is not None:
                self.add_latency.append(seconds)

    def add(self, sandbox):
        started = time.monotonic()
        outcome = self.runtime.add(sandbox)
        self._count('ADD', outcome, time.monotonic() - started)
        assert outcome.ok or outcome.error_code == 11, (sandbox, outcome)
        return outcome

    def add_until_ok(self, sandbox):
        for _ in range(TRIES):
            if self.add(sandbox).ok:
                return
        raise AssertionError('ADD of %s never succeeded' % sandbox.container_id)

    def delete(self, sandbox, netns=None):
        before = set(crash.queue_entries(self.node))
        outcome = self.runtime.delete(sandbox, netns=netns)
        self._count('DEL', outcome)
        assert outcome.ok or outcome.error_code == 11, (sandbox, outcome)
        if outcome.ok:
            self._wait_if_queued(sandbox, before)
        return outcome

    def delete_until_ok(self, sandbox, netns=None):
        for _ in range(TRIES):
            if self.delete(sandbox, netns).ok:
                return
        raise AssertionError('DEL of %s never succeeded' % sandbox.container_id)

    def _wait_if_queued(self, sandbox, before):
        """If the shim queued this DEL (its worker died first), wait for its replay."""
        mine = [name for name in set(crash.queue_entries(self.node)) - before
                if _queued_container(self.node, name) == sandbox.container_id]
        if not mine:
            return
        with self.lock:
            self.queued_in_flight += 1
        wait.until(lambda: not set(mine) & set(crash.queue_entries(self.node)), 30,
                   'the daemon to replay the queued DEL of %s' % sandbox.container_id)

    # The pods' scripts ---------------------------------------------------------------

    def new_wave(self, wave):
        scripts = [s for s, n in SCRIPTS.items() for _ in range(n)]
        self.rng.shuffle(scripts)
        pods = []
        for script in scripts:
            index, self._next_index = self._next_index, self._next_index + 1
            name = 'w%d-%s-%d' % (wave, script, index)
            pod = Pod(name, index, script, 'uid-%s' % name)
            active = script not in ('fail-retry', 'replace-failed')
            self.node.api.create_pod('default', name, testhost.NODE, uid=pod.uid,
                                     annotations={'kuryr.openstack.org/vifs': json.dumps(
                                         self.node.vifs(index, active=active))})
            pods.append(pod)
        self.pods.extend(pods)
        return pods

    def run_script(self, pod):
        getattr(self, 'script_' + pod.script.replace('-', '_'))(pod)

    def _activate(self, pod):
        self.node.api.set_vifs('default', pod.name, self.node.vifs(pod.index, active=True))

    def script_plain(self, pod):
        a = self.sandbox(pod)
        self.add_until_ok(a)
        pod.live = a

    def script_fail_retry(self, pod):
        a = self.sandbox(pod)
        assert not self.add(a).ok         # its VIF is not active: code 11
        self._activate(pod)
        self.add_until_ok(a)
        pod.live = a

    def script_replace_failed(self, pod):
        a = self.sandbox(pod)
        assert not self.add(a).ok
        self.delete_until_ok(a)
        self._activate(pod)
        b = self.sandbox(pod)
        self.add_until_ok(b)
        pod.live, pod.late, pod.gone = b, [(a, 'container_id_mismatch')], [a]

    def script_replace_live(self, pod):
        a = self.sandbox(pod)
        self.add_until_ok(a)
        b = self.sandbox(pod)
        self.add_until_ok(b)              # A never got its DEL: B evicts A's devices
        pod.live, pod.late, pod.gone = b, [(a, 'container_id_mismatch')], [a]

    def script_reincarnate(self, pod):
        a = self.sandbox(pod)
        self.add_until_ok(a)
        self.node.api.delete_pod('default', pod.name)
        pod.uid = pod.uid + '-again'
        self.node.api.create_pod('default', pod.name, testhost.NODE, uid=pod.uid,
                                 annotations={'kuryr.openstack.org/vifs': json.dumps(
                                     self.node.vifs(pod.index))})
        b = self.sandbox(pod)
        self.add_until_ok(b)
        pod.live, pod.late, pod.gone = b, [(a, 'pod_uid_mismatch')], [a]

    def script_delete(self, pod):
        a = self.sandbox(pod)
        self.add_until_ok(a)
        pod.live = a
        self.script_retire(pod)

    def script_retire(self, pod):
        a = pod.live
        self.delete_until_ok(a)
        self.delete_until_ok(a)               # repeated
        self.delete_until_ok(a, netns='')     # the runtime's second DEL, without netns
        self.node.api.delete_pod('default', pod.name)
        pod.live = None
        pod.gone.append(a)

    def late_dels(self, pods):
        """The late DELs of this wave's replaced sandboxes: 1 to 3 each, some without netns."""
        dels = []
        for pod in pods:
            for sandbox, reason in pod.late:
                for _ in range(self.rng.choice([1, 1, 2, 3])):
                    dels.append((sandbox, reason, self.rng.choice([None, ''])))
        self.rng.shuffle(dels)
        return dels

    def send_late_del(self, sandbox, reason, netns):
        outcome = self.runtime.delete(sandbox, netns=netns)
        self._count('DEL', outcome)
        assert outcome.ok, (sandbox, outcome)
        with self.lock:
            self.expected_stale[reason] += 1

    # Kills, restarts ------------------------------------------------------------------

    def killer(self, stop):
        while not stop.wait(self.rng.uniform(*KILL_EVERY)):
            workers = crash.titled(self.node, crash.WORKER_TITLE)
            if not workers:
                continue
            try:
                crash.kill(self.rng.choice(workers))
            except ProcessLookupError:
                continue
            with self.lock:
                self.kills += 1
                self._life_kills += 1

    def end_life(self):
        """Read what this daemon life counted (the counters restart with the daemon)."""
        stale = helpers.stale_dels(self.node)
        self.counted_stale.update(stale)
        restarts = helpers.metric(self.node, 'kuryr_cni_worker_restarts_total',
                                  service='cni-worker')
        replayed = helpers.metric(self.node, 'kuryr_cni_queued_del_replayed_total')
        self.lives.append((self._life_kills, restarts, replayed))
        self._life_kills = 0

    def restart(self):
        crash.wait_workers(self.node)
        wait.until(lambda: not crash.queue_entries(self.node), 30, 'an empty DEL queue')
        self.end_life()
        assert self.node.stop_daemon() == 0
        self.restarts += 1
        queued = self.while_down()
        self.node.start_daemon(workers=4, vif_timeout=VIF_TIMEOUT)
        assert crash.queue_entries(self.node) == []      # replayed before the socket opened
        assert helpers.metric(self.node, 'kuryr_cni_queued_del_replayed_total') == queued

    def while_down(self):
        """DELs into the shim's queue while the daemon is down; returns how many."""
        live = [p for p in self.pods if p.live is not None]
        # Waits for a daemon (a restart is usually seconds) until its timeout, then fails.
        impatient = testruntime.Runtime(self.node.socket, self.node.state_dir,
                                        self.runtime.cache_dir, shim=self.runtime.shim,
                                        timeout=2)
        refused = impatient.add(live[0].live)
        self._count('ADD', refused)
        assert refused.error_code == 11, refused
        replaced = [p for p in live if p.late]
        late = self.rng.sample(replaced, min(DOWNTIME_LATE_DELS, len(replaced)))
        others = [p for p in live if p not in late]
        retire = self.rng.sample(others, min(DOWNTIME_OWNER_DELS, len(others)))
        for pod in late:
            sandbox, reason = pod.late[0]
            self.send_late_del(sandbox, reason, None)
        for pod in retire:
            outcome = self.runtime.delete(pod.live)
            self._count('DEL', outcome)
            assert outcome.ok, outcome
            self.node.api.delete_pod('default', pod.name)
            pod.gone.append(pod.live)
            pod.live = None
        queued = len(crash.queue_entries(self.node))
        assert queued == len(late) + len(retire)
        return queued

    # A wave ---------------------------------------------------------------------------

    def wave(self, number):
        earlier = [p for p in self.pods if p.live is not None]
        pods = self.new_wave(number)
        crash.wait_seen(self.node, len(earlier) + len(pods))
        retire = self.rng.sample(earlier, int(len(earlier) * RETIRE_SHARE))
        jobs = [(self.run_script, pod) for pod in pods] + [(self.script_retire, p) for p in retire]
        self.rng.shuffle(jobs)
        stop = threading.Event()
        killer = threading.Thread(target=self.killer, args=(stop,), daemon=True)
        killer.start()
        try:
            _run_all(jobs)
        finally:
            stop.set()
            killer.join()
        # Phase 2, nothing killed: the late DELs.
        crash.wait_workers(self.node)
        _run_all([(lambda args: self.send_late_del(*args), d) for d in self.late_dels(pods)])

    @property
    def sandboxes(self):
        return self._sandboxes


def _run_all(jobs):
    with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
        futures = [pool.submit(job, arg) for job, arg in jobs]
        for future in futures:
            future.result()


def _queued_container(node, name):
    if name.startswith('.') or not name.endswith('.json'):
        return None
    try:
        with open(os.path.join(node.state_dir, 'del-queue', name)) as f:
            return json.load(f).get('CNI_CONTAINERID')
    except (FileNotFoundError, ValueError):
        return None


def _registry_owners(node):
    return {key: binding['owner'] for key, binding in crash.registry_pods(node).items()}


def _dot_files(node):
    return [name for name in os.listdir(os.path.join(node.state_dir, 'bindings'))
            if name.startswith('.')]


def _percentile(values, share):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


@pytest.mark.parametrize('vif_timeout', [VIF_TIMEOUT])
def test_storm(daemon, runtime, capsys):
    node = daemon
    seed = int(os.environ.get('KURYR_STORM_SEED') or random.SystemRandom().randrange(2 ** 32))
    with capsys.disabled():
        print('\nstorm seed %d (KURYR_STORM_SEED=%d replays its choices)' % (seed, seed))
    storm = Storm(node, runtime, seed)
    started = time.monotonic()
    for number in range(1, WAVES + 1):
        if number > 1:
            storm.restart()
        storm.wave(number)
    crash.wait_workers(node)
    wait.until(lambda: not crash.queue_entries(node), 30, 'an empty DEL queue')
    live = {p.key: p for p in storm.pods if p.live is not None}
    # A worker killed between a binding file and its registry entry, or in
    # the middle of writing a file, is tidied after by the housekeeper within
    # a few seconds.
    wait.until(lambda: _registry_owners(node) == {k: p.live.container_id
                                                  for k, p in live.items()}
               and not _dot_files(node), 20, 'the registry to hold exactly the live pods')
    storm.end_life()
    wall = time.monotonic() - started

    _assert_live_pods_work(node, live.values())
    _assert_nothing_else_left(node, storm, live)
    assert storm.counted_stale == storm.expected_stale, (storm.counted_stale,
                                                         storm.expected_stale)
    for kills, restarts, _ in storm.lives:
        assert restarts == kills

    assert storm.sandboxes >= 200 and storm.kills > 0 and storm.restarts >= 2
    stopping = time.monotonic()
    status = node.stop_daemon()
    stopped = time.monotonic() - stopping
    with capsys.disabled():
        print(_figures(storm, live, wall))
        print('stopped in %.1f s' % stopped)
        if stopped > 10:
            print(node.log_tail(300))
    assert status == 0


def _assert_live_pods_work(node, live):
    host = node.links()
    bridge = host[testhost.BRIDGE]['index']
    for pod in live:
        links = node.links(pod.live.netns)
        assert set(links) == {'lo', 'eth0'}, (pod.name, set(links))
        assert node.addresses(pod.live.netns, 'eth0') == {'10.10.0.%d/24' % pod.index}
        host_end = host[owner_tag.host_ifname(pod.live.container_id, 'eth0')]
        assert host_end.get('master') == bridge
        assert host_end.get('ifalias') == owner_tag.alias(pod.live.container_id, 'eth0')
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        pings = dict(zip((p.name for p in live),
                         pool.map(lambda p: node.ping(p.live.netns, testhost.GATEWAY), live)))
    assert all(pings.values()), [name for name, ok in pings.items() if not ok]


def _assert_nothing_else_left(node, storm, live):
    tagged = sorted(name for name, link in node.links().items()
                    if owner_tag.parse_alias(link.get('ifalias') or ''))
    assert tagged == sorted(owner_tag.host_ifname(p.live.container_id, 'eth0')
                            for p in live.values())
    for pod in storm.pods:
        for sandbox in pod.gone:
            assert set(node.links(sandbox.netns)) == {'lo'}, (pod.name, sandbox.container_id)
    files = {state.file_stem(k) for k in live}
    assert sorted(os.listdir(os.path.join(node.state_dir, 'bindings'))) == \
        sorted(f + '.json' for f in files)
    assert sorted(os.listdir(os.path.join(node.state_dir, 'locks'))) == \
        sorted(f + '.lock' for f in files)
    assert crash.queue_entries(node) == []
    for key, binding in crash.registry_pods(node).items():
        owner = live[key].live.container_id
        assert list(binding['sandboxes']) == [owner], binding
        assert [a['state'] for a in binding['sandboxes'][owner]['attachments'].values()] \
            == ['ready']


def _figures(storm, live, wall):
    kinds = ', '.join('%s %s: %d' % (command, result, n)
                      for (command, result), n in sorted(storm.requests.items()))
    return ('storm: %d pods, %d sandboxes (%d live at the end), %d waves; requests: %s; '
            '%d workers killed, %d daemon restarts, %d DELs queued by a dying worker; '
            'stale DELs sent %d = counted %d (%s); ADD p50 %.3f s, p99 %.3f s (%d ADDs); '
            'wall %.1f s'
            % (len(storm.pods), storm.sandboxes, len(live), WAVES, kinds, storm.kills,
               storm.restarts, storm.queued_in_flight, sum(storm.expected_stale.values()),
               sum(storm.counted_stale.values()), dict(storm.counted_stale),
               _percentile(storm.add_latency, 0.5), _percentile(storm.add_latency, 0.99),
               len(storm.add_latency), wall))
