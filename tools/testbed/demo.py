"""``python -m tools.testbed.demo``: the daemon on this machine, without a cluster.

It builds a throwaway node (a network namespace with a bridge and a gateway), a
Kubernetes API stand-in that speaks the real list/watch protocol, pods with VIF
annotations and real pod namespaces, starts the real daemon inside the node,
and drives the real shim as a runtime would through the sandbox-replacement
race of DESIGN §1: ADD A fails, DEL A, ADD B, then a late retried DEL A, which
must leave pod B connected. Everything it made is removed at the end.
"""

import argparse
import json
import os
import sys
import time

from tools.testbed import host as testhost
from tools.testbed import runtime as testruntime

POD = 'web-0'


def say(message, *args):
    print('  ' + (message % args if args else message), flush=True)


def step(title):
    print('\n== ' + title, flush=True)


def run(workers):
    with testhost.Host(prefix='kc-demo') as node:
        step('Node %s: bridge %s, gateway %s (on the network\'s router)'
             % (node.ns, testhost.BRIDGE, testhost.GATEWAY))
        api = node.start_api()
        say('Kubernetes API stand-in at %s (inside the node namespace)', api.url)
        for index, name in ((10, 'web-1'), (11, 'web-2')):
            api.create_pod('default', name, testhost.NODE, uid='uid-' + name,
                           annotations={'kuryr.openstack.org/vifs': json.dumps(node.vifs(index))})
        pod = api.create_pod('default', POD, testhost.NODE, uid='uid-web-0-a',
                             annotations={'kuryr.openstack.org/vifs':
                                          json.dumps(node.vifs(5, active=False))})
        started = time.monotonic()
        node.start_daemon(workers=workers, vif_timeout=3)
        say('kuryr-cni-daemon ready in %.2f s with %d workers (READY=1 over NOTIFY_SOCKET)',
            time.monotonic() - started, workers)
        cache = os.path.join(node.workdir, 'cni-cache')
        runtime = testruntime.Runtime(node.socket, node.state_dir, cache,
                                      shim=node.install_shim())

        step('Two ordinary pods')
        for name in ('web-1', 'web-2'):
            sandbox = testruntime.Sandbox('sandbox-' + name, node.pod_netns(), name,
                                          pod_uid='uid-' + name)
            outcome, took = _timed(runtime.add, sandbox)
            if not outcome.ok:
                raise SystemExit('ADD %s failed: %s\n%s' % (name, outcome.output, node.log_tail()))
            address = outcome.output['ips'][0]['address']
            say('ADD %s -> %s in %.0f ms; pings gateway: %s', name, address, took * 1000,
                node.ping(sandbox.netns, testhost.GATEWAY))

        step('The race of DESIGN §1 on pod %s' % POD)
        a = testruntime.Sandbox('sandbox-A', node.pod_netns(), POD, pod_uid=pod['metadata']['uid'])
        b = testruntime.Sandbox('sandbox-B', node.pod_netns(), POD, pod_uid=pod['metadata']['uid'])
        outcome, took = _timed(runtime.add, a)
        say('1. ADD A fails (its VIF never became active): CNI code %s after %.1f s',
            outcome.error_code, took)
        say('2. DEL A (the runtime cleans up): exit %s', runtime.delete(a).code)
        api.set_vifs('default', POD, node.vifs(5, active=True))
        outcome, took = _timed(runtime.add, b)
        say('3. ADD B succeeds: %s in %.0f ms', outcome.output['ips'][0]['address'], took * 1000)
        say('   pod B pings its gateway: %s', node.ping(b.netns, testhost.GATEWAY))
        outcome = runtime.execute('DEL', a)
        say('4. DEL A, retried late: exit %s (success for the runtime, rejected inside)',
            outcome.code)
        connected = node.ping(b.netns, testhost.GATEWAY)
        say('   pod B still pings its gateway: %s', connected)
        say('   pod B eth0 addresses: %s', ', '.join(sorted(node.addresses(b.netns, 'eth0'))))

        step('Metrics (GET /metrics on the Prometheus port)')
        _, text = node.http_get(9655, '/metrics')
        for line in text.splitlines():
            if line.startswith('kuryr_cni_requests_total') and line.endswith(' 0.0'):
                continue    # every known label set is exported, mostly at 0
            if line.startswith(('kuryr_cni_stale_del_rejected_total',
                                'kuryr_cni_requests_total', 'kuryr_cni_sandbox_evictions_total',
                                'kuryr_cni_attachments ')):
                say(line)

        step('Cleaning up')
        others = [testruntime.Sandbox('sandbox-' + n, '', n) for n in ('web-1', 'web-2')]
        for sandbox in [b] + others:
            runtime.delete(sandbox)
        say('daemon stopped with SIGTERM: exit %s', node.stop_daemon())
        leftovers = [n for n in node.links() if n.startswith('kc')]
        say('host devices left: %s; bindings left: %s', leftovers or 'none',
            os.listdir(os.path.join(node.state_dir, 'bindings')) or 'none')
        return 0 if connected else 1


def _timed(fn, *args):
    started = time.monotonic()
    outcome = fn(*args)
    return outcome, time.monotonic() - started


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--workers', type=int, default=4)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print('the demo creates network namespaces: run it as root', file=sys.stderr)
        return 1
    return run(args.workers)


if __name__ == '__main__':
    sys.exit(main())
