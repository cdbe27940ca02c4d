"""A pod's way from creation to its ADD answered, step by step, timed.

kubelet sends the ADD as soon as the pod's sandbox exists, before
kuryr-controller has done anything; :func:`start_pod` does the same (the
pod is created, the ADD sent at once) and watches, while the ADD runs, for
each step the parts take in turn: Neutron port created (by kuryr-controller),
KuryrPort written, plugged on br-int (by the daemon), ovn-installed on its
Interface (ovn-controller installed its flows), ACTIVE in Neutron (OVN bound
it), ``active`` patched into the KuryrPort (kuryr-controller saw it), ADD
answered. No step is waited for that has an event of its own to wait
on: these are observations, in the order they happened.
"""

import concurrent.futures
import dataclasses
import time

from tools.testbed import runtime as testruntime

STEPS = ('port created', 'KuryrPort written', 'plugged', 'ovn-installed', 'ACTIVE',
         'KuryrPort active', 'ADD answered')
POLL = 0.05


@dataclasses.dataclass
class Started:
    pod: dict
    sandbox: testruntime.Sandbox
    outcome: testruntime.Outcome
    at: dict                 # step -> seconds after the pod's creation
    port_id: str = None

    @property
    def name(self):
        return self.pod['metadata']['name']


def sandbox_of(node, pod, container_id=None):
    return testruntime.Sandbox(container_id or 'sandbox-%s-1' % pod['metadata']['name'],
                               node.pod_netns(), pod['metadata']['name'],
                               pod_uid=pod['metadata']['uid'])


def start_pod(stack, node, runtime, make_pod, wait_for=()):
    """Create a pod and ADD its sandbox at once; the ADD's outcome and each step's time
    (observed until the ADD answered and each of ``wait_for`` happened)."""
    started = time.monotonic()
    pod = make_pod()
    sandbox = sandbox_of(node, pod)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        add = pool.submit(runtime.add, sandbox)
        at, port_id = observe(stack, pod, started, {'ADD answered': add.done},
                              wait_for=wait_for)
        outcome = add.result()
    return Started(pod, sandbox, outcome, at, port_id)


def observe(stack, pod, started, ends, timeout=300, wait_for=()):
    """Each step of :data:`STEPS` before the last, and each of ``ends`` (``{step: whether it
    happened}``), as seconds after ``started`` (a ``time.monotonic()``), observed until every
    one of ``ends`` and of ``wait_for`` (steps) happened; ``(at, the pod's Neutron port ID)``."""
    at = {}
    port_id = None
    deadline = started + timeout
    while True:
        now = time.monotonic() - started
        for step, happened in ends.items():
            if step not in at and happened():
                at[step] = now
        if port_id is None:
            ports = stack.ports_of(pod['metadata']['uid'])
            if ports:
                port_id = ports[0]['id']
                at['port created'] = now
        if 'KuryrPort written' not in at or 'KuryrPort active' not in at:
            vif = (((stack.kuryrport(pod['metadata']['name']) or {}).get('status') or {})
                   .get('vifs', {}).get('eth0', {}).get('vif'))
            if vif:
                at.setdefault('KuryrPort written', now)
                if vif['versioned_object.data'].get('active'):
                    at.setdefault('KuryrPort active', now)
        if port_id and 'ovn-installed' not in at:
            interface = stack.plugged_interface(port_id)
            if interface is not None:
                at.setdefault('plugged', now)
                if interface.get('ovn-installed') == 'true':
                    at['ovn-installed'] = now
        if port_id and 'ACTIVE' not in at and stack.port(port_id)['status'] == 'ACTIVE':
            at['ACTIVE'] = now
        if all(step in at for step in ends) and all(step in at for step in wait_for):
            return at, port_id
        if time.monotonic() > deadline:
            raise AssertionError('after %d s, only %s of pod %s'
                                 % (timeout, at, pod['metadata']['name']))
        time.sleep(POLL)
