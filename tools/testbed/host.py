"""A throwaway node for the functional tests, the demo and the benchmark.

It is a network namespace of its own ("the host"), holding the pods' bridge
with the gateway address on it (put there as a router would, never by the
daemon), the Kubernetes API stand-in's listening socket, and the daemon under
test, which runs inside it. Pod namespaces are made on request. ``close()``
removes every namespace, process and file it made, the machine's own
namespace is never touched.
"""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

from kuryr_cni import netns
from tools.testbed import apiserver
from tools.testbed import shim

BRIDGE = 'kuryr-br0'
SUBNET_PREFIX = '10.10.0'
GATEWAY = SUBNET_PREFIX + '.1'
# The gateway's MAC, set on the bridge: a Linux bridge without one takes the lowest
# MAC of its ports, which changes as pods come and go, and the pods' ARP entries for
# the gateway then name a MAC nobody has until they expire (pings lost for seconds).
GATEWAY_MAC = '02:00:0a:0a:00:01'
NODE = 'node-1'


def ip(*args, check=True):
    return subprocess.run(['ip', *args], check=check, capture_output=True, text=True,
                          timeout=30)


class Host:
    def __init__(self, prefix='kc', workdir=None, bridge=True, netns=None):
        """``netns``: an existing namespace to be the host (its maker removes it), else new."""
        self.tag = '%s-%s' % (prefix, uuid.uuid4().hex[:6])
        self.ns = netns or self.tag + '-host'
        self._own_ns = netns is None
        self.path = '/run/netns/' + self.ns
        self.workdir = workdir or tempfile.mkdtemp(prefix=self.tag + '-')
        # Others may pass through, not list: as through /etc, the daemon's
        # processes that run without root read the token file it holds.
        os.chmod(self.workdir, 0o711)
        self.state_dir = os.path.join(self.workdir, 'state')
        self.socket = os.path.join(self.workdir, 'run', 'daemon.sock')
        self.pod_namespaces = []
        self.daemon = None
        self.api = None
        self._notify = None
        if self._own_ns:
            ip('netns', 'add', self.ns)
            ip('-n', self.ns, 'link', 'set', 'lo', 'up')
        if bridge:
            ip('-n', self.ns, 'link', 'add', BRIDGE, 'type', 'bridge')
            ip('-n', self.ns, 'link', 'set', BRIDGE, 'address', GATEWAY_MAC)
            ip('-n', self.ns, 'addr', 'add', GATEWAY + '/24', 'dev', BRIDGE)
            ip('-n', self.ns, 'link', 'set', BRIDGE, 'up')

    # The Kubernetes API stand-in, listening inside the host namespace ---------

    def start_api(self, **kwargs):
        sock = netns.socket_in(self.path, socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(('127.0.0.1', 0))
        sock.listen(128)
        self.api = apiserver.APIServer(sock=sock, **kwargs)
        return self.api

    def install_shim(self):
        """Install the shim as operators do (a copy of the executable, and an allow
        file for the paths under this host's directory: its socket, its state dir,
        the benchmark's stub daemon); return its path."""
        bin_dir = os.path.join(self.workdir, 'cni-bin')
        os.makedirs(bin_dir, exist_ok=True)
        return shim.install(bin_dir, allowed=(self.workdir.rstrip('/') + '/',))

    # Pods --------------------------------------------------------------------

    def pod_netns(self):
        name = '%s-pod-%s' % (self.tag, uuid.uuid4().hex[:6])
        ip('netns', 'add', name)
        self.pod_namespaces.append(name)
        return '/run/netns/' + name

    def remove_netns(self, path):
        name = os.path.basename(path)
        ip('netns', 'del', name, check=False)
        with contextlib.suppress(ValueError):
            self.pod_namespaces.remove(name)

    @staticmethod
    def vifs(index, active=True, **overrides):
        """A bridge-kind VIF annotation for the pod numbered ``index`` (2..250)."""
        vif = {'kind': 'bridge', 'port_id': 'port-%d' % index,
               'mac': 'fa:16:3e:00:%02x:%02x' % (index // 256, index % 256), 'mtu': 1450,
               'bridge': BRIDGE, 'ips': ['%s.%d/24' % (SUBNET_PREFIX, index)],
               'gateway': GATEWAY, 'active': active}
        vif.update(overrides)
        return {'eth0': vif}

    # The daemon under test ---------------------------------------------------

    def write_config(self, workers=4, vif_timeout=20, extra=''):
        path = os.path.join(self.workdir, 'kuryr-cni.conf')
        with open(path, 'w') as f:
            f.write(CONFIG_TEMPLATE.format(
                log_file=os.path.join(self.workdir, 'daemon.log'), node=NODE,
                socket=self.socket, state_dir=self.state_dir, workers=workers,
                vif_timeout=vif_timeout, api_root=self.api.url if self.api else '') + extra)
        return path

    def start_daemon(self, workers=4, vif_timeout=20, extra='', wait=True, timeout=60,
                     env=None, config_files=None):
        """Start the daemon; ``env`` adds to its environment (e.g. WATCHDOG_USEC).

        ``config_files`` replace the file :meth:`write_config` writes.
        """
        files = config_files or [self.write_config(workers, vif_timeout, extra)]
        notify_path = os.path.join(self.workdir, 'notify.sock')
        with contextlib.suppress(FileNotFoundError):
            os.unlink(notify_path)
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._notify.bind(notify_path)
        env = dict(os.environ, NOTIFY_SOCKET=notify_path, **(env or {}))
        self.daemon = subprocess.Popen(
            ['ip', 'netns', 'exec', self.ns, *daemon_command(),
             *(arg for path in files for arg in ('--config-file', path))],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(self.workdir, 'daemon.stderr'), 'ab'),
            start_new_session=True)
        if wait:
            self.wait_ready(timeout)
        return self.daemon

    def wait_ready(self, timeout=60):
        """Wait for the daemon's own READY=1 (systemd's notify protocol)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.daemon.poll() is not None:
                raise RuntimeError('daemon exited with %s; log: %s'
                                   % (self.daemon.returncode, self.log_tail()))
            self._notify.settimeout(min(1.0, max(0.01, deadline - time.monotonic())))
            try:
                message = self._notify.recv(4096).decode()
            except socket.timeout:
                continue
            if 'READY=1' in message.split('\n'):
                return
        raise TimeoutError('daemon not ready after %ss; log: %s' % (timeout, self.log_tail()))

    def notifications(self, timeout=0.5):
        """Notify messages received since the last read (non-blocking beyond ``timeout``)."""
        messages = []
        self._notify.settimeout(timeout)
        with contextlib.suppress(socket.timeout):
            while True:
                messages.append(self._notify.recv(4096).decode())
                self._notify.settimeout(0.01)
        return messages

    def stop_daemon(self, sig=signal.SIGTERM, timeout=60):
        """Signal the daemon's parent and wait; returns its exit status."""
        if self.daemon is None or self.daemon.poll() is not None:
            return self.daemon.returncode if self.daemon else None
        # 'ip netns exec' execs the daemon, so the Popen pid is the daemon's parent.
        os.kill(self.daemon.pid, sig)
        return self.daemon.wait(timeout)

    def _kill_group(self):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.daemon.pid, signal.SIGKILL)

    def daemon_pids(self):
        """Pids of the daemon's process group (parent, Manager, children)."""
        if self.daemon is None:
            return []
        out = subprocess.run(['pgrep', '-g', str(self.daemon.pid)], capture_output=True,
                             text=True, timeout=10).stdout
        return [int(p) for p in out.split()]

    def processes(self):
        """{pid: title} of every process started for this daemon (its session)."""
        out = subprocess.run(['ps', '-o', 'pid=,args=', '-s', str(self.daemon.pid)],
                             capture_output=True, text=True, timeout=10).stdout
        return {int(line.split(None, 1)[0]): line.split(None, 1)[1]
                for line in out.strip().splitlines()}

    def log_tail(self, lines=40):
        out = []
        for name in ('daemon.log', 'daemon.stderr'):
            with contextlib.suppress(FileNotFoundError):
                with open(os.path.join(self.workdir, name), errors='replace') as f:
                    out.extend(f.read().splitlines()[-lines:])
        return '\n'.join(out)

    # Looking inside ------------------------------------------------------------

    def links(self, path=None):
        """{ifname: link info} in ``path`` (default: the host namespace)."""
        with netns.iproute(path or self.path) as ipr:
            return {link.get('ifname'): link for link in ipr.get_links()}

    def addresses(self, path, ifname):
        """Global addresses of ``ifname`` (the kernel's own link-local ones left out)."""
        with netns.iproute(path) as ipr:
            index = ipr.link_lookup(ifname=ifname)
            if not index:
                return set()
            return {'%s/%s' % (a.get('IFA_ADDRESS'), a['prefixlen'])
                    for a in ipr.get_addr(index=index[0]) if a['scope'] == 0}

    def ping(self, path, address, count=1, wait=2):
        return subprocess.run(['ip', 'netns', 'exec', os.path.basename(path), 'ping', '-c',
                               str(count), '-W', str(wait), '-q', address],
                              capture_output=True, timeout=30).returncode == 0

    def http_get(self, port, path, timeout=10, address='127.0.0.1'):
        """GET ``path`` from ``address``:``port`` inside the host namespace."""
        family = socket.AF_INET6 if ':' in address else socket.AF_INET
        sock = netns.socket_in(self.path, family, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        with sock:
            sock.connect((address, port))
            sock.sendall(('GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n' % path).encode())
            data = b''
            while chunk := sock.recv(65536):
                data += chunk
        head, _, body = data.partition(b'\r\n\r\n')
        return int(head.split()[1]), body.decode()

    def close(self):
        if self.daemon is not None and self.daemon.poll() is None:
            # A daemon that does not stop in time is killed below; the
            # namespaces and files must go all the same.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.stop_daemon(signal.SIGTERM, timeout=30)
        if self.daemon is not None:
            self._kill_group()
        if self.api is not None:
            self.api.close()
        if self._notify is not None:
            self._notify.close()
        for name in list(self.pod_namespaces):
            ip('netns', 'del', name, check=False)
        if self._own_ns:
            ip('netns', 'del', self.ns, check=False)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def daemon_command():
    script = os.path.join(os.path.dirname(sys.executable), 'kuryr-cni-daemon')
    if os.path.exists(script):
        return [script]
    return [sys.executable, '-m', 'kuryr_cni.daemon.main']


CONFIG_TEMPLATE = """[DEFAULT]
debug = true
log_file = {log_file}

[cni_daemon]
node_name = {node}
socket = {socket}
state_dir = {state_dir}
worker_count = {workers}
vif_timeout = {vif_timeout}
vif_source = annotation

[kubernetes]
api_root = {api_root}

[health]
host = 127.0.0.1

[prometheus]
host = 127.0.0.1
"""
