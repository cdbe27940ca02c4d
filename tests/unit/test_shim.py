"""The CNI executable as built, black box: the contract of DESIGN §4.1 and §4.2.

The shim under test is ``shim/kuryr-cni`` as ``tools/build-shim`` builds it,
executed as a runtime executes it: the CNI_* variables as its whole
environment, the network config on stdin. Its Go source has white-box tests of
its own (``go test`` in shim/); these check what a runtime and the daemon can
observe, whatever the source.

The daemon here is a FAKE, on purpose: this is the shim's side of the shim <->
daemon protocol, so a small threaded HTTP server on a unix socket under
``tmp_path`` records exactly what the shim sent (parsed by the standard
library's http.server, which so also checks the shim's HTTP/1.1) and answers
canned bytes, including broken answers a real daemon should never give. The
daemon's side is tested against the real daemon elsewhere.
"""

import http.server
import json
import os
import pathlib
import re
import socket
import socketserver
import stat
import struct
import subprocess
import sys
import threading
import time

import pytest

from kuryr_cni import cni
from kuryr_cni import version as kuryr_version
from kuryr_cni.daemon import api
from tools.testbed import shim as testshim

SHIM_SOURCE = pathlib.Path(testshim.REPO) / 'shim'
VERSIONS = ('0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0')
FORWARDED = {'ADD': '/addNetwork', 'DEL': '/delNetwork', 'CHECK': '/checkNetwork',
             'GC': '/gc', 'STATUS': '/status'}
ENV_KEYS = ('CNI_COMMAND', 'CNI_CONTAINERID', 'CNI_NETNS', 'CNI_IFNAME', 'CNI_ARGS',
            'CNI_PATH')
ADD_RESULT = (b'{"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": '
              b'"/var/run/netns/x"}], "ips": [{"address": "10.10.0.5/24", "interface": 0}]}')
PT_INTERP = 3


# --- the fake daemon ----------------------------------------------------------------


def http_response(status, body=b'', headers=None, reason='X'):
    """Raw bytes of a Content-Length framed HTTP/1.1 response."""
    head = ['HTTP/1.1 %d %s' % (status, reason)]
    headers = {'Content-Length': str(len(body)), **(headers or {})}
    head += ['%s: %s' % item for item in headers.items() if item[1] is not None]
    return '\r\n'.join(head).encode() + b'\r\n\r\n' + body


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


def hang_up(handler, release):
    """Read the request, close without a word (a worker that died mid-request)."""


def trickle(handler, release):
    """Answer one byte every 50 ms (~2 s in all): no single read ever waits long."""
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


@pytest.fixture
def run(shim_binary):
    def run(env, stdin=b'', argv=(), **kwargs):
        """Execute the shim as the runtime does; it must never write to stderr."""
        if isinstance(stdin, dict):
            stdin = json.dumps(stdin).encode()
        kwargs.setdefault('input', stdin)
        proc = subprocess.run([shim_binary, *argv], env=env, capture_output=True, timeout=30,
                              **kwargs)
        assert proc.stderr == b'', proc.stderr.decode(errors='replace')
        return proc
    return run


def assert_error(proc, code, version='1.1.0'):
    assert proc.returncode == 1, proc.stdout
    assert proc.stdout.endswith(b'}\n')
    error = json.loads(proc.stdout)
    assert set(error) == {'cniVersion', 'code', 'msg', 'details'}, error
    assert error['code'] == code, error
    assert error['cniVersion'] == version, error
    assert isinstance(error['msg'], str) and error['msg']
    return error


def assert_success(proc, stdout=b''):
    assert (proc.returncode, proc.stdout) == (0, stdout)


def queue_files(tmp_path):
    directory = tmp_path / 'state' / 'del-queue'
    return sorted(directory.iterdir()) if directory.exists() else []


def assert_queued(tmp_path, body):
    """The one queue entry, named and moded as the daemon expects; returns its bytes."""
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


# --- the executable itself --------------------------------------------------------------


def _program_header_types(path):
    """The p_type of every program header of a 64-bit little-endian ELF file."""
    with open(path, 'rb') as f:
        data = f.read()
    assert data[:4] == b'\x7fELF' and data[4] == 2 and data[5] == 1, 'not ELF64 LE'
    phoff, = struct.unpack_from('<Q', data, 0x20)
    phentsize, phnum = struct.unpack_from('<HH', data, 0x36)
    return [struct.unpack_from('<I', data, phoff + i * phentsize)[0] for i in range(phnum)]


def test_executable_is_static_with_no_interpreter(shim_binary):
    """Nothing on the node but the file: no ELF interpreter, so no libc, no Python."""
    assert os.stat(shim_binary).st_mode & 0o111
    types = _program_header_types(shim_binary)
    assert types and PT_INTERP not in types


def test_version_flag_is_the_repository_version(run):
    proc = run({}, argv=['--version'])
    assert (proc.returncode, proc.stdout) == (0, kuryr_version.VERSION.encode() + b'\n')


def _go_table(name, pattern):
    source = (SHIM_SOURCE / 'main.go').read_text()
    match = re.search(r'^var %s = (?:\[\]string|map\[string\]string)\{(.*?)\}$' % name, source,
                      re.M | re.S)
    assert match, 'no table %s in shim/main.go' % name
    return re.findall(pattern, match.group(1))


def test_shim_and_daemon_agree_on_versions_and_routes():
    """Both sources, side by side: what the shim forwards, the daemon serves."""
    assert tuple(_go_table('supportedVersions', r'"([^"]+)"')) == cni.SUPPORTED_VERSIONS
    routes = dict(_go_table('routes', r'"([A-Z]+)":\s*"([^"]+)"'))
    assert {path: command for command, path in routes.items()} == api.ROUTES
    assert sorted(routes) == sorted(cni.COMMANDS)


def test_a_missing_or_stale_shim_is_built(shim_binary, tmp_path, monkeypatch):
    path = tmp_path / 'kuryr-cni'
    monkeypatch.setattr(testshim, 'PATH', str(path))
    assert testshim.built() == str(path)                # missing: built
    assert path.read_bytes() == pathlib.Path(shim_binary).read_bytes()
    path.write_bytes(b'stale')
    os.utime(path, (0, 0))                              # older than every source
    testshim.built()
    assert path.read_bytes() == pathlib.Path(shim_binary).read_bytes()


def test_without_go_a_missing_shim_fails_saying_so(tmp_path, monkeypatch):
    monkeypatch.setattr(testshim, 'PATH', str(tmp_path / 'kuryr-cni'))
    monkeypatch.setattr(testshim.shutil, 'which', lambda name: None)
    with pytest.raises(testshim.ShimUnavailable, match='no Go toolchain.*golang-go'):
        testshim.built()


@pytest.mark.parametrize('version', VERSIONS)
def test_version_answers_requested_version_without_daemon(run, tmp_path, version):
    proc = run({'CNI_COMMAND': 'VERSION'}, config(tmp_path, version))
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == {'cniVersion': version, 'supportedVersions': list(VERSIONS)}
    assert not (tmp_path / 'd.sock').exists()


@pytest.mark.parametrize('stdin', [b'', b'{"cniVersion": "0.2.0"}', b'{"cniVersion": 1}',
                                   b'{}', b'not json', b'[]'])
def test_version_defaults_to_newest(run, stdin):
    proc = run({'CNI_COMMAND': 'VERSION'}, stdin)
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == {'cniVersion': '1.1.0', 'supportedVersions': list(VERSIONS)}


@pytest.mark.parametrize('stdin', [subprocess.DEVNULL, None], ids=['devnull', 'closed'])
def test_version_without_stdin(run, stdin):
    kwargs = {'input': None, 'stdin': subprocess.DEVNULL}
    if stdin is None:
        kwargs['preexec_fn'] = lambda: os.close(0)
    proc = run({'CNI_COMMAND': 'VERSION'}, **kwargs)
    assert proc.returncode == 0
    assert json.loads(proc.stdout)['cniVersion'] == '1.1.0'


# --- forwarding: what the daemon receives ---------------------------------------------------


@pytest.mark.parametrize('version', VERSIONS)
@pytest.mark.parametrize('command', sorted(FORWARDED))
def test_forwarded_request_path_headers_and_exact_body(run, tmp_path, daemon, command, version):
    conf = config(tmp_path, version, prevResult={'cniVersion': version, 'ips': []})
    env = cni_env(command)
    daemon.reply = http_response(200, ADD_RESULT) if command == 'ADD' else http_response(204)
    assert_success(run(env, conf), ADD_RESULT if command == 'ADD' else b'')
    [request] = daemon.requests
    assert (request.method, request.version) == ('POST', 'HTTP/1.1')
    assert request.path == FORWARDED[command]
    assert request.header('Host') == 'kuryr-cni'
    assert request.header('User-Agent') == 'kuryr-cni-shim/' + kuryr_version.VERSION
    assert request.header('Content-Type') == 'application/json'
    assert request.header('Connection') == 'close'
    assert int(request.header('Content-Length')) == len(request.body)
    assert json.loads(request.body) == expected_body(command, env, conf)


def test_config_is_forwarded_as_written(run, tmp_path, daemon):
    # Key order, layout, escapes and numbers no float can hold arrive untouched.
    stdin = ('\n  {"type": "kuryr-cni", "cniVersion": "1.0.0", "z": 1e400,'
             ' "f": 0.1000000000000000055, "n": 123456789012345678901234567890,'
             ' "u": "\u00e9\\u00e9", "h": "<&>", "daemon_socket": "%s"}\n'
             % daemon.path).encode()
    assert_success(run(cni_env('CHECK'), stdin))
    [request] = daemon.requests
    assert request.body.endswith(b',"config":' + stdin.strip() + b'}')


@pytest.mark.parametrize('command', sorted(FORWARDED))
def test_forwarding_with_empty_and_absent_env(run, tmp_path, daemon, command):
    # Runtimes export every variable, empty ones too; the second DEL has no netns.
    env = {'CNI_COMMAND': command, 'CNI_CONTAINERID': 'c0ffee', 'CNI_NETNS': '',
           'CNI_IFNAME': '', 'CNI_ARGS': ''}
    conf = config(tmp_path)
    if command == 'ADD':
        daemon.reply = http_response(200, ADD_RESULT)
    assert_success(run(env, conf), ADD_RESULT if command == 'ADD' else b'')
    [request] = daemon.requests
    body = json.loads(request.body)
    assert body == expected_body(command, env, conf)
    assert body['CNI_NETNS'] == body['CNI_IFNAME'] == body['CNI_ARGS'] == body['CNI_PATH'] == ''


@pytest.mark.parametrize('reply', [
    b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n' + ADD_RESULT,
    b'HTTP/1.0 200 OK\r\ncontent-length: %d\r\n\r\n%s' % (len(ADD_RESULT), ADD_RESULT),
], ids=['until-close', 'http1.0-lowercase'])
def test_response_framings(run, tmp_path, daemon, reply):
    daemon.reply = reply
    assert_success(run(cni_env('ADD'), config(tmp_path)), ADD_RESULT)


@pytest.mark.parametrize('command', sorted(FORWARDED))
@pytest.mark.parametrize('status', [400, 404, 409, 413, 500, 503])
def test_daemon_error_is_printed_unchanged(run, tmp_path, daemon, command, status):
    daemon.reply = http_response(status, cni_error(7, version='0.4.0'))
    proc = run(cni_env(command), config(tmp_path))
    assert (proc.returncode, proc.stdout) == (1, cni_error(7, version='0.4.0'))
    assert queue_files(tmp_path) == []


@pytest.mark.parametrize('command', ['DEL', 'CHECK', 'GC', 'STATUS'])
def test_200_body_is_printed(run, tmp_path, daemon, command):
    daemon.reply = http_response(200, b'{}')
    assert_success(run(cni_env(command), config(tmp_path)), b'{}')


MALFORMED = [
    b'garbage\r\n\r\n',
    b'HTTP/1.1 200 OK\r\n',                                        # cut in the headers
    http_response(200, ADD_RESULT)[:-10],                           # cut in the body
    b'HTTP/1.1 OK 200\r\nContent-Length: 0\r\n\r\n',
    b'HTTP/1.1 099 X\r\nContent-Length: 0\r\n\r\n',
    b'HTTP/1.1 100 Continue\r\n\r\n',
    http_response(200, b'not json'),
    http_response(200, b'[1, 2]'),
    http_response(500, b'Internal Server Error'),
    http_response(503, b'{"msg": "no code"}'),
    http_response(400, b'{"code": "7"}'),
    http_response(400, b'{"code": true}'),
    http_response(302, b'{"code": 7}', {'Location': '/x'}),
    http_response(201, ADD_RESULT),
    http_response(200, ADD_RESULT, {'Content-Length': '-1'}),
    http_response(200, ADD_RESULT, {'Content-Length': '0x10'}),
    b'HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{} ',
    b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n',
    b'HTTP/1.1 200 OK\r\n Folded: header\r\nContent-Length: 2\r\n\r\n{}',
    b'HTTP/1.1 200 OK\r\nNoColon\r\nContent-Length: 2\r\n\r\n{}',
]
CLOSED_AT_ONCE = b''


@pytest.mark.parametrize('reply', MALFORMED + [b'HTTP/1.1 204 No Content\r\n\r\n'])
def test_malformed_response_to_add_is_try_again_later(run, tmp_path, daemon, reply):
    daemon.reply = reply
    error = assert_error(run(cni_env('ADD'), config(tmp_path, '0.4.0')), 11, '0.4.0')
    assert 'malformed' in error['msg']
    assert queue_files(tmp_path) == []


@pytest.mark.parametrize('reply', MALFORMED + [CLOSED_AT_ONCE])
def test_malformed_response_to_del_is_queued(run, tmp_path, daemon, reply):
    """DEL is idempotent: one the daemon may or may not have run is queued, not failed."""
    daemon.reply = reply
    assert_success(run(cni_env('DEL'), config(tmp_path)))
    assert assert_queued(tmp_path, daemon.requests[0].body) == daemon.requests[0].body


def test_response_size_is_bounded(run, tmp_path, daemon):
    daemon.reply = http_response(200, b'{"a": "%s"}' % (b'x' * (5 * 1024 * 1024)))
    error = assert_error(run(cni_env('ADD'), config(tmp_path)), 11, '1.0.0')
    assert 'larger than' in error['details']


# --- the daemon out of reach ----------------------------------------------------------


@pytest.mark.parametrize('command, code', [('ADD', 11), ('CHECK', 11), ('GC', 11), ('STATUS', 50)])
@pytest.mark.parametrize('where', ['absent', 'stale'])
def test_unreachable_daemon(run, tmp_path, stale_socket, command, code, where):
    sock = stale_socket if where == 'stale' else str(tmp_path / 'absent' / 'd.sock')
    proc = run(cni_env(command), config(tmp_path, '0.4.0', daemon_socket=sock))
    error = assert_error(proc, code, '0.4.0')
    assert sock in error['details']
    assert ('refused' if where == 'stale' else 'no such file') in error['details']
    assert queue_files(tmp_path) == []


@pytest.mark.parametrize('reply, sent_again', [(hang_up, True), (CLOSED_AT_ONCE, True),
                                               (http_response(200, ADD_RESULT)[:30], False)],
                         ids=['no-answer', 'closed-at-once', 'half-an-answer'])
def test_connection_broken_mid_request(run, tmp_path, daemon, reply, sent_again):
    """The daemon read the request, then the connection broke: an ADD that got no byte
    back is sent again until its timeout (a worker died: the next one may answer), one
    that got part of an answer fails at once; both 11. A DEL is queued."""
    daemon.reply = reply
    assert_error(run(cni_env('ADD'), config(tmp_path, timeout=1)), 11, '1.0.0')
    adds = len(daemon.requests)
    assert adds > 1 if sent_again else adds == 1
    assert queue_files(tmp_path) == []
    assert_success(run(cni_env('DEL'), config(tmp_path)))
    assert assert_queued(tmp_path, daemon.requests[-1].body) == daemon.requests[-1].body


@pytest.mark.parametrize('reply', [hang, trickle])
@pytest.mark.parametrize('command', ['ADD', 'CHECK', 'GC'])
def test_timeout_bounds_the_whole_exchange(run, tmp_path, daemon, command, reply):
    # The trickle's answer would be whole after ~2 s, with no single read
    # waiting long: only a deadline on the whole exchange refuses it.
    daemon.reply = reply
    error = assert_error(run(cni_env(command), config(tmp_path, timeout=0.5)), 11, '1.0.0')
    assert 'timeout' in error['details']
    assert len(daemon.requests) == 1   # it was sent, then no whole answer came in time


# --- DEL is never lost --------------------------------------------------------------------


@pytest.mark.parametrize('where', ['absent', 'stale'])
def test_unreachable_del_is_queued(run, tmp_path, stale_socket, where):
    sock = stale_socket if where == 'stale' else str(tmp_path / 'absent.sock')
    env = cni_env('DEL', CNI_NETNS='')
    conf = config(tmp_path, '0.3.1', daemon_socket=sock)   # whose state dir does not exist yet
    assert_success(run(env, conf))
    assert_queued(tmp_path, json.dumps(expected_body('DEL', env, conf)))


def test_queued_del_is_byte_for_byte_the_posted_body(run, tmp_path, daemon):
    env = cni_env('DEL')
    conf = config(tmp_path)
    assert_success(run(env, conf))
    posted = daemon.requests[0].body
    assert queue_files(tmp_path) == []
    daemon.stop()   # the same DEL now finds a socket file nobody listens on
    assert_success(run(env, conf))
    assert assert_queued(tmp_path, posted) == posted


def test_timed_out_del_is_queued(run, tmp_path, daemon):
    daemon.reply = hang
    assert_success(run(cni_env('DEL'), config(tmp_path, timeout=0.5)))
    assert assert_queued(tmp_path, daemon.requests[0].body) == daemon.requests[0].body


STRACE = '/usr/bin/strace'
_SYSCALL = re.compile(r'^(?:\d+ +)?(\w+)\((.*)\) += (-?\d+)')
RENAMES = {'renameat': 'rename', 'renameat2': 'rename'}


@pytest.mark.skipif(not os.access(STRACE, os.X_OK),
                    reason='strace is not installed (apt-get install strace)')
def test_queue_entry_is_written_atomically_and_durably(shim_binary, tmp_path):
    """open(O_EXCL) a dot-name, write, fsync, close, rename to *.json, fsync the directory.

    Read from the system calls the shim makes (strace), not from its source.
    """
    directory = tmp_path / 'state' / 'del-queue'
    directory.mkdir(parents=True)
    trace = tmp_path / 'trace'
    proc = subprocess.run(
        [STRACE, '-f', '-qq', '-o', str(trace), '-e', 'signal=none', '-e',
         'trace=openat,fchmod,write,fsync,close,rename,renameat,renameat2',
         shim_binary], env=cni_env('DEL'), input=json.dumps(config(tmp_path)).encode(),
        capture_output=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b'', b'')
    calls = [(RENAMES.get(name, name), args, result) for name, args, result in (
        _SYSCALL.match(line).groups() for line in trace.read_text().splitlines()
        if _SYSCALL.match(line))]
    [entry] = queue_files(tmp_path)
    tmp_name = str(directory / ('.' + entry.name[:-len('.json')] + '.tmp'))
    [start] = [i for i, (name, args, _) in enumerate(calls)
               if name == 'openat' and '"%s"' % tmp_name in args]
    names = [name for name, _, _ in calls[start:]]
    assert names == ['openat', 'fchmod', 'write', 'fsync', 'close', 'rename', 'openat',
                     'fsync', 'close'], names
    (_, open_args, fd), _, _, (_, sync_args, _), _, (_, rename_args, _), \
        (_, dir_args, dir_fd), (_, dir_sync_args, _), _ = calls[start:]
    assert 'O_CREAT' in open_args and 'O_EXCL' in open_args and open_args.endswith('0600')
    assert sync_args == fd
    assert '"%s"' % tmp_name in rename_args and '"%s"' % entry in rename_args
    assert '"%s"' % directory in dir_args and dir_sync_args == dir_fd


def test_repeated_unreachable_dels_queue_separate_entries(run, tmp_path):
    for _ in range(3):
        assert_success(run(cni_env('DEL'), config(tmp_path)))
    assert len(queue_files(tmp_path)) == 3


def test_del_that_cannot_be_queued_asks_for_retry(run, tmp_path):
    (tmp_path / 'state').write_text('not a directory')
    error = assert_error(run(cni_env('DEL'), config(tmp_path, '0.4.0')), 11, '0.4.0')
    assert 'could not be queued' in error['msg']
    assert 'd.sock' in error['details'] and 'not a directory' in error['details']
    assert sorted(p.name for p in tmp_path.iterdir()) == ['state']


def test_del_refused_by_daemon_is_not_queued(run, tmp_path, daemon):
    daemon.reply = http_response(503, cni_error(11, 'shutting down'))
    proc = run(cni_env('DEL'), config(tmp_path))
    assert (proc.returncode, proc.stdout) == (1, cni_error(11, 'shutting down'))
    assert queue_files(tmp_path) == []


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize('stdin', [
    b'', b'   \n', b'{"cniVersion": "1.0.0"', b'{"cniVersion": "1.0.0"} x', b'[]', b'"1.0.0"',
    b'null', b'\xff\xfe{}', b'{"a": 01}', b'\xef\xbb\xbf{"cniVersion": "1.0.0"}', b'[' * 100000,
    b'{"cniVersion": "1.0.0", "timeout": NaN}', b'{"cniVersion": "1.0.0", "timeout": Infinity}',
])
def test_undecodable_config_is_code_6(run, stdin):
    assert_error(run(cni_env('ADD'), stdin), 6)


@pytest.mark.parametrize('version', ['0.2.0', '0.1.0', '2.0.0', '', 1.0, None, ['1.0.0'],
                                     'missing'])
def test_unsupported_cni_version_is_code_1(run, tmp_path, daemon, version):
    conf = config(tmp_path)
    if version == 'missing':
        del conf['cniVersion']
    else:
        conf['cniVersion'] = version
    assert_error(run(cni_env('ADD'), conf), 1)
    assert daemon.requests == []


@pytest.mark.parametrize('command', ['', 'FOO', 'add', 'VERSION ', None])
def test_unknown_or_missing_command_is_code_4(run, tmp_path, daemon, command):
    error = assert_error(run(cni_env(command), config(tmp_path, '0.4.0')), 4, '0.4.0')
    assert 'CNI_COMMAND' in error['msg']
    assert daemon.requests == []


def test_without_any_environment_is_code_4(run):
    assert_error(run({}, b''), 4)


def test_oversized_stdin_is_code_4(run):
    stdin = b'{"cniVersion": "1.0.0", "pad": "%s"}' % (b'x' * (1024 * 1024))
    assert_error(run(cni_env('ADD'), stdin), 4)


def test_body_over_limit_is_refused_without_sending(run, tmp_path, daemon):
    conf = config(tmp_path)
    head = json.dumps(conf)[:-1].encode() + b', "pad": "'
    stdin = head + b'x' * (1024 * 1024 - len(head) - 2 - 300) + b'"}'   # fits on stdin
    env = cni_env('ADD', CNI_ARGS='K8S_POD_NAME=' + 'p' * 400)           # the body does not
    error = assert_error(run(env, stdin), 4, '1.0.0')
    assert 'too large' in error['msg']
    assert daemon.requests == []


# -- what a network config may steer (issue 31 hole 10) -------------------------------------
# With Multus a namespaced NetworkAttachmentDefinition writes the shim's stdin:
# the root shim dials and writes only paths an allow file beside it lists.

@pytest.fixture
def installed(tmp_path):
    """A copy of the shim in its own bin dir, as operators install it: no allow file."""
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    return testshim.install(str(bin_dir))


@pytest.mark.parametrize('version', VERSIONS)
@pytest.mark.parametrize('key', ['daemon_socket', 'state_dir'])
def test_a_path_no_allow_file_lists_is_refused_and_neither_dialled_nor_written(
        installed, tmp_path, daemon, version, key):
    conf = config(tmp_path, version)
    other = {'daemon_socket': conf['daemon_socket'], 'state_dir': conf['state_dir']}
    conf.update({k: v for k, v in (('daemon_socket', '/run/kuryr-cni/daemon.sock'),
                                   ('state_dir', '/var/lib/kuryr-cni')) if k != key})
    proc = subprocess.run([installed], env=cni_env('ADD'), input=json.dumps(conf).encode(),
                          capture_output=True, timeout=30)
    error = assert_error(proc, 7, version)
    assert error['msg'] == '"%s" %s is not allowed on this node' % (key, other[key])
    assert testshim.ALLOW_FILE in error['details'] and 'owned by root' in error['details']
    assert daemon.requests == []
    assert not (tmp_path / 'state').exists()


def test_a_path_the_allow_file_lists_is_honoured(installed, tmp_path, daemon):
    testshim.allow(os.path.dirname(installed), [str(tmp_path / 'd.sock'),
                                                str(tmp_path / 'state')])
    proc = subprocess.run([installed], env=cni_env('GC'),
                          input=json.dumps(config(tmp_path, '1.1.0')).encode(),
                          capture_output=True, timeout=30)
    assert_success(proc)
    assert len(daemon.requests) == 1


def test_a_group_writable_allow_file_is_ignored(installed, tmp_path, daemon):
    testshim.allow(os.path.dirname(installed), [str(tmp_path) + '/'])
    os.chmod(os.path.join(os.path.dirname(installed), testshim.ALLOW_FILE), 0o664)
    proc = subprocess.run([installed], env=cni_env('GC'),
                          input=json.dumps(config(tmp_path, '1.1.0')).encode(),
                          capture_output=True, timeout=30)
    assert 'writable by group' in assert_error(proc, 7)['details']
    assert daemon.requests == []


@pytest.mark.parametrize('key, value', [
    ('timeout', '5'), ('timeout', True), ('timeout', 0), ('timeout', -1), ('timeout', 110.5),
    ('timeout', 3600), ('timeout', [5]),
    ('daemon_socket', 5), ('daemon_socket', ''), ('daemon_socket', 'relative.sock'),
    ('daemon_socket', '/' + 'x' * 107), ('daemon_socket', '/run/\0x'),
    ('daemon_socket', '/run/\ud800.sock'),
    ('state_dir', {}), ('state_dir', ''), ('state_dir', 'var/lib'),
])
def test_invalid_plugin_keys_are_code_7(run, tmp_path, daemon, key, value):
    proc = run(cni_env('ADD'), config(tmp_path, '0.3.0', **{key: value}))
    error = assert_error(proc, 7, '0.3.0')
    assert key in error['msg']
    assert daemon.requests == []


@pytest.mark.parametrize('timeout', [110, 0.25, None])
def test_valid_timeouts(run, tmp_path, daemon, timeout):
    assert_success(run(cni_env('GC'), config(tmp_path, '1.1.0', timeout=timeout)))
