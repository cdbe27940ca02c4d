"""Tests of ``kuryr-cni --install DIR``: the launcher and the compiled shim.

Installed, the runtime's executable is a small launcher that imports the
shim from ``DIR/.kuryr-cni/`` so that Python runs it from cached bytecode
instead of compiling it on every exec. What must hold: the launcher answers
exactly as the plain script does, its bytecode is what Python will accept
(and keeps accepting), a broken install still answers CNI JSON, and bad
arguments change nothing. The daemon is the fake of test_shim.
"""

import importlib.util
import json
import os
import shutil
import stat
import subprocess

import pytest

from tests.unit.test_shim import (ADD_RESULT, FakeDaemon, SHIM, SYSTEM_PYTHON, VERSIONS,
                                  cni_env, config, http_response, _imported_modules,
                                  IMPORT_ALLOW_LIST)

MODULE = 'kuryr_cni_shim'


def install(bin_dir, **options):
    """Run ``kuryr-cni --install bin_dir``; ``options`` go to subprocess.run."""
    return subprocess.run([str(SHIM), '--install', str(bin_dir)], capture_output=True,
                          timeout=60, **options)


@pytest.fixture
def installed(tmp_path):
    """The launcher's path, installed into a fresh bin dir."""
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    proc = install(bin_dir)
    assert (proc.returncode, proc.stderr) == (0, b''), proc.stderr
    assert proc.stdout == b'installed %s/kuryr-cni\n' % bytes(bin_dir)
    return bin_dir / 'kuryr-cni'


def run(program, env, stdin, cwd=None):
    if isinstance(stdin, dict):
        stdin = json.dumps(stdin).encode()
    proc = subprocess.run(program, input=stdin, env=env, capture_output=True, timeout=30,
                          cwd=cwd)
    assert proc.stderr == b'', proc.stderr.decode(errors='replace')
    return proc


def files_under(directory):
    return sorted(str(p.relative_to(directory)) for p in directory.rglob('*'))


def test_install_writes_launcher_shim_copy_and_bytecode(installed):
    bin_dir = installed.parent
    module = bin_dir / '.kuryr-cni' / (MODULE + '.py')
    cached = importlib.util.cache_from_source(str(module))
    assert files_under(bin_dir) == sorted([
        '.kuryr-cni', '.kuryr-cni/__pycache__', '.kuryr-cni/%s.py' % MODULE,
        os.path.relpath(cached, bin_dir), 'kuryr-cni'])
    assert stat.S_IMODE(installed.stat().st_mode) == 0o755
    assert stat.S_IMODE(module.stat().st_mode) == 0o644
    assert stat.S_IMODE(module.parent.stat().st_mode) == 0o755
    assert module.read_bytes() == SHIM.read_bytes()
    # The launcher keeps the shim's own interpreter line.
    assert installed.read_bytes().split(b'\n', 1)[0] == SHIM.read_bytes().split(b'\n', 1)[0]
    _assert_checked_hash_pyc(cached, module)


def test_install_modes_do_not_follow_a_lax_umask(tmp_path):
    """Root runs what is installed: nothing may come out group or world writable."""
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    proc = install(bin_dir, umask=0)
    assert proc.returncode == 0, proc.stderr
    modes = {str(p.relative_to(bin_dir)): stat.S_IMODE(p.stat().st_mode)
             for p in bin_dir.rglob('*')}
    assert modes['kuryr-cni'] == 0o755
    assert modes['.kuryr-cni'] == modes['.kuryr-cni/__pycache__'] == 0o755
    assert all(mode & 0o022 == 0 for mode in modes.values()), modes


def _assert_checked_hash_pyc(cached, module):
    """The header Python checks before running a .pyc (PEP 552, checked hash kind)."""
    with open(cached, 'rb') as f:
        header = f.read(16)
    assert header[:4] == importlib.util.MAGIC_NUMBER
    assert int.from_bytes(header[4:8], 'little') == 0b11   # hash-based, checked
    assert header[8:16] == importlib.util.source_hash(module.read_bytes())


@pytest.mark.parametrize('version', VERSIONS)
def test_launcher_answers_version_as_the_script_does(installed, tmp_path, version):
    env, stdin = {'CNI_COMMAND': 'VERSION'}, config(tmp_path, version)
    assert run([str(installed)], env, stdin).stdout == run([str(SHIM)], env, stdin).stdout


@pytest.mark.parametrize('command, reply', [('ADD', http_response(200, ADD_RESULT)),
                                            ('DEL', http_response(204)),
                                            ('CHECK', http_response(400, b'{"code": 7}'))])
def test_launcher_forwards_as_the_script_does(installed, tmp_path, command, reply):
    fake = FakeDaemon(tmp_path / 'd.sock')
    try:
        fake.reply = reply
        launched, script = [run([str(program)], cni_env(command), config(tmp_path))
                            for program in (installed, SHIM)]
    finally:
        fake.stop()
    assert (launched.returncode, launched.stdout) == (script.returncode, script.stdout)
    assert len(fake.requests) == 2 and fake.requests[0].body == fake.requests[1].body


def test_launcher_queues_an_undelivered_del(installed, tmp_path):
    stdin = config(tmp_path, daemon_socket=str(tmp_path / 'nobody.sock'))
    proc = run([str(installed)], cni_env('DEL'), stdin)
    assert (proc.returncode, proc.stdout) == (0, b'')
    [queued] = (tmp_path / 'state' / 'del-queue').iterdir()
    assert json.loads(queued.read_bytes())['CNI_CONTAINERID'] == 'c0ffee'


def test_launcher_runs_the_bytecode_installed_and_imports_nothing_more(installed, tmp_path):
    cached = importlib.util.cache_from_source(
        str(installed.parent / '.kuryr-cni' / (MODULE + '.py')))
    before = os.stat(cached).st_mtime_ns, open(cached, 'rb').read()
    empty = tmp_path / 'empty.py'
    empty.write_text('')
    _proc, baseline = _imported_modules([str(empty)], {}, b'')
    proc, names = _imported_modules([str(installed)], {'CNI_COMMAND': 'VERSION'}, b'')
    assert proc.returncode == 0, proc.stdout
    assert names - baseline <= IMPORT_ALLOW_LIST | {MODULE}, sorted(names - baseline)
    # Python rewrites a cache it finds stale; this one was taken as it is.
    assert (os.stat(cached).st_mtime_ns, open(cached, 'rb').read()) == before


def test_launcher_never_runs_stale_bytecode(installed):
    """A copy changed at the same size within the same second is still recompiled."""
    module = installed.parent / '.kuryr-cni' / (MODULE + '.py')
    before = module.stat()
    source = module.read_bytes()
    changed = source.replace(b"'0.3.0', '0.3.1'", b"'0.3.0', '0.3.9'", 1)
    assert changed != source and len(changed) == len(source)
    module.write_bytes(changed)
    os.utime(module, ns=(before.st_atime_ns, before.st_mtime_ns))
    proc = run([str(installed)], {'CNI_COMMAND': 'VERSION'}, b'')
    assert json.loads(proc.stdout)['supportedVersions'][1] == '0.3.9'


@pytest.mark.parametrize('how', ['relative path', 'interpreter with file name'])
def test_launcher_finds_its_shim_from_where_it_is(installed, how):
    argv = (['./kuryr-cni'] if how == 'relative path'
            else [SYSTEM_PYTHON, '-IS', 'kuryr-cni'])
    proc = run(argv, {'CNI_COMMAND': 'VERSION'}, b'', cwd=installed.parent)
    assert (proc.returncode, json.loads(proc.stdout)['cniVersion']) == (0, '1.1.0')


def test_launcher_without_its_shim_answers_a_cni_error(installed):
    shutil.rmtree(installed.parent / '.kuryr-cni')
    proc = run([str(installed)], {'CNI_COMMAND': 'VERSION'}, b'')
    assert proc.returncode == 1
    error = json.loads(proc.stdout)
    assert error['code'] == 999 and 'kuryr-cni --install' in error['details'], error


def test_install_again_replaces_in_place_and_leaves_nothing_else(installed):
    bin_dir = installed.parent
    first = files_under(bin_dir)
    proc = install(bin_dir)
    assert proc.returncode == 0, proc.stderr
    assert files_under(bin_dir) == first    # no temporary file left
    assert run([str(installed)], {'CNI_COMMAND': 'VERSION'}, b'').returncode == 0


@pytest.mark.parametrize('argv', [['--install'], ['--install', ''], ['--install', 'a', 'b']])
def test_install_usage_error_changes_nothing(tmp_path, argv):
    proc = subprocess.run([str(SHIM)] + argv, capture_output=True, timeout=30, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == b''
    assert proc.stderr.startswith(b'usage: kuryr-cni --install DIR')
    assert list(tmp_path.iterdir()) == []


def test_install_into_missing_dir_fails_in_one_line(tmp_path):
    proc = install(tmp_path / 'missing')
    assert proc.returncode == 1 and proc.stdout == b''
    assert proc.stderr.startswith(b'kuryr-cni: cannot install into %s' % bytes(tmp_path))
    assert proc.stderr.count(b'\n') == 1
    assert list(tmp_path.iterdir()) == []
