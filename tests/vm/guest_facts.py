"""What the ``systemd`` guest holds for a set of sandboxes, in one round trip.

``python -m tests.vm.guest_facts [--ping ADDRESS] NETNS...``, run as
:mod:`tests.vm.guest_cni` is, prints one JSON object:

``netns``
    For each name: None when the namespace is gone, else its ``eth0`` (``ip -j
    -d addr``'s entry, or None) and, with ``--ping``, whether one ping of
    ADDRESS from it was answered.
``bindings``
    The running daemon's bindings (``GET /v1/pods``, as ``kuryr-cni-ctl list``
    asks), or the error when it cannot be asked.
``state``
    The names in the daemon's state directory: ``bindings``, ``locks``,
    ``del-queue``.
``host_vlans``
    The VLAN devices left in the guest's own namespace.
``cached``
    The container IDs of the runtime's cached results.
"""

import argparse
import json
import os
import subprocess

from kuryr_cni import ctl
from tests.vm import guest_cni
from tools.testbed import runtime as testruntime


def _ip_json(*args):
    proc = subprocess.run(['ip', '-j', *args], capture_output=True, text=True, timeout=60)
    return json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else None


def _netns(name, ping):
    if not os.path.exists('/run/netns/' + name):
        return None
    links = _ip_json('-n', name, '-d', 'addr', 'show', 'eth0')
    facts = {'eth0': links[0] if links else None}
    if ping:
        facts['ping'] = subprocess.run(
            ['ip', 'netns', 'exec', name, 'ping', '-c', '1', '-W', '5', ping],
            capture_output=True, timeout=60).returncode == 0
    return facts


def _listing(name):
    try:
        return sorted(os.listdir(os.path.join(guest_cni.STATE_DIR, name)))
    except FileNotFoundError:
        return []


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument('--ping')
    parser.add_argument('netns', nargs='*')
    args = parser.parse_args(argv)
    try:
        status, bindings = ctl.fetch(guest_cni.SOCKET, '/v1/pods')
        bindings = bindings if status == 200 else {'error': bindings}
    except OSError as exc:
        bindings = {'error': str(exc)}
    runtime = testruntime.Runtime(guest_cni.SOCKET, guest_cni.STATE_DIR, guest_cni.CACHE_DIR,
                                  shim=guest_cni.SHIM)
    print(json.dumps({
        'netns': {name: _netns(name, args.ping) for name in args.netns},
        'bindings': bindings,
        'state': {name: _listing(name) for name in ('bindings', 'locks', 'del-queue')},
        'host_vlans': [link['ifname'] for link in _ip_json('-d', 'link', 'show') or []
                       if link.get('linkinfo', {}).get('info_kind') == 'vlan'],
        'cached': sorted(entry['containerId'] for entry in runtime.cached()),
    }))


if __name__ == '__main__':
    main()
