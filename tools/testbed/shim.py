"""The CNI shim that tests, the demo and the benchmark run: ``shim/kuryr-cni``.

It is a build product of ``tools/build-shim`` (Go, never committed), so
:func:`built` builds it first when it is missing or older than its sources;
without a Go toolchain it raises :class:`ShimUnavailable`, which fails the
caller: a run without the shim must never pass by skipping what needs it.
:func:`install` copies it into a CNI bin dir, as operators install it.
"""

import glob
import os
import shutil
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATH = os.path.join(REPO, 'shim', 'kuryr-cni')
BUILD = os.path.join(REPO, 'tools', 'build-shim')
BUILD_TIMEOUT = 600     # seconds: a cold Go build cache on a busy machine


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
    return PATH


def _build():
    if shutil.which('go') is None:
        raise ShimUnavailable('%s is not built and there is no Go toolchain to build it: '
                              'install golang-go (tools/bootstrap does), then run '
                              'tools/build-shim' % PATH)
    proc = subprocess.run([BUILD, PATH], capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    if proc.returncode:
        raise ShimUnavailable('tools/build-shim failed:\n%s%s' % (proc.stdout, proc.stderr))


def install(bin_dir):
    """Copy the shim into ``bin_dir`` atomically, mode 0755; return its path there."""
    source = built()
    target = os.path.join(bin_dir, 'kuryr-cni')
    tmp = os.path.join(bin_dir, '.kuryr-cni.%d.tmp' % os.getpid())
    shutil.copyfile(source, tmp)
    os.chmod(tmp, 0o755)
    os.rename(tmp, target)
    return target
