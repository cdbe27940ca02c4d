"""The daemon's CNI API for GC and STATUS, with a real registry, store and pod locks.

The registry is a real multiprocessing Manager, bindings are real files and
pod locks real flocks; the kernel is the recording stand-in of the ownership
rules' port, so no root is needed.
"""

import json
import os
import time

import pytest

from kuryr_cni import records
from kuryr_cni import vif as vif_model
from kuryr_cni.cni import request as cni_request
from kuryr_cni.daemon import api

NETWORK = 'kuryr'
CONFIG = {'cniVersion': '1.1.0', 'name': NETWORK, 'type': 'kuryr-cni'}
VIF = vif_model.parse_vif({'kind': 'bridge', 'port_id': 'port-1', 'bridge': 'br0',
                           'mac': 'fa:16:3e:00:00:01', 'ips': ['10.0.0.1/24']})


@pytest.fixture
def owner(ownership):
    return ownership


@pytest.fixture
def app(owner, registry):
    return api.CNIApp(owner, registry, request_timeout=30)


def attach(owner, pod, cid, ifname='eth0', network=NETWORK, added_at=None):
    """Record a ready attachment of ``cid`` to ``pod``, as an ADD leaves it."""
    key = 'default/' + pod
    binding = owner.store.load(key) or records.Binding(key, owner=cid)
    sandbox = binding.sandboxes.setdefault(cid, records.Sandbox(cid, ''))
    sandbox.attachments[(network, ifname)] = records.Attachment(
        network, ifname, [records.Interface(ifname, VIF, True)], state=records.READY,
        added_at=time.time() if added_at is None else added_at, result={})
    owner.store.save(binding)
    owner.registry.bindings.put(key, binding.summary())


def attachments(owner):
    return sorted((b.pod, cid, '%s/%s' % key) for b in owner.store.load_all().values()
                  for cid, sandbox in b.sandboxes.items() for key in sandbox.attachments)


def gc(app, config):
    body = {'CNI_COMMAND': 'GC', 'config': dict(CONFIG, **config)}
    return app.handle('/gc', json.dumps(body).encode())


def valid(*pairs):
    return [{'containerID': cid, 'ifname': ifname} for cid, ifname in pairs]


def test_gc_collects_what_is_not_valid_in_its_network_only(app, owner, tmp_path):
    attach(owner, 'a', 'cid-a', added_at=1)
    attach(owner, 'b', 'cid-b', added_at=1)
    attach(owner, 'c', 'cid-c', network='other', added_at=1)
    assert gc(app, {'cni.dev/valid-attachments': valid(('cid-a', 'eth0'))}) == (204, b'')
    assert attachments(owner) == [('default/a', 'cid-a', 'kuryr/eth0'),
                                  ('default/c', 'cid-c', 'other/eth0')]
    assert os.listdir(owner.locks.directory) == []     # collected pods leave no lock file


def test_gc_empty_list_collects_all_and_the_alias_counts(app, owner):
    attach(owner, 'a', 'cid-a', added_at=1)
    assert gc(app, {'cni.dev/attachments': []}) == (204, b'')
    assert attachments(owner) == []


def test_gc_without_the_key_collects_nothing(app, owner):
    attach(owner, 'a', 'cid-a', added_at=1)
    assert gc(app, {}) == (204, b'')
    assert attachments(owner) == [('default/a', 'cid-a', 'kuryr/eth0')]


def test_gc_spares_a_container_with_an_add_in_flight(app, owner, registry):
    attach(owner, 'a', 'cid-a', added_at=1)
    registry.bindings.add_started('cid-a', time.monotonic())
    assert gc(app, {'cni.dev/valid-attachments': []}) == (204, b'')
    assert attachments(owner) == [('default/a', 'cid-a', 'kuryr/eth0')]
    registry.bindings.add_started('cid-a', time.monotonic() - 31)   # its worker died long ago
    assert gc(app, {'cni.dev/valid-attachments': []}) == (204, b'')
    assert attachments(owner) == []


def _del(cid, pod='a'):
    return cni_request.Request(command='DEL', cni_version='1.1.0', network=NETWORK,
                               container_id=cid, netns=None, ifname='eth0',
                               pod=cni_request.PodRef('default', pod), config=CONFIG)


def test_collect_judges_again_under_the_lock(owner, registry):
    """What the GC listed may have come alive before it took the pod's lock."""
    attach(owner, 'a', 'cid-a', added_at=1000.0)
    [(_, _, _, listed)] = owner.stale_attachments(NETWORK, set(), 30)
    attach(owner, 'a', 'cid-a', added_at=1001.0)         # re-made after the GC listed it
    assert owner.collect(_del('cid-a'), time.monotonic() + 5, listed, 30) == 'spared'
    attach(owner, 'a', 'cid-a', added_at=listed)
    registry.bindings.add_started('cid-a', time.monotonic())   # an ADD started meanwhile
    assert owner.collect(_del('cid-a'), time.monotonic() + 5, listed, 30) == 'spared'
    registry.bindings.add_finished('cid-a')
    assert owner.collect(_del('cid-a'), time.monotonic() + 5, listed, 30) == 'success'
    assert attachments(owner) == []
    assert owner.collect(_del('cid-a'), time.monotonic() + 5, listed, 30) == 'noop'


def test_gc_spares_what_was_remade_when_the_wall_clock_stepped_back(owner):
    """Issue 20: re-made with an earlier wall time than when it was listed."""
    attach(owner, 'a', 'cid-a', added_at=time.time())
    [(_, _, _, listed)] = owner.stale_attachments(NETWORK, set(), 30)
    attach(owner, 'a', 'cid-a', added_at=listed - 3600)    # the clock went back an hour
    assert owner.collect(_del('cid-a'), time.monotonic() + 5, listed, 30) == 'spared'
    assert attachments(owner) == [('default/a', 'cid-a', 'kuryr/eth0')]


def test_an_add_in_flight_is_spared_when_the_wall_clock_steps_forward(owner, registry,
                                                                      monkeypatch):
    """Issue 20: ADDs in flight are told by the monotonic clock, which is never stepped."""
    attach(owner, 'a', 'cid-a', added_at=1.0)
    registry.bindings.add_started('cid-a', time.monotonic())
    real = time.time
    monkeypatch.setattr(time, 'time', lambda: real() + 86400)    # a day ahead
    assert owner.stale_attachments(NETWORK, set(), 30) == []
    assert owner.collect(_del('cid-a'), time.monotonic() + 5, 1.0, 30) == 'spared'


@pytest.mark.parametrize('entries', [{}, 'all', [{'containerID': 'cid-a'}],
                                     [{'containerID': 1, 'ifname': 'eth0'}]])
def test_gc_refuses_malformed_lists_before_collecting(app, owner, entries):
    attach(owner, 'a', 'cid-a', added_at=1)
    status, body = gc(app, {'cni.dev/valid-attachments': entries})
    assert (status, json.loads(body)['code']) == (400, 7)
    assert attachments(owner) == [('default/a', 'cid-a', 'kuryr/eth0')]


# STATUS -----------------------------------------------------------------------------


def status(app):
    body = {'CNI_COMMAND': 'STATUS', 'config': CONFIG}
    return app.handle('/status', json.dumps(body).encode())


def serving(registry):
    """The status facts of a daemon whose worker and watcher run and beat, synced."""
    for role in ('cni-worker', 'watcher'):
        registry.status.process_started(role, 0, os.getpid(), time.monotonic())
    registry.status.mark_synced(True)


def refused(answer, words):
    code, body = answer
    error = json.loads(body)
    assert (code, error['code'], error['cniVersion']) == (503, 50, '1.1.0'), error
    assert words in error['details'], error


def test_status_succeeds_only_when_an_add_could_be_served(app, registry):
    serving(registry)
    assert status(app) == (204, b'')
    registry.status.mark_synced(False)
    refused(status(app), 'not synced')
    registry.status.mark_synced(True)
    registry.status.mark_shutting_down()
    refused(status(app), 'shutting down')


def test_status_without_a_worker_is_50(app, registry):
    serving(registry)
    registry.status.process_started('cni-worker', 0, None, time.monotonic())
    refused(status(app), 'worker')


def test_a_request_too_malformed_to_name_its_pod_still_leaves_its_one_line(app, caplog):
    caplog.set_level('DEBUG', logger='kuryr_cni.daemon.api')
    status, _ = app.handle('/addNetwork', b'{"CNI_COMMAND": "ADD", ')
    assert status == 400
    [line] = [r for r in caplog.records if r.name == 'kuryr_cni.daemon.api']
    assert line.levelname == 'INFO'
    assert line.getMessage().startswith(
        'ADD pod - container - ifname -: error code 6 DecodeFailure: ')
