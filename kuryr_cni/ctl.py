"""``kuryr-cni-ctl``: the operator's view of a running daemon, over its socket.

Commands: ``status`` (workers, watcher sync, version), ``list`` (pods, owner
container IDs, attachments), ``show NAMESPACE/NAME`` (one binding in full),
``stale-dels`` (the last rejected stale DELs with their reasons) and
``queued-dels`` (queued DELs whose replay fails, retried with back-off). Tables for
people, ``--json`` for scripts. The socket is ``--socket``, else ``[cni_daemon]
socket`` of the daemon's ``--config-file``, else the default. Exit status 0 on
success, 1 when the daemon answers an error, 2 when it cannot be reached or
its configuration cannot be read.
"""

import argparse
import datetime
import http.client
import json
import socket
import sys

from kuryr_cni import conf as config
from kuryr_cni import version

DEFAULT_SOCKET = '/run/kuryr-cni/daemon.sock'

DESCRIPTION = """\
Ask the running kuryr-cni daemon what it holds, over its unix socket (root
only). Every command prints a table for people, or JSON with --json.
"""

EPILOG = """\
exit status: 0 success, 1 the daemon answered an error (for instance no such
pod), 2 the daemon cannot be reached or its configuration cannot be read.
"""


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
        'bindings', 'queued_dels_failing') if key in facts)


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


def show_queued(queued):
    rows = [(e['entry'], e.get('pod') or '-', e['container_id'][:20], e['attempts'],
             _when(e['failing_since']), _when(e['next_try']), e['error'])
            for e in queued['entries']]
    lines = [table(rows, ('entry', 'pod', 'sandbox', 'attempts', 'failing since',
                          'next try', 'error'))]
    if queued['failing'] > len(rows):
        lines.append('... and %d more' % (queued['failing'] - len(rows)))
    return '\n'.join(lines)


def show_adoptions(entries):
    rows = [(_when(e['time']), e['pod'], (e.get('container_id') or '-')[:20], e['result'],
             e['reason'], e['kind'], e['devices'], e.get('detail') or '')
            for e in entries]
    return table(rows, ('time', 'pod', 'sandbox', 'result', 'reason', 'kind', 'devices',
                        'detail'))


def _when(timestamp):
    return datetime.datetime.fromtimestamp(timestamp).isoformat(timespec='seconds')


COMMANDS = {
    # name: (path, renderer, what it shows)
    'status': ('/v1/status', show_status,
               'version, readiness, serving CNI workers, watcher sync, pods and bindings'),
    'list': ('/v1/pods', show_list,
             'one line per pod binding: owner sandbox, attachments, sandboxes being evicted'),
    'show': (None, show_binding,
             'one binding in full: owner, pod UID, every sandbox with its namespace and '
             'attachments'),
    'stale-dels': ('/v1/stale-dels', show_stale,
                   'the last rejected stale DELs, with the owner at the time and the reason'),
    'adoptions': ('/v1/adoptions', show_adoptions,
                  'what kuryr-daemon plugged that was found: adopted, removed (evicted by a '
                  'new sandbox, or without pod end) or left alone, and why'),
    'queued-dels': ('/v1/queued-dels', show_queued,
                    'DELs the shim queued whose replay fails: since when, how often, the '
                    'last error and the next try'),
}


def parse_args(argv):
    parser = argparse.ArgumentParser(prog='kuryr-cni-ctl', description=DESCRIPTION,
                                     epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--version', action='version', version='%(prog)s ' + version.VERSION)
    # The options are accepted after the command too ("status --json"); there
    # they must not reset what was given before it.
    common = argparse.ArgumentParser(add_help=False)
    for target, unset in ((parser, None), (common, argparse.SUPPRESS)):
        target.add_argument('--socket', default=unset, metavar='PATH',
                            help='the daemon socket (default: [cni_daemon] socket of '
                                 '--config-file, else %s)' % DEFAULT_SOCKET)
        target.add_argument('--config-file', default=unset, metavar='PATH',
                            help="the daemon's configuration file, to read [cni_daemon] "
                                 "socket from")
        target.add_argument('--json', action='store_true',
                            default=False if unset is None else unset,
                            help='print JSON instead of a table')
    sub = parser.add_subparsers(dest='command', required=True, metavar='COMMAND')
    for name, (_path, _render, what) in COMMANDS.items():
        cmd = sub.add_parser(name, parents=[common], help=what, description=what[0].upper()
                             + what[1:] + '.')
        if name == 'show':
            cmd.add_argument('pod', metavar='NAMESPACE/NAME',
                             help='the pod; a bare NAME means the default namespace')
    return parser.parse_args(argv)


def socket_path(args):
    """--socket, else the daemon config's [cni_daemon] socket, else the default."""
    if args.socket:
        return args.socket
    if args.config_file:
        return config.load(['--config-file', args.config_file],
                           prog='kuryr-cni-ctl').cni_daemon.socket
    return DEFAULT_SOCKET


def main(argv=None, out=sys.stdout):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    path, render, _what = COMMANDS[args.command]
    if args.command == 'show':
        pod = args.pod if '/' in args.pod else 'default/' + args.pod
        path = '/v1/pods/' + pod
    try:
        sock = socket_path(args)
    except config.ConfigError as exc:
        print('kuryr-cni-ctl: configuration error: %s' % exc, file=sys.stderr)
        return 2
    try:
        status, payload = fetch(sock, path)
    except (OSError, http.client.HTTPException) as exc:
        print('kuryr-cni-ctl: cannot reach the daemon at %s: %s' % (sock, exc),
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
