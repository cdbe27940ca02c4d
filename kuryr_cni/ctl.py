"""``kuryr-cni-ctl``: the operator's view of a running daemon, over its socket.

Commands: ``status`` (workers, watcher sync, version), ``list`` (pods, owner
container IDs, attachments), ``show NAMESPACE/NAME`` (one binding in full) and
``stale-dels`` (the last rejected stale DELs with their reasons). Tables for
people, ``--json`` for scripts. Exit status 0 on success, 1 when the daemon
answers an error, 2 when it cannot be reached.
"""

import argparse
import datetime
import http.client
import json
import socket
import sys

DEFAULT_SOCKET = '/run/kuryr-cni/daemon.sock'


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__('kuryr-cni', timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def fetch(socket_path, path, timeout=10):
    conn = _UnixConnection(socket_path, timeout)
    try:
        conn.request('GET', path)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b'null')
    finally:
        conn.close()


def table(rows, headers):
    widths = [max([len(h)] + [len(str(r[i])) for r in rows]) for i, h in enumerate(headers)]
    lines = ['  '.join(h.upper().ljust(w) for h, w in zip(headers, widths))]
    lines += ['  '.join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows]
    return '\n'.join(line.rstrip() for line in lines)


def show_status(facts):
    return '\n'.join('%-15s %s' % (key + ':', facts[key]) for key in (
        'version', 'ready', 'alive', 'workers', 'watcher_synced', 'shutting_down', 'pods',
        'bindings') if key in facts)


def show_list(bindings):
    rows = []
    for binding in bindings:
        owner = binding.get('owner') or '-'
        sandbox = binding.get('sandboxes', {}).get(binding.get('owner'), {})
        attachments = ','.join(sorted(sandbox.get('attachments', {}))) or '-'
        others = len(binding.get('sandboxes', {})) - (1 if binding.get('owner') else 0)
        rows.append((binding['pod'], owner[:20], attachments, others))
    return table(rows, ('pod', 'owner', 'attachments', 'evicting'))


def show_binding(binding):
    lines = ['pod:    %s' % binding['pod'], 'owner:  %s' % (binding.get('owner') or '-'),
             'uid:    %s' % (binding.get('uid') or '-')]
    for cid, sandbox in sorted(binding.get('sandboxes', {}).items()):
        role = 'owner' if cid == binding.get('owner') else 'evicting'
        lines.append('sandbox %s (%s) netns %s' % (cid, role, sandbox.get('netns') or '-'))
        for key, attachment in sorted(sandbox.get('attachments', {}).items()):
            names = ', '.join(i['ifname'] for i in attachment['interfaces'])
            lines.append('  %s [%s]: %s' % (key, attachment['state'], names))
    return '\n'.join(lines)


def show_stale(entries):
    rows = [(datetime.datetime.fromtimestamp(e['time']).isoformat(timespec='seconds'),
             e['pod'], e['container_id'][:20], (e.get('owner') or '-')[:20], e['reason'])
            for e in entries]
    return table(rows, ('time', 'pod', 'rejected', 'owner', 'reason'))


COMMANDS = {
    'status': ('/v1/status', show_status),
    'list': ('/v1/pods', show_list),
    'show': (None, show_binding),
    'stale-dels': ('/v1/stale-dels', show_stale),
}


def parse_args(argv):
    parser = argparse.ArgumentParser(prog='kuryr-cni-ctl', description=__doc__.split('\n')[0])
    parser.add_argument('--socket', default=DEFAULT_SOCKET, help='daemon socket')
    parser.add_argument('--json', action='store_true', help='print JSON')
    # The options are accepted after the command too ("status --json").
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument('--socket', default=argparse.SUPPRESS, help='daemon socket')
    common.add_argument('--json', action='store_true', default=argparse.SUPPRESS,
                        help='print JSON')
    sub = parser.add_subparsers(dest='command', required=True)
    for name in COMMANDS:
        cmd = sub.add_parser(name, parents=[common])
        if name == 'show':
            cmd.add_argument('pod', help='NAMESPACE/NAME')
    return parser.parse_args(argv)


def main(argv=None, out=sys.stdout):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    path, render = COMMANDS[args.command]
    if args.command == 'show':
        pod = args.pod if '/' in args.pod else 'default/' + args.pod
        path = '/v1/pods/' + pod
    try:
        status, payload = fetch(args.socket, path)
    except (OSError, http.client.HTTPException) as exc:
        print('kuryr-cni-ctl: cannot reach the daemon at %s: %s' % (args.socket, exc),
              file=sys.stderr)
        return 2
    if status != 200:
        print('kuryr-cni-ctl: %s' % payload.get('error', payload), file=sys.stderr)
        return 1
    print(json.dumps(payload, indent=2, sort_keys=True) if args.json else render(payload),
          file=out)
    return 0


if __name__ == '__main__':
    sys.exit(main())
