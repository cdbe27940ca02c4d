"""The CNI shim that tests, the demo and the benchmark run: ``shim/kuryr-cni``.

It is a build product of ``tools/build-shim`` (Go, never committed), so
:func:`built` builds it first when it is missing or older than its sources;
without a Go toolchain it raises :class:`ShimUnavailable`, which fails the
caller: a run without the shim must never pass by skipping what needs it.
:func:`install` copies it into a CNI bin dir, as operators install it.

The shim honours a ``daemon_socket`` or ``state_dir`` other than the
default only where the allow file beside it lists it (doc/source/cni.rst),
and tests run daemons at private paths: :func:`built` writes one beside the
build that allows the temporary directory (where every test's files are),
:func:`install` one that allows what its caller names.
"""

import glob
import json
import os
import shutil
import subprocess
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATH = os.path.join(REPO, 'shim', 'kuryr-cni')
BUILD = os.path.join(REPO, 'tools', 'build-shim')
BUILD_TIMEOUT = 600     # seconds: a cold Go build cache on a busy machine
ALLOW_FILE = 'kuryr-cni-paths.json'     # shim/allow.go's allowFileName


class ShimUnavailable(Exception):
    """The shim is not built and cannot be built here."""


def sources():
    """What the executable is built from, and how (the version is stamped in)."""
    return sorted(glob.glob(os.path.join(REPO, 'shim', '*.go'))) + [
        os.path.join(REPO, *parts) for parts in (
            ('shim', 'go.mod'), ('kuryr_cni', 'version.py'), ('tools', 'build-shim'),
            ('tools', 'go-env'))]


def built():
    """The path of ``shim/kuryr-cni``, built first when missing or stale."""
    try:
        made = os.stat(PATH).st_mtime
    except FileNotFoundError:
        made = None
    if made is None or any(os.stat(path).st_mtime > made for path in sources()):
        _build()
    allow(os.path.dirname(PATH), [tempfile.gettempdir().rstrip('/') + '/'])
    return PATH


def _build():
    if shutil.which('go') is None:
        raise ShimUnavailable('%s is not built and there is no Go toolchain to build it: '
                              'install golang-go (tools/bootstrap does), then run '
                              'tools/build-shim' % PATH)
    proc = subprocess.run([BUILD, PATH], capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    if proc.returncode:
        raise ShimUnavailable('tools/build-shim failed:\n%s%s' % (proc.stdout, proc.stderr))


def install(bin_dir, allowed=()):
    """Copy the shim into ``bin_dir`` atomically, mode 0755; return its path there.

    ``allowed``: the socket and state dir paths (an entry ending in ``/``: all
    below that directory) its allow file lists; none, no allow file.
    """
    source = built()
    target = os.path.join(bin_dir, 'kuryr-cni')
    _replace(target, lambda tmp: shutil.copyfile(source, tmp), 0o755)
    if allowed:
        allow(bin_dir, allowed)
    return target


def allow(bin_dir, allowed):
    """Write the allow file of the shim in ``bin_dir``: ``allowed`` for both keys."""
    text = json.dumps({'daemon_socket': list(allowed), 'state_dir': list(allowed)})
    path = os.path.join(bin_dir, ALLOW_FILE)
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except FileNotFoundError:
        pass

    def write(tmp):
        with open(tmp, 'w') as f:
            f.write(text)
    _replace(path, write, 0o644)


def _replace(path, write, mode):
    """Make ``path`` by ``write(tmp)`` then a rename: concurrent readers see it whole."""
    name = '.%s.%d.tmp' % (os.path.basename(path), os.getpid())
    tmp = os.path.join(os.path.dirname(path), name)
    write(tmp)
    os.chmod(tmp, mode)
    os.rename(tmp, path)
