"""The vm tier's guests: user-mode Linux nodes booted by ``tools/vm``.

:class:`Guests` owns one ``tools/vm`` directory: the guests booted together,
their network namespace, their spools. The checkout and the wheel folder of
the build are shared read-only at the same paths in every guest, so a guest
runs the suite's own files; :meth:`Guests.run` runs one shell line in a guest
as root and returns its exit status and output.
"""

import dataclasses
import hashlib
import os
import re
import subprocess
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(REPO, 'tools', 'vm')
CACHE = os.path.realpath(os.environ.get('VM_CACHE') or os.path.join(REPO, '.cache', 'vm'))
WHEELS = os.path.join(CACHE, 'wheels')
START_TIMEOUT = 600     # seconds: tools/vm's own boot timeout (180 s a guest) and slack
STOP_TIMEOUT = 120
VENV = '/opt/venv'      # in a guest: the test runner's virtualenv, from WHEELS
_READY = re.compile(r'^(\S+): ready in ([0-9.]+) s at (\S+):', re.M)


def missing():
    """Why the tier cannot run here, or None."""
    if os.geteuid() != 0:
        return 'needs root (network namespaces, taps, user-mode Linux)'
    if not os.path.exists('/dev/net/tun'):
        return 'needs /dev/net/tun for the guests\' taps'
    if not os.path.exists(os.path.join(CACHE, 'image.key')) or not os.path.isdir(WHEELS):
        return 'the guests are not built: run tools/vm build (cache: %s)' % CACHE
    return None


@dataclasses.dataclass
class Result:
    """What a command in a guest did: its exit status and its output (stdout + stderr)."""
    returncode: int
    output: str

    def check(self, what):
        assert self.returncode == 0, '%s: exit %d\n%s' % (what, self.returncode, self.output)
        return self.output


@dataclasses.dataclass
class Guest:
    """One booted guest: its name, address on the tier's bridge and boot time."""
    name: str
    address: str
    boot_seconds: float


class Guests:
    """The guests of one ``tools/vm`` directory; :meth:`close` stops them all."""

    def __init__(self, directory, names, shares=(), trunk=False):
        """``trunk``: each guest gets a second NIC, ``vec1``, on tap ``trunk<i>`` of
        :attr:`netns` (i: its number, from 1), attached to nothing."""
        self.directory = directory
        self.shares = [REPO, WHEELS, *shares]
        args = [TOOL, 'start', directory, *(['--trunk'] if trunk else [])]
        for share in self.shares:
            args += ['--share', share]
        started = time.monotonic()
        proc = subprocess.run([*args, *names], capture_output=True, text=True,
                              timeout=START_TIMEOUT)
        self.start_seconds = time.monotonic() - started
        self.guests = {name: Guest(name, address, float(seconds))
                       for name, seconds, address in _READY.findall(proc.stdout)}
        if proc.returncode:
            self.close()
            raise AssertionError('tools/vm start failed (%d):\n%s%s'
                                 % (proc.returncode, proc.stdout, proc.stderr))
        with open(os.path.join(directory, 'run', 'cache')) as f:
            assert f.read().strip() == CACHE

    @property
    def netns(self):
        """The tier's network namespace, with the bridge at :data:`GATEWAY`."""
        return 'kuryr-vm.' + _md5(os.path.realpath(self.directory))[:12]

    def run(self, name, command, timeout=120):
        """Run one shell line in guest ``name``; a :class:`Result`."""
        proc = subprocess.run([TOOL, 'run', self.directory, name, '--timeout', str(timeout),
                               command], capture_output=True, text=True, timeout=timeout + 60)
        return Result(proc.returncode, proc.stdout + proc.stderr)

    def reboot(self, name):
        """Power guest ``name`` off and boot it again over its disk; ``tools/vm``'s account."""
        proc = subprocess.run([TOOL, 'reboot', self.directory, name], capture_output=True,
                              text=True, timeout=STOP_TIMEOUT + START_TIMEOUT)
        assert proc.returncode == 0, 'tools/vm reboot failed (%d):\n%s%s' % (
            proc.returncode, proc.stdout, proc.stderr)
        return proc.stdout

    def memory_mib(self, name):
        """What guest ``name`` holds of the host's memory: the resident pages of its RAM.

        UML's guest RAM is one file in /dev/shm, unlinked at once, which every
        process of the guest maps, some pages twice: summing the processes'
        PSS counts pages more than once (three times the RAM, seen). fincore
        of the file counts each resident page once.
        """
        with open(os.path.join(self.directory, 'guests', name, 'pid')) as f:
            fds = '/proc/%d/fd' % int(f.read())
        ram = [os.path.join(fds, fd) for fd in os.listdir(fds)
               if os.readlink(os.path.join(fds, fd)).startswith('/dev/shm/')]
        out = subprocess.run(['fincore', '--bytes', '--noheadings', '--output', 'RES', *ram],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        return sum(int(n) for n in out.split()) // (1024 * 1024)

    def console(self, name):
        with open(os.path.join(self.directory, 'guests', name, 'console.log'), 'rb') as f:
            return f.read().decode(errors='replace')

    def close(self):
        subprocess.run([TOOL, 'stop', self.directory], capture_output=True, text=True,
                       timeout=STOP_TIMEOUT, check=True)


def _md5(text):
    return hashlib.md5(text.encode()).hexdigest()


def venv_command(wheels=WHEELS, venv=VENV):
    """The shell line that makes the test runner's virtualenv in a guest (Debian's Python)."""
    return ('test -x {venv}/bin/python || {{ python3 -m venv {venv} && '
            '{venv}/bin/pip install --quiet --disable-pip-version-check --no-compile --no-index '
            '--find-links {wheels} -r {wheels}/requirements.txt; }}'
            .format(venv=venv, wheels=wheels))
