"""Tests of shim/kuryr-cni, the CNI executable (DESIGN.md 4.1 and 4.2).

Two ways in: the real file executed as the runtime executes it (through its
``#!`` line, with nothing but the CNI_* variables in the environment), and its
``dispatch(env, stdin_bytes, stdout)`` loaded in-process for table-driven cases.

The daemon here is a FAKE, on purpose: this unit is the shim's side of the
shim <-> daemon protocol, so a tiny threaded HTTP server on a unix socket under
``tmp_path`` records exactly what the shim sent and answers canned bytes,
including the broken answers a real daemon should never give (garbage, a
truncated body, silence). The daemon's side of the same protocol is tested
against the real daemon elsewhere. The server parses requests with the
standard library's http.server, so it also checks that the hand-written
HTTP/1.1 of the shim is well-formed.
"""

import http.server
import importlib.machinery
import importlib.util
import io
import json
import os
import pathlib
import socket
import socketserver
import stat
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

SHIM = pathlib.Path(__file__).resolve().parents[2] / 'shim' / 'kuryr-cni'
SYSTEM_PYTHON = '/usr/bin/python3'
VERSIONS = ('0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0')
FORWARDED = {'ADD': '/addNetwork', 'DEL': '/delNetwork', 'CHECK': '/checkNetwork',
             'GC': '/gc', 'STATUS': '/status'}
ENV_KEYS = ('CNI_COMMAND', 'CNI_CONTAINERID', 'CNI_NETNS', 'CNI_IFNAME', 'CNI_ARGS',
            'CNI_PATH')
# The only modules the shim may add to what the bare interpreter loads.
IMPORT_ALLOW_LIST = {'_json', '_socket'}
ADD_RESULT = (b'{"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": '
              b'"/var/run/netns/x"}], "ips": [{"address": "10.10.0.5/24", "interface": 0}]}')


def load_shim(name='kuryr_cni_shim'):
    """Import the shim file as a module, without leaving bytecode behind."""
    loader = importlib.machinery.SourceFileLoader(name, str(SHIM))
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = saved
    return module


shim = load_shim()


# --- the fake daemon ----------------------------------------------------------------


def http_response(status, body=b'', headers=None, reason='X'):
    """Raw bytes of a Content-Length framed HTTP/1.1 response."""
    head = ['HTTP/1.1 %d %s' % (status, reason)]
    headers = {'Content-Length': str(len(body)), **(headers or {})}
    head += ['%s: %s' % item for item in headers.items() if item[1] is not None]
    return '\r\n'.join(head).encode() + b'\r\n\r\n' + body


def chunked_response(status, chunks, trailer=b''):
    parts = [b'HTTP/1.1 %d OK\r\nTransfer-Encoding: chunked\r\n\r\n' % status]
    for chunk in chunks:
        parts.append(b'%x;ext=1\r\n%s\r\n' % (len(chunk), chunk))
    parts.append(b'0\r\n' + trailer + b'\r\n')
    return b''.join(parts)


def cni_error(code, msg='boom', version='1.0.0'):
    return json.dumps({'cniVersion': version, 'code': code, 'msg': msg,
                       'details': 'from the daemon'}, indent=1).encode()


class Recorded:
    def __init__(self, handler, body):
        self.method = handler.command
        self.path = handler.path
        self.version = handler.request_version
        self.headers = handler.headers.items()
        self.body = body

    def header(self, name):
        values = [v for k, v in self.headers if k.lower() == name.lower()]
        assert len(values) == 1, (name, self.headers)
        return values[0]


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'

    def do_POST(self):
        body = self.rfile.read(int(self.headers['Content-Length']))
        fake = self.server.fake
        fake.requests.append(Recorded(self, body))
        reply = fake.reply
        if callable(reply):
            reply(self, fake.release)
        else:
            self.wfile.write(reply)
            self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args):
        pass


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    block_on_close = False

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], OSError):   # the shim hanging up is expected
            super().handle_error(request, client_address)


def hang(handler, release):
    """Read the request, never answer (until the test ends)."""
    release.wait(30)


def trickle(handler, release):
    """Answer one byte every 50 ms (~2 s in all): no single recv ever times out."""
    for byte in http_response(200, b'{}'):
        if release.wait(0.05):
            return
        try:
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
        except OSError:
            return


class FakeDaemon:
    def __init__(self, path):
        self.path = str(path)
        self.requests = []
        self.reply = http_response(204)
        self.release = threading.Event()
        self._server = _Server(self.path, _Handler)
        self._server.fake = self
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={'poll_interval': 0.05}, daemon=True)
        self._thread.start()

    def stop(self):
        """Stop serving; the socket file stays, as a crashed daemon's would."""
        self.release.set()
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(5)
        self._server.server_close()
        assert not self._thread.is_alive()


@pytest.fixture
def daemon(tmp_path):
    fake = FakeDaemon(tmp_path / 'd.sock')
    yield fake
    fake.stop()


@pytest.fixture
def stale_socket(tmp_path):
    """A socket file nobody listens on: connect() gets ECONNREFUSED."""
    path = tmp_path / 'stale.sock'
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()
    return str(path)


# --- helpers ------------------------------------------------------------------------------


def config(tmp_path, version='1.0.0', **extra):
    conf = {'cniVersion': version, 'name': 'kuryr', 'type': 'kuryr-cni',
            'daemon_socket': str(tmp_path / 'd.sock'),
            'state_dir': str(tmp_path / 'state'), 'timeout': 5}
    conf.update(extra)
    return conf


def cni_env(command, **overrides):
    env = {'CNI_COMMAND': command, 'CNI_CONTAINERID': 'c0ffee', 'CNI_NETNS': '/var/run/netns/x',
           'CNI_IFNAME': 'eth0', 'CNI_PATH': '/opt/cni/bin',
           'CNI_ARGS': 'IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=pod'}
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


def expected_body(command, env, conf):
    body = {key: env.get(key, '') for key in ENV_KEYS}
    body['CNI_COMMAND'] = command
    body['config'] = conf
    return body


def run_dispatch(env, stdin):
    if isinstance(stdin, dict):
        stdin = json.dumps(stdin).encode()
    out = io.BytesIO()
    status = shim.dispatch(env, stdin, out)
    return status, out.getvalue()


def run_shim(env, stdin=b''):
    """Execute the shim file as the runtime does; it must never write to stderr."""
    if isinstance(stdin, dict):
        stdin = json.dumps(stdin).encode()
    proc = subprocess.run([str(SHIM)], input=stdin, env=env, capture_output=True, timeout=30)
    assert proc.stderr == b'', proc.stderr.decode(errors='replace')
    return proc


def assert_error(status, out, code, version='1.1.0'):
    assert status == 1, out
    error = json.loads(out)
    assert set(error) == {'cniVersion', 'code', 'msg', 'details'}, error
    assert error['code'] == code, error
    assert error['cniVersion'] == version, error
    assert isinstance(error['msg'], str) and error['msg']
    return error


def queue_files(tmp_path):
    directory = tmp_path / 'state' / 'del-queue'
    return sorted(directory.iterdir()) if directory.exists() else []


# --- the executable itself --------------------------------------------------------------


def test_file_is_executable_with_system_interpreter_line():
    assert SHIM.stat().st_mode & 0o777 == 0o755
    # "-I -S" would reach Python as ONE argument on Linux, which it refuses.
    assert SHIM.read_bytes().split(b'\n', 1)[0] == b'#!/usr/bin/python3 -IS'


@pytest.mark.parametrize('version', VERSIONS)
def test_version_executed_answers_requested_version_without_daemon(tmp_path, version):
    proc = run_shim({'CNI_COMMAND': 'VERSION'}, config(tmp_path, version))
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == {'cniVersion': version, 'supportedVersions': list(VERSIONS)}
    assert not (tmp_path / 'd.sock').exists()


@pytest.mark.parametrize('stdin', [b'', b'{"cniVersion": "0.2.0"}', b'{"cniVersion": 1}',
                                   b'{}', b'not json', b'[]'])
def test_version_executed_defaults_to_newest(stdin):
    proc = run_shim({'CNI_COMMAND': 'VERSION'}, stdin)
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == {'cniVersion': '1.1.0', 'supportedVersions': list(VERSIONS)}


def test_version_executed_with_stdin_closed():
    proc = subprocess.run([str(SHIM)], stdin=subprocess.DEVNULL, env={'CNI_COMMAND': 'VERSION'},
                          capture_output=True, timeout=30)
    assert (proc.returncode, proc.stderr) == (0, b'')
    assert json.loads(proc.stdout)['cniVersion'] == '1.1.0'


def _imported_modules(argv, env, stdin):
    proc = subprocess.run([SYSTEM_PYTHON, '-IS', '-X', 'importtime'] + argv, input=stdin,
                          env=env, capture_output=True, timeout=30)
    names = set()
    for line in proc.stderr.decode().splitlines():
        assert line.startswith('import time:'), line   # nothing but the import log
        names.add(line.rsplit('|', 1)[1].strip())
    names.discard('imported package')
    return proc, names


@pytest.mark.parametrize('command, change, exit_status', [
    ('VERSION', {}, 0),
    ('ADD', {}, 0),
    ('DEL', {'daemon_socket': '/nonexistent/d.sock'}, 0),   # queued
    ('ADD', {'timeout': 'soon'}, 1),
])
def test_imports_stay_within_allow_list(tmp_path, daemon, command, change, exit_status):
    """Start-up cost is paid per pod: no module beyond a tiny allow-list.

    Compared with the same interpreter running an empty file. (A timed
    assertion would be flaky; this one cannot silently grow.)
    """
    empty = tmp_path / 'empty.py'
    empty.write_text('')
    _proc, baseline = _imported_modules([str(empty)], {}, b'')
    daemon.reply = http_response(200, ADD_RESULT)
    stdin = json.dumps(config(tmp_path, **change)).encode()
    proc, names = _imported_modules([str(SHIM)], cni_env(command), stdin)
    assert proc.returncode == exit_status, proc.stdout
    assert names - baseline <= IMPORT_ALLOW_LIST, sorted(names - baseline)
    assert {'json', 'socket', 'os', 're', 'enum'}.isdisjoint(names)
    if command == 'VERSION':   # answered alone: no socket module at all
        assert '_socket' not in names
    if command == 'DEL':
        assert len(queue_files(tmp_path)) == 1


# --- forwarding: what the daemon receives ---------------------------------------------------


@pytest.mark.parametrize('version', VERSIONS)
@pytest.mark.parametrize('command', sorted(FORWARDED))
def test_forwarded_request_path_headers_and_exact_body(tmp_path, daemon, command, version):
    conf = config(tmp_path, version, prevResult={'cniVersion': version, 'ips': []})
    env = cni_env(command)
    expected_out = ADD_RESULT if command == 'ADD' else b''
    daemon.reply = http_response(200, ADD_RESULT) if command == 'ADD' else http_response(204)
    assert run_dispatch(env, conf) == (0, expected_out)
    [request] = daemon.requests
    assert (request.method, request.version) == ('POST', 'HTTP/1.1')
    assert request.path == FORWARDED[command]
    assert request.header('Host') == 'kuryr-cni'
    assert request.header('Content-Type') == 'application/json'
    assert request.header('Connection') == 'close'
    assert int(request.header('Content-Length')) == len(request.body)
    assert json.loads(request.body) == expected_body(command, env, conf)


def test_config_is_forwarded_as_written(tmp_path, daemon):
    # Key order, layout, escapes and numbers no float can hold arrive untouched.
    stdin = ('\n  {"type": "kuryr-cni", "cniVersion": "1.0.0", "z": 1e400,'
             ' "f": 0.1000000000000000055, "n": 123456789012345678901234567890,'
             ' "u": "\u00e9\\u00e9", "daemon_socket": "%s"}\n' % daemon.path).encode()
    assert run_dispatch(cni_env('CHECK'), stdin) == (0, b'')
    [request] = daemon.requests
    assert request.body.endswith(b'"config":' + stdin.strip() + b'}')


@pytest.mark.parametrize('command', sorted(FORWARDED))
def test_executed_forwarding_with_empty_and_absent_env(tmp_path, daemon, command):
    # Runtimes export every variable, empty ones too; the second DEL has no netns.
    env = {'CNI_COMMAND': command, 'CNI_CONTAINERID': 'c0ffee', 'CNI_NETNS': '',
           'CNI_IFNAME': '', 'CNI_ARGS': ''}
    conf = config(tmp_path)
    if command == 'ADD':
        daemon.reply = http_response(200, ADD_RESULT)
    proc = run_shim(env, conf)
    assert (proc.returncode, proc.stdout) == (0, ADD_RESULT if command == 'ADD' else b'')
    [request] = daemon.requests
    body = json.loads(request.body)
    assert body == expected_body(command, env, conf)
    assert body['CNI_NETNS'] == body['CNI_IFNAME'] == body['CNI_ARGS'] == body['CNI_PATH'] == ''


def test_empty_env_values_count_as_absent(tmp_path, daemon):
    env = {'CNI_COMMAND': 'DEL', 'CNI_CONTAINERID': '', 'CNI_NETNS': ''}
    assert run_dispatch(env, config(tmp_path)) == (0, b'')
    body = json.loads(daemon.requests[0].body)
    assert all(body[key] == '' for key in ENV_KEYS[1:])


def test_executed_add_prints_result(tmp_path, daemon):
    daemon.reply = http_response(200, ADD_RESULT)
    proc = run_shim(cni_env('ADD'), config(tmp_path))
    assert (proc.returncode, proc.stdout) == (0, ADD_RESULT)


@pytest.mark.parametrize('reply', [
    chunked_response(200, [ADD_RESULT[:7], ADD_RESULT[7:50], ADD_RESULT[50:]]),
    chunked_response(200, [ADD_RESULT], trailer=b'X-Trailer: 1\r\n'),
    b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n' + ADD_RESULT,
    b'HTTP/1.0 200 OK\r\ncontent-length: %d\r\n\r\n%s' % (len(ADD_RESULT), ADD_RESULT),
    b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n'
    + b'%X\r\n%s\r\n0\r\n\r\n' % (len(ADD_RESULT), ADD_RESULT),
], ids=['chunked', 'chunked-trailer', 'until-close', 'http1.0-lowercase', 'chunked-wins'])
def test_response_framings(tmp_path, daemon, reply):
    daemon.reply = reply
    assert run_dispatch(cni_env('ADD'), config(tmp_path)) == (0, ADD_RESULT)


@pytest.mark.parametrize('command', sorted(FORWARDED))
@pytest.mark.parametrize('status', [400, 404, 409, 413, 500, 503])
def test_daemon_error_is_printed_unchanged(tmp_path, daemon, command, status):
    daemon.reply = http_response(status, cni_error(7, version='0.4.0'))
    out_status, out = run_dispatch(cni_env(command), config(tmp_path))
    assert (out_status, out) == (1, cni_error(7, version='0.4.0'))
    assert queue_files(tmp_path) == []


def test_executed_daemon_error_is_printed_unchanged(tmp_path, daemon):
    daemon.reply = http_response(400, cni_error(4, 'K8S_POD_NAME missing'))
    proc = run_shim(cni_env('ADD'), config(tmp_path))
    assert (proc.returncode, proc.stdout) == (1, cni_error(4, 'K8S_POD_NAME missing'))


@pytest.mark.parametrize('command', ['DEL', 'CHECK', 'GC', 'STATUS'])
def test_200_body_is_printed(tmp_path, daemon, command):
    daemon.reply = http_response(200, b'{}')
    assert run_dispatch(cni_env(command), config(tmp_path)) == (0, b'{}')


@pytest.mark.parametrize('reply', [
    b'garbage\r\n\r\n',
    b'HTTP/1.1 200 OK\r\n',                                        # cut in the headers
    b'HTTP/1.1 OK 200\r\nContent-Length: 0\r\n\r\n',
    b'HTTP/1.1 099 X\r\nContent-Length: 0\r\n\r\n',
    b'HTTP/1.1 100 Continue\r\n\r\n',
    http_response(200, b'not json'),
    http_response(200, b'[1, 2]'),
    b'HTTP/1.1 204 No Content\r\n\r\n',                            # ADD needs a result
    http_response(500, b'Internal Server Error'),
    http_response(503, b'{"msg": "no code"}'),
    http_response(400, b'{"code": "7"}'),
    http_response(400, b'{"code": true}'),
    http_response(302, b'{"code": 7}', {'Location': '/x'}),
    http_response(201, ADD_RESULT),
    http_response(200, ADD_RESULT, {'Content-Length': str(len(ADD_RESULT) + 10)}),
    http_response(200, ADD_RESULT, {'Content-Length': '-1'}),
    http_response(200, ADD_RESULT, {'Content-Length': '0x10'}),
    b'HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{} ',
    b'HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n' + ADD_RESULT,
    b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabc',
    b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n',
    b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n',
    b'HTTP/1.1 200 OK\r\n Folded: header\r\nContent-Length: 2\r\n\r\n{}',
    b'HTTP/1.1 200 OK\r\nNoColon\r\nContent-Length: 2\r\n\r\n{}',
    b'',                                                            # closed at once
])
def test_malformed_response_is_try_again_later(tmp_path, daemon, reply):
    daemon.reply = reply
    status, out = run_dispatch(cni_env('ADD'), config(tmp_path, '0.4.0'))
    error = assert_error(status, out, 11, '0.4.0')
    assert 'malformed' in error['msg']


def test_response_size_is_bounded(tmp_path, daemon):
    daemon.reply = http_response(200, b'{"a": "%s"}' % (b'x' * (5 * 1024 * 1024)))
    error = assert_error(*run_dispatch(cni_env('ADD'), config(tmp_path)), 11, '1.0.0')
    assert 'larger than' in error['details']


def test_malformed_response_to_del_is_not_queued(tmp_path, daemon):
    daemon.reply = b'garbage\r\n\r\n'
    assert_error(*run_dispatch(cni_env('DEL'), config(tmp_path)), 11, '1.0.0')
    assert queue_files(tmp_path) == []


# --- the daemon out of reach ----------------------------------------------------------


@pytest.mark.parametrize('command, code', [('ADD', 11), ('CHECK', 11), ('GC', 11), ('STATUS', 50)])
@pytest.mark.parametrize('where', ['absent', 'stale'])
def test_unreachable_daemon(tmp_path, stale_socket, command, code, where):
    sock = stale_socket if where == 'stale' else str(tmp_path / 'absent' / 'd.sock')
    status, out = run_dispatch(cni_env(command), config(tmp_path, '0.4.0', daemon_socket=sock))
    error = assert_error(status, out, code, '0.4.0')
    assert sock in error['details']
    assert ('refused' if where == 'stale' else 'No such file') in error['details']
    assert queue_files(tmp_path) == []


def test_executed_unreachable_status_is_plugin_not_available(tmp_path):
    proc = run_shim(cni_env('STATUS'), config(tmp_path, '1.1.0'))
    assert_error(proc.returncode, proc.stdout, 50, '1.1.0')


@pytest.mark.parametrize('command', ['ADD', 'CHECK', 'GC'])
def test_timeout_is_honoured(tmp_path, daemon, command):
    daemon.reply = hang
    started = time.monotonic()
    error = assert_error(*run_dispatch(cni_env(command), config(tmp_path, timeout=0.5)),
                         11, '1.0.0')
    elapsed = time.monotonic() - started
    assert 0.45 <= elapsed < 3, elapsed
    assert 'timed out' in error['details']
    assert len(daemon.requests) == 1   # it was sent, then no answer came


def test_timeout_bounds_the_whole_exchange(tmp_path, daemon):
    # Every recv() gets a byte within 50 ms; only a deadline stops this.
    daemon.reply = trickle
    started = time.monotonic()
    assert_error(*run_dispatch(cni_env('ADD'), config(tmp_path, timeout=0.5)), 11, '1.0.0')
    assert time.monotonic() - started < 1.5


def test_executed_timeout_is_honoured(tmp_path, daemon):
    daemon.reply = hang
    started = time.monotonic()
    proc = run_shim(cni_env('ADD'), config(tmp_path, timeout=0.5))
    assert time.monotonic() - started < 4
    assert_error(proc.returncode, proc.stdout, 11, '1.0.0')


# --- DEL is never lost --------------------------------------------------------------------


def assert_queued(tmp_path, body):
    directory = tmp_path / 'state' / 'del-queue'
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    [entry] = queue_files(tmp_path)          # no temporary file left over
    stem, pid = entry.name[:-len('.json')].split('-')
    assert entry.name.endswith('.json') and stem.isdigit() and pid.isdigit()
    assert abs(int(stem) - time.time_ns()) < 60 * 10**9
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    queued = entry.read_bytes()
    assert json.loads(queued) == json.loads(body)
    return queued


@pytest.mark.parametrize('where', ['absent', 'stale'])
def test_unreachable_del_is_queued(tmp_path, stale_socket, where):
    sock = stale_socket if where == 'stale' else str(tmp_path / 'absent.sock')
    env = cni_env('DEL', CNI_NETNS='')
    conf = config(tmp_path, '0.3.1', daemon_socket=sock)
    assert run_dispatch(env, conf) == (0, b'')
    assert_queued(tmp_path, json.dumps(expected_body('DEL', env, conf)))


def test_queued_del_is_byte_for_byte_the_posted_body(tmp_path, daemon):
    env = cni_env('DEL')
    conf = config(tmp_path)
    assert run_dispatch(env, conf) == (0, b'')
    posted = daemon.requests[0].body
    assert queue_files(tmp_path) == []
    daemon.stop()   # the same DEL now finds a socket file nobody listens on
    assert run_dispatch(env, conf) == (0, b'')
    assert assert_queued(tmp_path, posted) == posted


def test_executed_unreachable_del_is_queued_and_succeeds(tmp_path):
    env = cni_env('DEL')
    conf = config(tmp_path)   # whose state dir does not exist yet
    proc = run_shim(env, conf)
    assert (proc.returncode, proc.stdout) == (0, b'')
    assert_queued(tmp_path, json.dumps(expected_body('DEL', env, conf)))


def test_timed_out_del_is_queued(tmp_path, daemon):
    daemon.reply = hang
    env = cni_env('DEL')
    conf = config(tmp_path, timeout=0.5)
    started = time.monotonic()
    assert run_dispatch(env, conf) == (0, b'')
    assert time.monotonic() - started < 3
    assert assert_queued(tmp_path, daemon.requests[0].body) == daemon.requests[0].body


def test_queue_entry_is_written_atomically_and_durably(tmp_path, monkeypatch):
    """open(O_EXCL) a dot-name, write, fsync, close, rename to *.json, fsync the directory."""
    (tmp_path / 'state' / 'del-queue').mkdir(parents=True)
    events = []
    real = {name: getattr(shim.posix, name)
            for name in ('open', 'write', 'fsync', 'close', 'rename')}

    def spy(name):
        def call(*args):
            result = real[name](*args)
            events.append((name, args, result))
            return result
        return call

    for name in real:
        monkeypatch.setattr(shim.posix, name, spy(name))
    assert run_dispatch(cni_env('DEL'), config(tmp_path)) == (0, b'')
    monkeypatch.undo()

    names = [event[0] for event in events]
    assert names == ['open', 'write', 'fsync', 'close', 'rename', 'open', 'fsync', 'close'], names
    (_, (tmp_name, flags, mode), fd), _, (_, (synced_fd,), _), _, (_, (src, dst), _) = events[:5]
    directory = str(tmp_path / 'state' / 'del-queue')
    assert os.path.dirname(tmp_name) == os.path.dirname(src) == os.path.dirname(dst) == directory
    assert os.path.basename(tmp_name).startswith('.') and not tmp_name.endswith('.json')
    assert flags & (os.O_CREAT | os.O_EXCL | os.O_WRONLY) == os.O_CREAT | os.O_EXCL | os.O_WRONLY
    assert (mode, synced_fd, src) == (0o600, fd, tmp_name)
    assert dst.endswith('.json')
    assert [p.name for p in queue_files(tmp_path)] == [os.path.basename(dst)]
    (_, (dir_name, dir_flags), dir_fd), (_, (synced_dir_fd,), _) = events[5:7]
    assert (dir_name, synced_dir_fd) == (directory, dir_fd)
    assert dir_flags & os.O_DIRECTORY


def test_repeated_unreachable_dels_queue_separate_entries(tmp_path):
    conf = config(tmp_path)
    for _ in range(3):
        assert run_dispatch(cni_env('DEL'), conf) == (0, b'')
    assert len(queue_files(tmp_path)) == 3


def test_del_that_cannot_be_queued_asks_for_retry(tmp_path):
    (tmp_path / 'state').write_text('not a directory')
    status, out = run_dispatch(cni_env('DEL'), config(tmp_path, '0.4.0'))
    error = assert_error(status, out, 11, '0.4.0')
    assert 'could not be queued' in error['msg']
    assert 'd.sock' in error['details']
    assert sorted(p.name for p in tmp_path.iterdir()) == ['state']


def test_queue_write_failure_leaves_no_temporary_file(tmp_path, monkeypatch):
    def fail_fsync(fd):
        raise OSError(5, 'Input/output error')

    (tmp_path / 'state' / 'del-queue').mkdir(parents=True)
    monkeypatch.setattr(shim.posix, 'fsync', fail_fsync)
    error = assert_error(*run_dispatch(cni_env('DEL'), config(tmp_path)), 11, '1.0.0')
    assert 'Input/output error' in error['details']
    assert list((tmp_path / 'state' / 'del-queue').iterdir()) == []


def test_del_refused_by_daemon_is_not_queued(tmp_path, daemon):
    daemon.reply = http_response(503, cni_error(11, 'shutting down'))
    assert run_dispatch(cni_env('DEL'), config(tmp_path)) == (1, cni_error(11, 'shutting down'))
    assert queue_files(tmp_path) == []


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize('stdin', [
    b'', b'   \n', b'{"cniVersion": "1.0.0"', b'{"cniVersion": "1.0.0"} x', b'[]', b'"1.0.0"',
    b'null', b'\xff\xfe{}', b'{"a": 01}', b'\xef\xbb\xbf{"cniVersion": "1.0.0"}', b'[' * 100000,
])
def test_undecodable_config_is_code_6(stdin):
    assert_error(*run_dispatch(cni_env('ADD'), stdin), 6)


def test_executed_bad_json_is_code_6(tmp_path):
    proc = run_shim(cni_env('ADD'), b'{"cniVersion": ')
    error = assert_error(proc.returncode, proc.stdout, 6)
    assert 'Expecting value' in error['details']


@pytest.mark.parametrize('version', ['0.2.0', '0.1.0', '2.0.0', '', 1.0, None, ['1.0.0'],
                                     'missing'])
def test_unsupported_cni_version_is_code_1(tmp_path, daemon, version):
    conf = config(tmp_path)
    if version == 'missing':
        del conf['cniVersion']
    else:
        conf['cniVersion'] = version
    assert_error(*run_dispatch(cni_env('ADD'), conf), 1)
    assert daemon.requests == []


@pytest.mark.parametrize('command', ['', 'FOO', 'add', 'VERSION ', None])
def test_unknown_or_missing_command_is_code_4(tmp_path, daemon, command):
    error = assert_error(*run_dispatch(cni_env(command), config(tmp_path, '0.4.0')), 4, '0.4.0')
    assert 'CNI_COMMAND' in error['msg']
    assert daemon.requests == []


def test_executed_without_any_environment_is_code_4():
    proc = run_shim({}, b'')
    assert_error(proc.returncode, proc.stdout, 4)


def test_executed_oversized_stdin_is_code_4(tmp_path):
    stdin = b'{"cniVersion": "1.0.0", "pad": "%s"}' % (b'x' * (1024 * 1024))
    proc = run_shim(cni_env('ADD'), stdin)
    assert_error(proc.returncode, proc.stdout, 4)


def test_stdin_size_limit_is_exact():
    stdin = b'{"cniVersion": "1.0.0", "pad": "%s"}' % (b'x' * (1024 * 1024 - 34))
    assert len(stdin) == 1024 * 1024
    assert shim.parse_stdin(stdin)[1] is None
    assert shim.parse_stdin(stdin + b' ')[1].code == 4


def test_body_over_limit_is_refused_without_sending(tmp_path, daemon):
    conf = config(tmp_path)
    head = json.dumps(conf)[:-1].encode() + b', "pad": "'
    stdin = head + b'x' * (1024 * 1024 - len(head) - 2 - 300) + b'"}'   # fits on stdin
    env = cni_env('ADD', CNI_ARGS='K8S_POD_NAME=' + 'p' * 400)           # the body does not
    error = assert_error(*run_dispatch(env, stdin), 4, '1.0.0')
    assert 'too large' in error['msg']
    assert daemon.requests == []


@pytest.mark.parametrize('key, value', [
    ('timeout', '5'), ('timeout', True), ('timeout', 0), ('timeout', -1), ('timeout', 3600.5),
    ('timeout', [5]), ('timeout', 1e400),
    ('daemon_socket', 5), ('daemon_socket', ''), ('daemon_socket', 'relative.sock'),
    ('daemon_socket', '/' + 'x' * 107), ('daemon_socket', '/run/\0x'),
    ('daemon_socket', '/run/\ud800.sock'),
    ('state_dir', {}), ('state_dir', ''), ('state_dir', 'var/lib'),
])
def test_invalid_plugin_keys_are_code_7(tmp_path, daemon, key, value):
    error = assert_error(*run_dispatch(cni_env('ADD'), config(tmp_path, '0.3.0', **{key: value})),
                         7, '0.3.0')
    assert key in error['msg']
    assert daemon.requests == []


def test_nan_timeout_is_code_7():
    assert_error(*run_dispatch(cni_env('ADD'), b'{"cniVersion": "1.0.0", "timeout": NaN}'),
                 7, '1.0.0')


@pytest.mark.parametrize('timeout', [3600, 0.25, None])
def test_valid_timeouts(tmp_path, daemon, timeout):
    assert run_dispatch(cni_env('GC'), config(tmp_path, '1.1.0', timeout=timeout)) == (0, b'')


def test_defaults_when_keys_absent(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(shim, 'call_daemon', lambda *args: calls.append(args) or (204, b''))
    assert run_dispatch(cni_env('DEL'), {'cniVersion': '1.0.0'}) == (0, b'')
    [(socket_path, path, _body, timeout)] = calls
    assert (socket_path, path, timeout) == ('/run/kuryr-cni/daemon.sock', '/delNetwork', 110)
    assert shim.load_settings({'cniVersion': '1.0.0'})[2] == '/var/lib/kuryr-cni'


def test_unexpected_exception_is_code_999(monkeypatch):
    def explode(env, stdin_bytes, stdout):
        raise RuntimeError('kaboom')

    stdout = io.BytesIO()
    monkeypatch.setattr(shim, 'dispatch', explode)
    monkeypatch.setattr(sys, 'stdin', io.TextIOWrapper(io.BytesIO(b'{"cniVersion": "0.3.1"}')))
    monkeypatch.setattr(sys, 'stdout', io.TextIOWrapper(stdout))
    assert shim.main() == 1
    error = assert_error(1, stdout.getvalue(), 999, '0.3.1')
    assert error['details'] == 'RuntimeError: kaboom'


# --- the JSON and HTTP helpers ---------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20)


@settings(max_examples=200, deadline=None, database=None)
@given(json_values, st.sampled_from([None, 2]))
def test_decode_json_agrees_with_json(value, indent):
    text = json.dumps(value, indent=indent, ensure_ascii=indent is None)
    assert shim.decode_json(text.encode()) == value


@settings(max_examples=300, deadline=None, database=None)
@given(st.text(alphabet='{}[]",:0123456789.eE+-tfrunlaNIy \t\n\\u'))
def test_decode_json_fails_exactly_when_json_fails(text):
    try:
        expected = json.loads(text)
    except ValueError:
        with pytest.raises(ValueError):
            shim.decode_json(text.encode())
    else:
        assert json.dumps(shim.decode_json(text.encode())) == json.dumps(expected)


shim_shapes = st.recursive(
    st.integers() | st.text(),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20)


@settings(max_examples=200, deadline=None, database=None)
@given(shim_shapes)
def test_encode_json_matches_json_dumps(value):
    assert shim.encode_json(value) == json.dumps(value, separators=(',', ':')).encode()


def test_pure_python_fallback_without_json_accelerator(monkeypatch):
    monkeypatch.setitem(sys.modules, '_json', None)   # import _json now fails
    slow = load_shim('kuryr_cni_shim_without_json_accelerator')
    assert slow._scan_json is None
    value = {'a': ['\u00e9\ud800', 1, {'b': '"'}]}
    assert slow.encode_json(value) == shim.encode_json(value)
    assert slow.decode_json(b' {"a": [1.5, NaN, null]} ')['a'][0] == 1.5
    with pytest.raises(ValueError):
        slow.decode_json(b'{"a": }')


framings = st.sampled_from(['length', 'chunked', 'close'])
statuses = st.integers(200, 599).filter(lambda status: status not in (204, 304))


def _raw_response(status, body, framing, cuts):
    if framing == 'length':
        return http_response(status, body)
    if framing == 'close':
        return http_response(status, body, {'Content-Length': None})
    points = sorted({c % (len(body) + 1) for c in cuts} | {0, len(body)})
    return chunked_response(status, [body[a:b] for a, b in zip(points, points[1:]) if b > a])


@settings(max_examples=200, deadline=None, database=None)
@given(statuses, st.binary(max_size=300), framings, st.lists(st.integers(0, 1000), max_size=5),
       st.data())
def test_parse_response_is_incremental(status, body, framing, cuts, data):
    raw = _raw_response(status, body, framing, cuts)
    assert shim.parse_response(raw, at_eof=True) == (status, body)
    if framing != 'close':   # complete without waiting for the end of the connection
        assert shim.parse_response(raw, at_eof=False) == (status, body)
    prefix = raw[:data.draw(st.integers(0, len(raw) - 1))]
    assert shim.parse_response(prefix, at_eof=False) is None
    head_complete = b'\r\n\r\n' in prefix
    if framing == 'close' and head_complete:   # a shorter body, as far as HTTP can tell
        body_so_far = prefix.partition(b'\r\n\r\n')[2]
        assert shim.parse_response(prefix, at_eof=True) == (status, body_so_far)
    else:
        with pytest.raises(shim.CNIError) as exc:
            shim.parse_response(prefix, at_eof=True)
        assert exc.value.code == 11


@pytest.mark.parametrize('status', [204, 304])
def test_parse_response_bodyless_statuses(status):
    assert shim.parse_response(b'HTTP/1.1 %d X\r\n\r\n' % status, at_eof=False) == (status, b'')
