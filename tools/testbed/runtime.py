"""A container runtime emulator that drives the real shim the way libcni does.

It reproduces libcni's ``CNIConfig`` (``AddNetworkList``, ``CheckNetworkList``,
``DelNetworkList``, ``GCNetworkList``, ``GetStatusNetworkList``,
``GetVersionInfo``) for a network configuration list whose one plugin is ours:

- the plugin's stdin is its entry of the list with the list's ``name`` and
  ``cniVersion`` injected, plus ``prevResult`` where libcni adds one;
- the runtime's own environment is passed on and every ``CNI_*`` variable is
  exported, empty when it has no value;
- ADD's output is read as libcni's typed result of its version (unknown keys
  dropped, empty lists left out) and cached in
  ``<cache_dir>/results/<network>-<containerID>-<ifname>`` as libcni's
  ``cniCacheV1`` JSON: kind, containerId, config (the list's bytes, base64),
  ifName, networkName, netns, cniArgs and result;
- CHECK is refused without running the plugin for configs older than 0.4.0
  (:class:`NotSupported`) and gets the cached result, converted to the
  config's version, as ``prevResult``;
- DEL gets ``prevResult`` from 0.4.0 on (an unreadable cache entry is dropped
  and the DEL goes on without); the entry is removed only after a successful
  DEL;
- GC first DELs every cached attachment of the network missing from the valid
  list, with its cached netns and CNI_ARGS, then, from 1.1.0 on, sends GC
  with the list under ``cni.dev/valid-attachments`` and its alias
  ``cni.dev/attachments``;
- STATUS is sent from 1.1.0 on; for older configs libcni answers success
  without asking the plugin (here: None).

:meth:`Runtime.execute` runs the shim directly, for what a runtime would
never send (bad input, commands an old version lacks).
"""

import base64
import dataclasses
import ipaddress
import json
import os
import subprocess

from tools.testbed import shim as testshim

CACHE_KIND = 'cniCacheV1'
LIBCNI_VERSION = '1.1.0'        # what libcni's GetVersionInfo sends: its own newest version
VALID_ATTACHMENTS_KEYS = ('cni.dev/valid-attachments', 'cni.dev/attachments')


class NotSupported(Exception):
    """libcni refuses the operation for this config version without running the plugin."""


class ProtocolError(Exception):
    """The plugin's output is not what libcni can read (libcni fails the operation)."""


@dataclasses.dataclass
class Sandbox:
    container_id: str
    netns: str
    pod_name: str
    pod_namespace: str = 'default'
    pod_uid: str | None = None
    ifname: str = 'eth0'

    def args(self):
        """CNI_ARGS as libcni's RuntimeConf.Args: ``[[key, value], ...]``."""
        args = [['IgnoreUnknown', '1'], ['K8S_POD_NAMESPACE', self.pod_namespace],
                ['K8S_POD_NAME', self.pod_name]]
        if self.pod_uid:
            args.append(['K8S_POD_UID', self.pod_uid])
        return args

    def cni_args(self):
        return _stringify(self.args())


@dataclasses.dataclass
class Outcome:
    code: int            # the shim's exit status
    output: dict | None  # its stdout, decoded
    stdout: bytes = b''
    stderr: bytes = b''
    # GC only: (container ID, ifname, Outcome) of each stale attachment's DEL
    stale_dels: list = dataclasses.field(default_factory=list)

    @property
    def ok(self):
        return self.code == 0

    @property
    def error_code(self):
        return (self.output or {}).get('code')


class Runtime:
    def __init__(self, socket_path, state_dir, cache_dir, cni_version='1.1.0',
                 network='kuryr', shim=None, timeout=110, plugin=None):
        """``plugin``: the plugin's entry of the list in place of the shim's (another CNI's
        executable given as ``shim``, e.g. upstream's kuryr-cni); ``timeout`` is then how
        long the runtime waits for it before it kills it."""
        self.shim = shim or testshim.built()
        self.cache_dir = cache_dir
        self.network = network
        self.cni_version = cni_version
        # Ours times out by itself (the netconf's timeout; the runtime waiting longer is a
        # failure of the test); another plugin is killed after ``timeout``, as libcni does.
        self.foreign = plugin is not None
        self.kill_after = timeout if self.foreign else timeout + 10
        # The plugin's stdin (its list entry with name and cniVersion injected).
        self.netconf = {'cniVersion': cni_version, 'name': network,
                        **(plugin or {'type': 'kuryr-cni', 'daemon_socket': socket_path,
                                      'state_dir': state_dir, 'timeout': timeout})}
        plugin = {k: v for k, v in self.netconf.items() if k not in ('cniVersion', 'name')}
        self.conflist = json.dumps({'cniVersion': cni_version, 'name': network,
                                    'plugins': [plugin]}).encode()

    # The libcni operations --------------------------------------------------------

    def add(self, sandbox):
        outcome = self.execute('ADD', sandbox)
        if outcome.ok:
            self._cache_write(sandbox, _typed(outcome.output, self._result_version(outcome)))
        return outcome

    def check(self, sandbox):
        if _older(self.cni_version, '0.4.0'):
            raise NotSupported('configuration version %r does not support the CHECK command'
                               % self.cni_version)
        return self.execute('CHECK', sandbox, prev_result=self._cache_read(sandbox))

    def delete(self, sandbox, netns=None):
        """DEL; ``netns=''`` sends the empty CNI_NETNS of a runtime's second DEL."""
        prev = None
        if not _older(self.cni_version, '0.4.0'):
            try:
                prev = self._cache_read(sandbox)
            except ValueError:          # unreadable: dropped, the DEL goes on without
                self._cache_remove(sandbox)
        outcome = self.execute('DEL', sandbox, netns=netns, prev_result=prev)
        if outcome.ok:
            self._cache_remove(sandbox)
        return outcome

    def status(self):
        if _older(self.cni_version, '1.1.0'):
            return None
        return self.execute('STATUS', None)

    def version(self, cni_version=LIBCNI_VERSION):
        return self.execute('VERSION', None, config={'cniVersion': cni_version},
                            env={'CNI_PATH': 'dummy'})

    def gc(self, valid_sandboxes):
        """GCNetworkList; ``valid_sandboxes``: Sandbox objects or (containerID, ifname)."""
        valid = [(s.container_id, s.ifname) if isinstance(s, Sandbox) else tuple(s)
                 for s in valid_sandboxes]
        stale_dels = []
        for entry in self.cached():
            key = (entry['containerId'], entry['ifName'])
            if entry['networkName'] != self.network or key in valid:
                continue
            sandbox = _CachedSandbox(entry)
            stale_dels.append(key + (self.delete(sandbox, netns=entry.get('netns', '')),))
        if _older(self.cni_version, '1.1.0'):
            return None
        attachments = [{'containerID': cid, 'ifname': ifname} for cid, ifname in valid]
        config = dict(self.netconf, **{key: attachments for key in VALID_ATTACHMENTS_KEYS})
        outcome = self.execute('GC', None, config=config)
        outcome.stale_dels = stale_dels
        return outcome

    def execute(self, command, sandbox, netns=None, prev_result=None, config=None, env=None,
                stdin=None):
        """Run the shim once. ``stdin`` (bytes) replaces the JSON config entirely."""
        config = dict(self.netconf if config is None else config)
        if prev_result is not None:
            config['prevResult'] = prev_result
        full_env = dict(os.environ, CNI_COMMAND=command, CNI_CONTAINERID='', CNI_NETNS='',
                        CNI_IFNAME='', CNI_ARGS='', CNI_PATH='/opt/cni/bin')
        if sandbox is not None:
            full_env.update(CNI_CONTAINERID=sandbox.container_id,
                            CNI_NETNS=sandbox.netns if netns is None else netns,
                            CNI_IFNAME=sandbox.ifname, CNI_ARGS=sandbox.cni_args())
        full_env.update(env or {})
        data = json.dumps(config).encode() if stdin is None else stdin
        try:
            proc = subprocess.run([self.shim], env=full_env, input=data, capture_output=True,
                                  timeout=self.kill_after)
        except subprocess.TimeoutExpired as exc:
            if not self.foreign:
                raise
            # libcni's exec under a context that expired: the plugin is killed, the
            # operation fails as a timeout (CNI code 11), whatever the plugin had begun.
            return Outcome(-9, {'code': 11, 'msg': 'killed by the runtime after %.0f s'
                                % exc.timeout}, exc.stdout or b'', exc.stderr or b'')
        output = json.loads(proc.stdout) if proc.stdout.strip() else None
        return Outcome(proc.returncode, output, proc.stdout, proc.stderr)

    # The result cache -------------------------------------------------------------

    def _cache_path(self, container_id, ifname):
        return os.path.join(self.cache_dir, 'results',
                            '%s-%s-%s' % (self.network, container_id, ifname))

    def _result_version(self, outcome):
        version = (outcome.output or {}).get('cniVersion')
        if not isinstance(version, str) or not version:
            raise ProtocolError('ADD result without cniVersion: %r' % (outcome.stdout,))
        return version

    def _cache_write(self, sandbox, result):
        entry = {'kind': CACHE_KIND, 'containerId': sandbox.container_id,
                 'config': base64.b64encode(self.conflist).decode(),
                 'ifName': sandbox.ifname, 'networkName': self.network}
        if sandbox.netns:
            entry['netns'] = sandbox.netns
        entry['cniArgs'] = sandbox.args()
        entry['result'] = result
        os.makedirs(os.path.join(self.cache_dir, 'results'), mode=0o700, exist_ok=True)
        path = self._cache_path(sandbox.container_id, sandbox.ifname)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, 'w') as f:
            json.dump(entry, f)

    def _cache_read(self, sandbox):
        """The cached result in the config's version; None when nothing is cached."""
        try:
            with open(self._cache_path(sandbox.container_id, sandbox.ifname)) as f:
                entry = json.load(f)
        except FileNotFoundError:
            return None
        if entry.get('kind') != CACHE_KIND or not isinstance(entry.get('result'), dict):
            raise ValueError('cache entry of %s/%s is not %s'
                             % (sandbox.container_id, sandbox.ifname, CACHE_KIND))
        return _typed(entry['result'], self.cni_version)

    def _cache_remove(self, sandbox):
        try:
            os.unlink(self._cache_path(sandbox.container_id, sandbox.ifname))
        except FileNotFoundError:
            pass

    def cached(self):
        """Every readable ``cniCacheV1`` entry, as GetCachedAttachments reads them."""
        directory = os.path.join(self.cache_dir, 'results')
        entries = []
        for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
            try:
                with open(os.path.join(directory, name)) as f:
                    entry = json.load(f)
            except (OSError, ValueError):
                continue
            if (isinstance(entry, dict) and entry.get('kind') == CACHE_KIND
                    and entry.get('ifName') and entry.get('networkName')):
                entries.append(entry)
        return entries


class _CachedSandbox(Sandbox):
    """A RuntimeConf rebuilt from a cache entry (GC's DEL): its CNI_ARGS as cached."""

    def __init__(self, entry):
        super().__init__(entry['containerId'], entry.get('netns', ''), '',
                         ifname=entry['ifName'])
        self._args = entry.get('cniArgs') or []

    def args(self):
        return self._args


def _stringify(args):
    return ';'.join('%s=%s' % (key, value) for key, value in args)


def _older(version, than):
    return tuple(int(p) for p in version.split('.')) < tuple(int(p) for p in than.split('.'))


def _typed(result, version):
    """``result`` as libcni's typed Result of ``version`` marshals it.

    Keys the version's types lack are dropped, empty optional ones left out,
    ``ips[].version`` derived from the address below 1.0.0 and absent from
    1.0.0 on. Raises ProtocolError for what libcni cannot parse.
    """
    if not isinstance(result, dict):
        raise ProtocolError('result is not a JSON object: %r' % (result,))
    new = not _older(version, '1.0.0')
    v11 = not _older(version, '1.1.0')
    typed = {'cniVersion': version}
    interface_keys = ('name', 'mac', 'mtu', 'sandbox', 'socketPath', 'pciID') if v11 \
        else ('name', 'mac', 'sandbox')
    route_keys = ('dst', 'gw', 'mtu', 'advmss', 'priority', 'table', 'scope') if v11 \
        else ('dst', 'gw')
    interfaces = [_pick(i, interface_keys) for i in _items(result, 'interfaces')]
    ips = [_ip(ip, new) for ip in _items(result, 'ips')]
    routes = [_route(r, route_keys) for r in _items(result, 'routes')]
    for key, items in (('interfaces', interfaces), ('ips', ips), ('routes', routes)):
        if items:
            typed[key] = items
    typed['dns'] = _pick(result.get('dns') or {}, ('nameservers', 'domain', 'search',
                                                   'options'))
    return typed


def _items(result, key):
    items = result.get(key) or []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ProtocolError('result "%s" is not a list of objects: %r' % (key, items))
    return items


def _pick(obj, keys):
    """The ``keys`` of ``obj`` Go's ``omitempty`` keeps (not null, empty or zero)."""
    return {k: obj[k] for k in keys if obj.get(k) not in (None, '', [], 0)}


def _ip(ip, new):
    try:
        address = ipaddress.ip_interface(ip['address'])
        if ip.get('gateway'):
            ipaddress.ip_address(ip['gateway'])
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError('result IP %r: %s' % (ip, exc)) from None
    typed = {} if new else {'version': str(address.version)}
    if isinstance(ip.get('interface'), int):
        typed['interface'] = ip['interface']
    typed['address'] = ip['address']
    if ip.get('gateway'):
        typed['gateway'] = ip['gateway']
    return typed


def _route(route, keys):
    try:
        ipaddress.ip_network(route['dst'], strict=False)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError('result route %r: %s' % (route, exc)) from None
    return _pick(route, keys)
