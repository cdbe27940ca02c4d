"""Plug first, then wait for ACTIVE: the daemon behind a Neutron that activates only what it sees.

Neutron reports a port ACTIVE only once the port's host side exists, and
kuryr-controller writes ``active: true`` only then; a daemon that waited for
``active`` before plugging would wait for ever. The stand-in Neutron
(:mod:`tools.testbed.neutron`) keeps exactly that causality, so every ADD
here succeeds only if the daemon plugs while the VIF is still inactive. Real
daemon, real shim, real namespaces, a private Open vSwitch for the ovs kind.
"""

import concurrent.futures
import json
import time

import pytest

from kuryr_cni.binding import owner_tag
from tools.testbed import host as testhost
from tools.testbed import neutron as testneutron
from tools.testbed import runtime as testruntime
from tests import wait
from tests.functional import conftest
from tests.functional import helpers
from tests.unit import osvif_fixtures as fx

pytestmark = pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON)

POD = 'web-0'
UID = 'uid-web-0'
KURYRPORT = '\n[cni_daemon]\nvif_source = kuryrport\n'
ANNOTATION = '\n[cni_daemon]\nvif_source = annotation\n'


def _network(prefix):
    return fx.network([fx.subnet(prefix + '.0/24', [prefix + '.5'], gateway=prefix + '.1')])


def _kuryrport(node, vif):
    node.api.create_pod('default', POD, testhost.NODE, uid=UID)
    node.api.create_kuryrport('default', POD, testhost.NODE,
                              spec={'podUid': UID, 'podStatic': False,
                                    'podNodeName': testhost.NODE},
                              status={'vifs': fx.status_vifs(vif)})


def _sandbox(node, letter='A'):
    return testruntime.Sandbox('sandbox-' + letter, node.pod_netns(), POD, pod_uid=UID)


def _events(node, reason):
    return [e for e in node.api.events() if e['reason'] == reason]


def _add_activated_by_neutron(node, runtime, sandbox, source, ovs=None):
    """ADD while the stand-in Neutron serves the pod: it must activate the port meanwhile."""
    with testneutron.StandInNeutron(node, ovs) as neutron:
        getattr(neutron, 'serve_' + source)('default', POD)
        outcome = runtime.add(sandbox)
        answered = time.monotonic()
    assert outcome.ok, outcome
    # It activated the port (so it had seen it plugged) before the ADD answered.
    [activated] = neutron.activations.values()
    assert activated <= answered


@pytest.mark.parametrize('vif_timeout', [20])
def test_open_vswitch_port_turns_active_only_once_plugged(node, vif_timeout, br_int, runtime):
    switch = br_int
    node.start_daemon(workers=2, vif_timeout=vif_timeout, extra=KURYRPORT + (
        '\n[binding]\novsdb_connection = %s\n' % switch.connection))
    try:
        _kuryrport(node, fx.ovs_vif(active=False, network=_network('10.20.0')))
        sandbox = _sandbox(node)
        _add_activated_by_neutron(node, runtime, sandbox, 'kuryrport', switch)
        [port] = switch.ports('br-int')
        assert dict(switch.interface(port)['external_ids'][1])['iface-id'] == fx.PORT_ID
        assert node.ping(sandbox.netns, '10.20.0.1')
        [waiting] = wait.until(lambda: _events(node, 'CNIWaitingForActiveVIFs'), 10,
                               'the CNIWaitingForActiveVIFs Event')
        assert waiting['type'] == 'Normal'
        assert waiting['message'] == (
            'Waiting for the Neutron ports of default/%s to become ACTIVE after binding '
            '(inactive: eth0 port %s).' % (POD, fx.PORT_ID))
        assert runtime.delete(sandbox).ok
        assert switch.ports('br-int') == set()
        assert helpers.leftovers(node) == helpers.NOTHING
    finally:
        node.stop_daemon()


def _ovn_node(node, switch, vif_timeout, ready_signal):
    node.start_daemon(workers=2, vif_timeout=vif_timeout, extra=(
        '\n[cni_daemon]\nvif_source = kuryrport\nready_signal = %s\n'
        '\n[binding]\novsdb_connection = %s\n' % (ready_signal, switch.connection)))
    _kuryrport(node, fx.ovs_vif(active=False, network=_network('10.20.0')))


@pytest.mark.parametrize('vif_timeout', [20])
def test_ovs_port_answers_once_ovn_installed_it_without_waiting_for_active(
        node, vif_timeout, br_int, runtime):
    """ovn-controller's ovn-installed, set once the port is plugged, answers the ADD alone."""
    _ovn_node(node, br_int, vif_timeout, 'first')
    try:
        sandbox = _sandbox(node)
        with testneutron.StandInNeutron(node, br_int, ovn_installed=True,
                                        activate=False) as neutron:
            neutron.serve_kuryrport('default', POD)
            started = time.monotonic()
            outcome = runtime.add(sandbox)
            answered = time.monotonic()
        assert outcome.ok, outcome
        [installed] = neutron.installations.values()
        assert started < installed <= answered
        assert answered - started < vif_timeout / 2       # not a timeout's retry
        assert neutron.activations == {}
        assert node.ping(sandbox.netns, '10.20.0.1')
        assert runtime.delete(sandbox).ok
        assert br_int.ports('br-int') == set()
        assert helpers.leftovers(node) == helpers.NOTHING
    finally:
        node.stop_daemon()


@pytest.mark.parametrize('ready_signal, ovn_installed, activate, missing', [
    ('active', True, False, 'active'),
    ('ovn-installed', False, True, 'installed by OVN'),
])
def test_ready_signal_waits_for_its_own_signal_only(
        node, br_int, runtime, ready_signal, ovn_installed, activate, missing):
    _ovn_node(node, br_int, 2, ready_signal)
    try:
        sandbox = _sandbox(node)
        with testneutron.StandInNeutron(node, br_int, ovn_installed=ovn_installed,
                                        activate=activate) as neutron:
            neutron.serve_kuryrport('default', POD)
            outcome = runtime.add(sandbox)
        # The other signal came (after the plug), and the ADD did not take it.
        assert list(neutron.installations if ovn_installed else neutron.activations) \
            == [fx.PORT_ID]
        assert outcome.error_code == 11, outcome
        assert outcome.output['msg'].startswith(
            'timed out waiting for the VIFs of pod default/%s (UID %s) to be %s'
            % (POD, UID, missing)), outcome.output
        assert runtime.delete(sandbox).ok
        assert br_int.ports('br-int') == set()
    finally:
        node.stop_daemon()


@pytest.mark.parametrize('vif_timeout', [20])
def test_linux_bridge_port_turns_active_only_once_plugged(node, vif_timeout, runtime):
    node.start_daemon(workers=2, vif_timeout=vif_timeout, extra=KURYRPORT)
    _kuryrport(node, fx.bridge_vif(active=False, bridge_name=testhost.BRIDGE,
                                   network=_network(testhost.SUBNET_PREFIX)))
    sandbox = _sandbox(node)
    _add_activated_by_neutron(node, runtime, sandbox, 'kuryrport')
    assert node.ping(sandbox.netns, testhost.GATEWAY)
    assert runtime.delete(sandbox).ok
    assert helpers.leftovers(node) == helpers.NOTHING


@pytest.mark.parametrize('vif_timeout', [20])
def test_annotation_source_plugs_before_its_vif_is_marked_active(node, vif_timeout, runtime):
    node.start_daemon(workers=2, vif_timeout=vif_timeout, extra=ANNOTATION)
    node.api.create_pod('default', POD, testhost.NODE, uid=UID,
                        annotations={'kuryr.openstack.org/vifs': json.dumps(
                            node.vifs(5, active=False))})
    sandbox = _sandbox(node)
    _add_activated_by_neutron(node, runtime, sandbox, 'annotation')
    assert node.ping(sandbox.netns, testhost.GATEWAY)
    [waiting] = wait.until(lambda: _events(node, 'CNIWaitingForActiveVIFs'), 10,
                           'the CNIWaitingForActiveVIFs Event')
    assert 'annotation' in waiting['message'] and 'Neutron' not in waiting['message']
    assert runtime.delete(sandbox).ok
    assert helpers.leftovers(node) == helpers.NOTHING


@pytest.mark.parametrize('vif_timeout', [2])
def test_a_port_never_active_fails_the_add_and_leaves_the_plug_for_the_del(
        node, vif_timeout, runtime):
    node.start_daemon(workers=2, vif_timeout=vif_timeout, extra=KURYRPORT)
    _kuryrport(node, fx.bridge_vif(active=False, bridge_name=testhost.BRIDGE,
                                   network=_network(testhost.SUBNET_PREFIX)))
    sandbox = _sandbox(node)
    started = time.monotonic()
    outcome = runtime.add(sandbox)
    took = time.monotonic() - started
    assert outcome.error_code == 11, outcome
    assert outcome.output['msg'] == (
        'timed out waiting for the VIFs of pod default/%s (UID %s) to be active '
        '(inactive: eth0 port %s)' % (POD, UID, fx.PORT_ID))
    assert vif_timeout <= took < vif_timeout + 5
    # Plugged, and recorded: the runtime's DEL is what removes it.
    host_end = owner_tag.host_ifname(sandbox.container_id, 'eth0')
    assert host_end in node.links()
    assert 'eth0' in node.links(sandbox.netns)
    [timed_out] = wait.until(lambda: _events(node, 'CNITimedOutWaitingForActiveVIFs'), 10,
                             'the CNITimedOutWaitingForActiveVIFs Event')
    assert timed_out['type'] == 'Warning'
    assert runtime.delete(sandbox).ok
    assert 'eth0' not in node.links(sandbox.netns)
    assert helpers.leftovers(node) == helpers.NOTHING


@pytest.mark.parametrize('vif_timeout', [30])
def test_a_del_of_the_waiting_sandbox_unplugs_it_and_fails_its_add(node, vif_timeout, runtime):
    node.start_daemon(workers=2, vif_timeout=vif_timeout, extra=KURYRPORT)
    _kuryrport(node, fx.bridge_vif(active=False, bridge_name=testhost.BRIDGE,
                                   network=_network(testhost.SUBNET_PREFIX)))
    sandbox = _sandbox(node)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        add = helpers.add_in_background(pool, node, runtime, sandbox)
        wait.until(lambda: 'eth0' in node.links(sandbox.netns), 10, 'the plug')
        started = time.monotonic()
        assert runtime.delete(sandbox).ok
        outcome = add.result(timeout=vif_timeout)
    assert time.monotonic() - started < 5         # not at its timeout
    assert outcome.error_code == 11, outcome
    assert 'was deleted while waiting for its VIFs to be active' in outcome.output['msg']
    assert 'eth0' not in node.links(sandbox.netns)
    assert helpers.leftovers(node) == helpers.NOTHING
