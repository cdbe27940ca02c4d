"""A container runtime emulator that drives the real shim the way libcni does.

Reproduced behaviour: every ``CNI_*`` variable is exported (empty when unset);
results are cached in ``<cache_dir>/results/<network>-<containerID>-<ifname>``;
CHECK and DEL get the cached result as ``prevResult``; the cache entry is removed
only after a successful DEL; GC first DELs every cached attachment missing from
the valid list, then sends GC with ``cni.dev/valid-attachments``.
"""

import dataclasses
import json
import os
import subprocess

from kuryr_cni.testbed import host as testhost


@dataclasses.dataclass
class Sandbox:
    container_id: str
    netns: str
    pod_name: str
    pod_namespace: str = 'default'
    pod_uid: str | None = None
    ifname: str = 'eth0'

    def cni_args(self):
        args = ['IgnoreUnknown=1', 'K8S_POD_NAMESPACE=' + self.pod_namespace,
                'K8S_POD_NAME=' + self.pod_name]
        if self.pod_uid:
            args.append('K8S_POD_UID=' + self.pod_uid)
        return ';'.join(args)


@dataclasses.dataclass
class Outcome:
    code: int            # the shim's exit status
    output: dict | None  # its stdout, decoded

    @property
    def ok(self):
        return self.code == 0

    @property
    def error_code(self):
        return (self.output or {}).get('code')


class Runtime:
    def __init__(self, socket_path, state_dir, cache_dir, cni_version='1.1.0',
                 network='kuryr', shim=testhost.SHIM, timeout=110):
        self.shim = shim
        self.cache_dir = cache_dir
        self.network = network
        self.netconf = {'cniVersion': cni_version, 'name': network, 'type': 'kuryr-cni',
                        'daemon_socket': socket_path, 'state_dir': state_dir,
                        'timeout': timeout}

    def add(self, sandbox):
        outcome = self.execute('ADD', sandbox)
        if outcome.ok:
            self._cache_write(sandbox, outcome.output)
        return outcome

    def delete(self, sandbox, netns=None):
        """DEL; ``netns=''`` sends the empty CNI_NETNS of a runtime's second DEL."""
        outcome = self.execute('DEL', sandbox, netns=netns,
                               prev_result=self._cache_read(sandbox))
        if outcome.ok:
            self._cache_remove(sandbox)
        return outcome

    def check(self, sandbox):
        return self.execute('CHECK', sandbox, prev_result=self._cache_read(sandbox))

    def status(self):
        return self.execute('STATUS', None)

    def version(self):
        return self.execute('VERSION', None)

    def gc(self, valid_sandboxes):
        valid = {(s.container_id, s.ifname) for s in valid_sandboxes}
        for container_id, ifname, cached in self.cached():
            if (container_id, ifname) not in valid:
                sandbox = Sandbox(container_id, '', cached['pod_name'],
                                  cached['pod_namespace'], ifname=ifname)
                self.delete(sandbox, netns='')
        config = dict(self.netconf)
        config['cni.dev/valid-attachments'] = [
            {'containerID': cid, 'ifname': ifname} for cid, ifname in sorted(valid)]
        return self.execute('GC', None, config=config)

    def execute(self, command, sandbox, netns=None, prev_result=None, config=None, env=None):
        config = dict(config or self.netconf)
        if prev_result is not None:
            config['prevResult'] = prev_result
        full_env = {'PATH': os.environ.get('PATH', '/usr/bin:/bin'), 'CNI_COMMAND': command,
                    'CNI_CONTAINERID': '', 'CNI_NETNS': '', 'CNI_IFNAME': '',
                    'CNI_ARGS': '', 'CNI_PATH': '/opt/cni/bin'}
        if sandbox is not None:
            full_env.update(CNI_CONTAINERID=sandbox.container_id,
                            CNI_NETNS=sandbox.netns if netns is None else netns,
                            CNI_IFNAME=sandbox.ifname, CNI_ARGS=sandbox.cni_args())
        full_env.update(env or {})
        proc = subprocess.run([self.shim], env=full_env, input=json.dumps(config).encode(),
                              capture_output=True, timeout=self.netconf['timeout'] + 10)
        output = json.loads(proc.stdout) if proc.stdout.strip() else None
        return Outcome(proc.returncode, output)

    # The result cache ----------------------------------------------------------

    def _cache_path(self, container_id, ifname):
        return os.path.join(self.cache_dir, 'results',
                            '%s-%s-%s' % (self.network, container_id, ifname))

    def _cache_write(self, sandbox, result):
        os.makedirs(os.path.join(self.cache_dir, 'results'), exist_ok=True)
        with open(self._cache_path(sandbox.container_id, sandbox.ifname), 'w') as f:
            json.dump({'result': result, 'pod_name': sandbox.pod_name,
                       'pod_namespace': sandbox.pod_namespace}, f)

    def _cache_read(self, sandbox):
        try:
            with open(self._cache_path(sandbox.container_id, sandbox.ifname)) as f:
                return json.load(f)['result']
        except FileNotFoundError:
            return None

    def _cache_remove(self, sandbox):
        try:
            os.unlink(self._cache_path(sandbox.container_id, sandbox.ifname))
        except FileNotFoundError:
            pass

    def cached(self):
        """``(container_id, ifname, entry)`` for every cached attachment."""
        directory = os.path.join(self.cache_dir, 'results')
        prefix = self.network + '-'
        entries = []
        for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
            if name.startswith(prefix):
                container_id, _, ifname = name[len(prefix):].rpartition('-')
                with open(os.path.join(directory, name)) as f:
                    entries.append((container_id, ifname, json.load(f)))
        return entries
