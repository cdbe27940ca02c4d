"""The real kuryr-daemon 10.0.0 on a node of the openstack tier, beside (or instead of) ours.

It runs from ``tools/openstack build-kuryr-daemon``'s virtualenv inside the
stack's network namespace (ovs-vswitchd's userspace datapath reaches the
pods' veths only there), as a 10.0.0 node ran it: its HTTP server on
127.0.0.1:5036, the KuryrPort and pod watchers of its node, ``ovs-vsctl`` on
the node's Open vSwitch (``OVS_RUNDIR``). :meth:`KuryrDaemon.install_cni`
gives the runtime emulator its ``kuryr-cni`` executable and network entry,
run inside that namespace too (the daemon listens on its loopback).

One deviation, written here because it is the tier's and not kuryr's: before
each plug, os-vif 3.5 makes sure of the VIF's bridge with the port profile's
datapath type, ``system`` when kuryr-controller names none (it never does),
and so sets ``br-int`` to the kernel datapath. On the kernel-datapath nodes
kuryr ran on that changes nothing; on this tier's userspace ``br-int`` it
would take down every port. os-vif's own OVSDB connection therefore goes to
a scratch ovsdb-server holding a ``br-int`` record and nothing else, where
that call stays the no-op it was; kuryr-daemon's own plug and unplug
(``ovs-vsctl`` add-port/del-port, the part that matters here) use the node's.
"""

import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import tempfile
import time

from kuryr_cni import netns

PORT = 5036
START_TIMEOUT = 120      # its start imports os-vif, eventlet and openstacksdk: slow when busy
STOP_GRACE = 20
SCHEMA = '/usr/share/openvswitch/vswitch.ovsschema'
WATCHING = "Started watching '/api/v1/pods"


def build_dir(cache, constraints):
    """Where ``tools/openstack build-kuryr-daemon`` puts the build of ``constraints``' pins."""
    with open(constraints, 'rb') as f:
        return os.path.join(cache, 'kuryr-daemon-' + hashlib.sha256(f.read()).hexdigest()[:12])


class KuryrDaemon:
    """kuryr-daemon for ``node`` in namespace ``netns_name``, files under a new directory."""

    def __init__(self, build, netns_name, node, env, token_file, debug=True, launcher=None):
        """``launcher``: the command that runs a process in namespace ``netns_name`` (default
        ``ip netns exec``; a kubelet node's ``tools/node run`` adds its mount namespace,
        where the runtime's pod namespaces are)."""
        self.venv = os.path.join(build, 'venv')
        self.launcher = launcher or ['ip', 'netns', 'exec', netns_name]
        self.netns = netns_name
        self.path = '/run/netns/' + netns_name
        self.node = node
        self.env = env
        self.dir = tempfile.mkdtemp(prefix='kc-kuryr-daemon-')
        self.conf = os.path.join(self.dir, 'kuryr.conf')
        self.log = os.path.join(self.dir, 'kuryr-daemon.log')
        self.debug = debug      # False: logging as a production node ran it (the benchmark)
        self.process = None
        self._scratch = None
        os.makedirs(os.path.join(self.dir, 'lock'))
        with open(token_file) as f, open(os.path.join(self.dir, 'token'), 'w') as out:
            out.write(f.read().strip())
        self._write_config()

    def _write_config(self):
        # No K8S_CA: a plain-HTTP API (the benchmark's stand-in), nothing to verify.
        tls = ('ssl_ca_crt_file = %s\nssl_verify_server_crt = True' % self.env['K8S_CA']
               if self.env.get('K8S_CA') else 'ssl_verify_server_crt = False')
        with open(self.conf, 'w') as f:
            f.write(f"""[DEFAULT]
debug = {self.debug}
log_file = {self.log}
lock_path = {self.dir}/lock

[oslo_concurrency]
lock_path = {self.dir}/lock

[kubernetes]
api_root = {self.env['K8S_URL']}
{tls}
token_file = {self.dir}/token

[cni_daemon]
bind_address = 127.0.0.1:{PORT}
docker_mode = False

[neutron_defaults]
ovs_bridge = br-int

[os_vif_ovs]
ovsdb_connection = unix:{self.dir}/scratch-ovs/db.sock
""")

    # Its life -------------------------------------------------------------------------------

    def start(self):
        if self._scratch is None:
            self._start_scratch_ovsdb()
        env = {k: v for k, v in os.environ.items()
               if k not in ('REQUESTS_CA_BUNDLE', 'CURL_CA_BUNDLE')}
        # Its node is KUBERNETES_NODE_NAME's (else the hostname); its ovs-vsctl finds the
        # node's database through OVS_RUNDIR.
        # os-vif starts its privileged helper with `sudo privsep-helper`: this node has no sudo
        # and runs it as root already, so `sudo` is a pass-through first on its PATH.
        env.update(KUBERNETES_NODE_NAME=self.node,
                   OVS_RUNDIR=os.path.dirname(self.env['OVSDB'].split(':', 1)[1]),
                   PATH='%s:%s:%s' % (self._sudo_dir(), os.path.join(self.venv, 'bin'),
                                      env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')))
        self._watching_before = self.count(WATCHING)
        with open(os.path.join(self.dir, 'stdout.log'), 'ab') as out:
            self.process = subprocess.Popen(
                [*self.launcher, os.path.join(self.venv, 'bin', 'kuryr-daemon'),
                 '--config-file', self.conf], env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)
        _until(self._serving, START_TIMEOUT, 'kuryr-daemon to serve on port %d' % PORT, 0.2)

    def _sudo_dir(self):
        path = os.path.join(self.dir, 'sudo-bin')
        if not os.path.isdir(path):
            os.makedirs(path)
            with open(os.path.join(path, 'sudo'), 'w') as f:
                f.write('#!/bin/sh\nexec "$@"\n')
            os.chmod(os.path.join(path, 'sudo'), 0o755)
        return path

    def _serving(self):
        if self.process.poll() is not None:
            raise AssertionError('kuryr-daemon exited %s:\n%s'
                                 % (self.process.returncode, self.log_tail()))
        sock = netns.socket_in(self.path, socket.AF_INET, socket.SOCK_STREAM)
        with sock:
            sock.settimeout(2)
            try:
                sock.connect(('127.0.0.1', PORT))
            except OSError:
                return False
        # Serving is not yet watching: an ADD before its registry fills times out at once.
        return self.count(WATCHING) > self._watching_before

    def stop(self, sig=signal.SIGTERM):
        """Stop the whole process group (its cotyledon workers, its Manager)."""
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)
        try:
            self.process.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(STOP_GRACE)
        # Workers outlive a parent killed first: wait until none of the group is left.
        _until(lambda: not self._group_alive(), STOP_GRACE, 'kuryr-daemon to end', 0.1)

    def _group_alive(self):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
            return True
        return False

    def restart(self):
        self.stop()
        self.start()

    def pids(self):
        out = subprocess.run(['pgrep', '-g', str(self.process.pid)], capture_output=True,
                             text=True, timeout=10).stdout
        return [int(p) for p in out.split()]

    def close(self):
        if self.process is not None:
            self.stop()
        if self._scratch is not None:
            self._scratch.terminate()
            try:
                self._scratch.wait(10)
            except subprocess.TimeoutExpired:
                self._scratch.kill()
                self._scratch.wait(10)
        subprocess.run(['rm', '-rf', self.dir], check=False, timeout=60)

    def _start_scratch_ovsdb(self):
        run = os.path.join(self.dir, 'scratch-ovs')
        os.makedirs(run)
        db = os.path.join(run, 'conf.db')
        subprocess.run(['ovsdb-tool', 'create', db, SCHEMA], check=True, capture_output=True,
                       timeout=30)
        self._scratch = subprocess.Popen(
            ['ovsdb-server', db, '--remote=punix:' + os.path.join(run, 'db.sock'),
             '--no-chdir', '--unixctl=' + os.path.join(run, 'ovsdb-server.ctl'),
             '--log-file=' + os.path.join(run, 'ovsdb-server.log')],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        sock = os.path.join(run, 'db.sock')
        _until(lambda: os.path.exists(sock), 30, 'the scratch ovsdb-server', 0.05)
        # No ovs-vswitchd ever applies this database: its cur_cfg is set beyond any next_cfg
        # os-vif's transactions can reach, which then do not wait for one.
        subprocess.run(['ovs-vsctl', '--db=unix:' + sock, '--no-wait', '--timeout=20', 'init',
                        '--', 'add-br', 'br-int', '--', 'set', 'Open_vSwitch', '.',
                        'cur_cfg=%d' % 2 ** 31], check=True, capture_output=True, timeout=30)

    # What a runtime needs ---------------------------------------------------------------

    def install_cni(self):
        """``(executable, network entry)`` for :class:`tools.testbed.runtime.Runtime`: its
        kuryr-cni, run inside the stack's namespace, and a 10.0.0 node's CNI config."""
        path = os.path.join(self.dir, 'kuryr-cni')
        with open(path, 'w') as f:
            f.write('#!/bin/sh\nexec ip netns exec %s %s\n'
                    % (self.netns, os.path.join(self.venv, 'bin', 'kuryr-cni')))
        os.chmod(path, 0o755)
        return path, {'type': 'kuryr-cni', 'kuryr_conf': self.conf, 'debug': True}

    # Looking inside -----------------------------------------------------------------------

    def log_text(self):
        try:
            with open(self.log, errors='replace') as f:
                return f.read()
        except FileNotFoundError:
            return ''

    def log_tail(self, lines=40):
        return '\n'.join(self.log_text().splitlines()[-lines:])

    def count(self, text):
        """How often ``text`` is in its log so far."""
        return self.log_text().count(text)


def _until(predicate, timeout, what, interval):
    """For what announces itself by no event (a port that starts to listen, a process gone)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise TimeoutError('timed out after %s s waiting for %s' % (timeout, what))
        time.sleep(interval)
