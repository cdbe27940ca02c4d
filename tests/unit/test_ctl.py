"""``kuryr-cni-ctl``: its help, its version and where it finds the daemon's socket.

The daemon is played by a small HTTP server on a real unix socket in a
temporary directory; the commands' output against the real daemon is
checked in tests/functional/test_operations.py.
"""

import http.server
import json
import os
import socketserver
import subprocess
import sys
import threading

import pytest

from kuryr_cni import ctl
from kuryr_cni import version

CTL = os.path.join(os.path.dirname(sys.executable), 'kuryr-cni-ctl')


class _StandIn(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def daemon_socket(tmp_path):
    """A unix socket answering GET /v1/status with a few facts; yields its path."""
    path = str(tmp_path / 'daemon.sock')

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({'version': version.VERSION, 'ready': True}).encode()
            self.send_response(200 if self.path == '/v1/status' else 404)
            self.send_header('Content-Length', str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def address_string(self):
            return 'unix'

        def log_message(self, *args):
            pass

    server = _StandIn(path, Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield path
    server.shutdown()
    server.server_close()
    thread.join(5)


def _run(*args):
    return subprocess.run([CTL, *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def test_help_is_plain_text_naming_every_command_and_the_default_socket():
    proc = _run('--help')
    assert proc.returncode == 0
    text = proc.stdout
    for markup in ('``', ':mod:', ':doc:', '.. '):
        assert markup not in text, markup
    for name, (_path, _render, what) in ctl.COMMANDS.items():
        assert name in text
        assert ' '.join(what.split()[:3]) in ' '.join(text.split()), name
    assert ctl.DEFAULT_SOCKET in text and '--config-file' in text


def test_each_command_has_its_own_help():
    proc = _run('show', '--help')
    assert proc.returncode == 0
    assert 'NAMESPACE/NAME' in proc.stdout and 'default namespace' in proc.stdout


def test_version_is_the_one_version():
    proc = _run('--version')
    assert (proc.returncode, proc.stdout) == (0, 'kuryr-cni-ctl %s\n' % version.VERSION)


def test_the_socket_comes_from_the_daemon_config_file(tmp_path, daemon_socket):
    conf = tmp_path / 'kuryr-cni.conf'
    conf.write_text('[cni_daemon]\nsocket = %s\n' % daemon_socket)
    proc = _run('--config-file', str(conf), 'status', '--json')
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {'version': version.VERSION, 'ready': True}
    # After the command as well, like --json.
    assert _run('status', '--config-file', str(conf)).returncode == 0


def test_socket_wins_over_the_config_file(tmp_path, daemon_socket):
    conf = tmp_path / 'kuryr-cni.conf'
    conf.write_text('[cni_daemon]\nsocket = %s\n' % (tmp_path / 'elsewhere.sock'))
    args = ctl.parse_args(['--config-file', str(conf), '--socket', daemon_socket, 'status'])
    assert ctl.socket_path(args) == daemon_socket
    assert ctl.socket_path(ctl.parse_args(['--config-file', str(conf), 'status'])) == str(
        tmp_path / 'elsewhere.sock')
    assert ctl.socket_path(ctl.parse_args(['status'])) == ctl.DEFAULT_SOCKET


def test_an_unreadable_config_file_is_one_line_and_status_2(tmp_path):
    missing = tmp_path / 'missing.conf'
    proc = _run('--config-file', str(missing), 'status')
    assert proc.returncode == 2
    assert proc.stderr == 'kuryr-cni-ctl: configuration error: %s: no such file, or not ' \
        'readable\n' % missing


def test_an_absent_daemon_is_status_2(tmp_path):
    proc = _run('--socket', str(tmp_path / 'none.sock'), 'status')
    assert proc.returncode == 2
    assert 'cannot reach the daemon at %s' % (tmp_path / 'none.sock') in proc.stderr


def test_queued_dels_lists_the_failing_entries_with_their_last_error():
    entry = {'entry': '1700000000000000000-42.json', 'pod': 'default/web-0',
             'container_id': 'a' * 64, 'ifname': 'eth0', 'failing_since': 1700000000,
             'attempts': 7, 'next_try': 1700000060, 'error': 'OVSDB: not allowed (code 101)'}
    text = ctl.show_queued({'failing': 3, 'entries': [entry]})
    header, row, more = text.splitlines()
    assert header.split()[:4] == ['ENTRY', 'POD', 'SANDBOX', 'ATTEMPTS']
    assert row.startswith('1700000000000000000-42.json  default/web-0  ' + 'a' * 20 + '  7 ')
    assert row.endswith('OVSDB: not allowed (code 101)')
    assert more == '... and 2 more'
