"""A private Open vSwitch for tests and the demo: its own database, server and switch.

``ovsdb-server`` and ``ovs-vswitchd`` from Debian's ``openvswitch-switch``
run as children of the caller with everything private: a fresh database
created from the installed schema, run directory, sockets, pidfiles and logs
in a temporary directory (``OVS_RUNDIR`` points there too, so the bridges'
management sockets are private), ``--no-chdir``. ``ovs-vswitchd`` runs inside
the given network namespace and bridges use the userspace datapath
(``datapath_type=netdev``), so no kernel module is needed; the system service
is never started or touched. :meth:`PrivateOVS.close` stops both processes by
pid and removes the directory.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

SCHEMA = '/usr/share/openvswitch/vswitch.ovsschema'
TOOLS = ('ovsdb-tool', 'ovsdb-server', 'ovs-vswitchd', 'ovs-vsctl')
START_TIMEOUT = 20


def missing():
    """Why a private OVS cannot run here, or None when it can."""
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        return 'Open vSwitch is not installed (no %s; Debian: openvswitch-switch)' \
            % ', '.join(absent)
    if not os.path.exists(SCHEMA):
        return 'the Open vSwitch schema %s is missing' % SCHEMA
    if not os.path.exists('/dev/net/tun'):
        return '/dev/net/tun is missing (the netdev datapath makes tap devices)'
    return None


class PrivateOVS:
    """``ovsdb-server`` + ``ovs-vswitchd`` (in network namespace ``netns_name``)."""

    def __init__(self, netns_name):
        self.netns_name = netns_name
        self.dir = tempfile.mkdtemp(prefix='kc-ovs-')
        self.db_sock = os.path.join(self.dir, 'db.sock')
        self.connection = 'unix:' + self.db_sock
        self.env = dict(os.environ, OVS_RUNDIR=self.dir, OVS_LOGDIR=self.dir,
                        OVS_DBDIR=self.dir)
        self._processes = []
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self):
        db = os.path.join(self.dir, 'conf.db')
        subprocess.run(['ovsdb-tool', 'create', db, SCHEMA], check=True, capture_output=True,
                       timeout=30)
        self.server = self._spawn(['ovsdb-server', db, '--remote=punix:' + self.db_sock,
                                   *self._private('ovsdb-server')])
        self._wait_for(lambda: os.path.exists(self.db_sock), 'ovsdb-server\'s socket')
        self.vsctl('--no-wait', 'init')
        self.switch = self._spawn(['ip', 'netns', 'exec', self.netns_name, 'ovs-vswitchd',
                                   self.connection, *self._private('ovs-vswitchd')])

    def _private(self, name):
        return ['--pidfile=%s/%s.pid' % (self.dir, name),
                '--unixctl=%s/%s.ctl' % (self.dir, name),
                '--log-file=%s/%s.log' % (self.dir, name), '--no-chdir']

    def _spawn(self, command):
        # 'ip netns exec' execs ovs-vswitchd: the Popen pid is the daemon's.
        proc = subprocess.Popen(
            command, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        self._processes.append(proc)
        return proc

    def _wait_for(self, condition, what):
        deadline = time.monotonic() + START_TIMEOUT
        while not condition():
            for proc in self._processes:
                if proc.poll() is not None:
                    raise RuntimeError('%s exited with %s while waiting for %s; see %s'
                                       % (proc.args[0], proc.returncode, what, self.dir))
            if time.monotonic() > deadline:
                raise TimeoutError('no %s after %ss' % (what, START_TIMEOUT))
            time.sleep(0.02)

    def vsctl(self, *args):
        """Run ``ovs-vsctl`` on the private database, bounded; return its stdout."""
        proc = subprocess.run(['ovs-vsctl', '--db=' + self.connection,
                               '--timeout=%d' % START_TIMEOUT, *args],
                              env=self.env, capture_output=True, text=True,
                              timeout=START_TIMEOUT + 10)
        if proc.returncode:
            raise RuntimeError('ovs-vsctl %s failed: %s' % (' '.join(args), proc.stderr.strip()))
        return proc.stdout

    def add_bridge(self, name):
        """Create a userspace bridge and wait until ovs-vswitchd has made it."""
        self.vsctl('add-br', name, '--', 'set', 'bridge', name, 'datapath_type=netdev')

    def interface(self, name):
        """``{column: value}`` of Interface ``name`` as ``ovs-vsctl`` prints them, or None."""
        proc = subprocess.run(['ovs-vsctl', '--db=' + self.connection, '--timeout=10',
                               '--format=json', '--data=json', 'list', 'Interface', name],
                              env=self.env, capture_output=True, text=True, timeout=20)
        if proc.returncode:
            return None
        table = json.loads(proc.stdout)
        return dict(zip(table['headings'], table['data'][0])) if table['data'] else None

    def ports(self, bridge):
        """Names of the ports of ``bridge`` (its own internal port included)."""
        return set(self.vsctl('list-ports', bridge).split())

    def stop_switch(self):
        """Stop ovs-vswitchd only: the database still answers, nothing applies it."""
        _stop(self.switch)

    def close(self):
        for proc in reversed(self._processes):
            _stop(proc)
        self._processes = []
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _stop(proc):
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
