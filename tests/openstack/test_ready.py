"""The ADD answers once the pod's network is in force: traffic flows, security groups hold.

A probe (:mod:`tests.openstack.probe`) waits, ready, in three pods: the new
pod B (a TCP echo server), a peer A its security group lets in, and a peer C
it keeps out. The instant B's ADD returns, A and C start pinging B (every
10 ms) and connecting to it: A must lose nothing, not even its first echo
request nor its first SYN; C must get nothing through. Pings sent before
B's flows (its ACLs included) are in ovs-vswitchd would be lost. Both ready
signals are run, and how long each keeps the pod waiting after its plug is
recorded. Here ovn-controller installs a port's flows some 30 ms after its
Interface appears, before the plug itself is done (the pod's side is
configured after the OVS port), so a daemon answering on the plug alone
passes those two by luck: the third case holds ovn-controller (SIGSTOP)
from the plug for :data:`HOLD` seconds, as a loaded node's ovn-controller
lags, and that daemon fails it.
"""

import concurrent.futures
import ipaddress
import json
import os
import subprocess
import sys
import time

import pytest

from tests import wait
from tests.openstack import conftest
from tests.openstack import steps

PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'probe.py')
PROBE_TIMEOUT = 30
HOLD = 1.5      # seconds ovn-controller is held from the plug on, in the third case


def _probe(pod_netns, *args):
    proc = subprocess.Popen(['ip', 'netns', 'exec', os.path.basename(pod_netns),
                             sys.executable, PROBE, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line == 'ready\n', (line, proc.stderr.read(2000) if proc.poll() is not None else '')
    return proc


def _address(stack, started):
    return stack.port(started.port_id)['fixed_ips'][0]['ip_address']


def _only_from(stack, address):
    """Make the pods' security group admit ingress from ``address`` alone; undo it."""
    group = stack.env['SECURITY_GROUP']
    rules = stack.neutron('GET', '/security-group-rules?security_group_id=' + group)
    [wide] = [r for r in rules['security_group_rules'] if r['direction'] == 'ingress'
              and r['remote_ip_prefix'] == stack.env['POD_CIDR']]
    narrow = stack.neutron('POST', '/security-group-rules', {'security_group_rule': {
        'security_group_id': group, 'project_id': stack.env['PROJECT'],
        'direction': 'ingress', 'ethertype': 'IPv4', 'remote_ip_prefix': address + '/32'}}
    )['security_group_rule']
    stack.neutron('DELETE', '/security-group-rules/' + wide['id'])

    def undo():
        stack.neutron('POST', '/security-group-rules', {'security_group_rule': {
            'security_group_id': group, 'project_id': stack.env['PROJECT'],
            'direction': 'ingress', 'ethertype': 'IPv4',
            'remote_ip_prefix': stack.env['POD_CIDR']}})
        stack.neutron('DELETE', '/security-group-rules/' + narrow['id'])
    return undo


def _release_after_plug(stack, interfaces, others):
    """Let ovn-controller go on :data:`HOLD` s after a port not in ``others`` is plugged."""
    wait.until(lambda: set(interfaces.plugged) - others, 120, 'the new pod\'s plug', 0.005)
    time.sleep(HOLD)    # the lag being simulated, not a wait for an event
    stack.release('ovn-controller')


@pytest.mark.parametrize('ready_signal, held', [('first', False), ('active', False),
                                                ('first', True)])
def test_traffic_and_security_groups_are_in_force_the_instant_the_add_answers(
        stack, node, runtime, pods, ready_signal, held):
    node.stop_daemon()
    node.start_daemon(extra='\n[cni_daemon]\nready_signal = %s\n' % ready_signal)
    a = steps.start_pod(stack, node, runtime, pods)
    c = steps.start_pod(stack, node, runtime, pods)
    assert a.outcome.ok and c.outcome.ok, (a.outcome.output, c.outcome.output)
    for peer in (a, c):
        stack.checksum_offload_off(peer.sandbox.netns)
    undo = _only_from(stack, _address(stack, a))
    probes = []
    try:
        # Every hypervisor (this node's ovn-controller) has the narrowed group in force.
        stack.nbctl('--wait=hv', 'sync')
        assert not node.ping(c.sandbox.netns, _address(stack, a), count=1, wait=1)

        started = time.monotonic()
        pod = pods()
        sandbox = steps.sandbox_of(node, pod)
        server = _probe(sandbox.netns, 'server')
        allowed, denied = (_probe(peer.sandbox.netns, 'client') for peer in (a, c))
        probes += [server, allowed, denied]
        answered = []

        def add_then_probe():
            outcome = runtime.add(sandbox)
            answered.append(time.monotonic())
            if outcome.ok:
                address = str(ipaddress.ip_interface(outcome.output['ips'][0]['address']).ip)
                server.stdin.write('go\n')
                server.stdin.flush()
                assert server.stdout.readline() == 'go\n'
                for client in (allowed, denied):
                    client.stdin.write(address + '\n')
                    client.stdin.flush()
            return outcome

        with stack.watch_interfaces() as interfaces, \
                concurrent.futures.ThreadPoolExecutor(2) as pool:
            if held:
                stack.hold('ovn-controller')
                pool.submit(_release_after_plug, stack, interfaces, {a.port_id, c.port_id})
            add = pool.submit(add_then_probe)
            at, port_id = steps.observe(stack, pod, started, {'ADD answered': add.done},
                                        wait_for=('ovn-installed', 'ACTIVE',
                                                  'KuryrPort active'))
            outcome = add.result()
        assert outcome.ok, (outcome.output, node.log_tail())
        seen = {name: json.loads(proc.communicate(timeout=PROBE_TIMEOUT)[0])
                for name, proc in (('allowed', allowed), ('denied', denied))}
        server.stdin.close()
        server.wait(PROBE_TIMEOUT)

        # To the millisecond from OVSDB's own stream; KuryrPort active as polled (~0.1 s).
        plugged, installed = interfaces.plugged[port_id], interfaces.installed[port_id]
        case = ready_signal + (', ovn-controller held %g s' % HOLD if held else '')
        for what, seconds in (('ovn-installed', installed - plugged),
                              ('ADD answered', answered[0] - plugged),
                              ('KuryrPort active (polled)',
                               at['KuryrPort active'] - (plugged - started))):
            conftest.record('ready_signal=%s: plugged -> %s' % (case, what), seconds)
        conftest.record('ready_signal=%s: first echo reply after ADD' % case,
                        seen['allowed']['first_reply'])
        # The admitted peer: every echo request answered, the first SYN accepted.
        assert seen['allowed']['lost'] == [], seen
        assert seen['allowed']['received'] == seen['allowed']['sent'] == 100, seen
        assert seen['allowed']['connected'] and seen['allowed']['echo'] == 'probe', seen
        # The peer B's group keeps out: nothing through, from the first packet on.
        assert seen['denied']['received'] == 0 and not seen['denied']['connected'], seen
        # And the ADD answered on its signal, not before.
        signal = 'ovn-installed' if ready_signal == 'first' else 'KuryrPort active'
        assert at['plugged'] <= at[signal] <= at['ADD answered'], at
    finally:
        stack.release('ovn-controller')      # held or not: a SIGCONT is harmless
        for proc in probes:
            proc.kill()
            proc.wait(10)
        undo()
        stack.nbctl('--wait=hv', 'sync')
