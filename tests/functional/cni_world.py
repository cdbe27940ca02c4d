"""One test host and daemon shared by a whole module, and what each test makes there.

Starting a daemon costs seconds, so the CNI contract suites share one per
module; in exchange each test's leftovers are removed and checked after it
(:meth:`World.clean`): every sandbox it made gets a DEL, its pods leave the
API stand-in, its namespaces are deleted, and then no tagged host device,
binding, lock file or registry entry may remain.
"""

import json
import os

from kuryr_cni import ctl
from tools.testbed import host as testhost
from tools.testbed import runtime as testruntime

from tests.functional import conftest
from tests.functional import helpers

FIRST_INDEX = 10
LAST_INDEX = 250        # pod addresses are 10.10.0.<index>/24
BASE_LINKS = {'lo', testhost.BRIDGE}


def mac(index):
    return 'fa:16:3e:00:%02x:%02x' % (index // 256, index % 256)


def address(index):
    return '%s.%d/24' % (testhost.SUBNET_PREFIX, index)


class World:
    def __init__(self, host, workdir):
        self.host = host
        self.workdir = workdir
        self._index = FIRST_INDEX
        self._runtimes = 0
        self.made = []          # (runtime, sandbox) of this test
        self.pods = []          # (namespace, name) of this test

    def runtime(self, version='1.1.0', network='kuryr'):
        """A libcni-like runtime with a cache directory of its own."""
        self._runtimes += 1
        return testruntime.Runtime(
            self.host.socket, self.host.state_dir, cni_version=version, network=network,
            cache_dir=os.path.join(self.workdir, 'cni-cache-%d' % self._runtimes))

    def pod(self, runtime, active=True, ifname='eth0'):
        """Create a pod (bridge VIF) and its sandbox; returns ``(sandbox, index)``."""
        index = self._next_index()
        name = 'pod-%d' % index
        self.host.api.create_pod('default', name, testhost.NODE, uid='uid-%d' % index,
                                 annotations={'kuryr.openstack.org/vifs':
                                              json.dumps(self.host.vifs(index, active))})
        self.pods.append(('default', name))
        sandbox = testruntime.Sandbox('cid-%d' % index, self.host.pod_netns(), name,
                                      pod_uid='uid-%d' % index, ifname=ifname)
        self.made.append((runtime, sandbox))
        return sandbox, index

    def activate(self, sandbox, index):
        self.host.api.set_vifs('default', sandbox.pod_name, self.host.vifs(index, True))

    def _next_index(self):
        if self._index > LAST_INDEX:
            raise RuntimeError('out of pod addresses: make fewer pods per module')
        self._index += 1
        return self._index - 1

    # Between tests ------------------------------------------------------------------

    def clean(self):
        """DEL everything the test made and check that nothing is left anywhere."""
        failed = []
        for runtime, sandbox in self.made:
            outcome = runtime.execute('DEL', sandbox, netns='')
            if not outcome.ok:
                failed.append((sandbox.container_id, outcome.output))
        for namespace, name in self.pods:
            self.host.api.delete_pod(namespace, name)
        for name in list(self.host.pod_namespaces):
            self.host.remove_netns('/run/netns/' + name)
        self.made, self.pods = [], []
        assert not failed, 'cleanup DELs failed: %s' % failed
        assert helpers.leftovers(self.host) == helpers.NOTHING
        assert set(self.host.links()) == BASE_LINKS
        assert ctl.fetch(self.host.socket, '/v1/pods') == (200, [])

    # Observations ---------------------------------------------------------------------

    def snapshot(self):
        """The daemon's state and the kernel's devices, for "nothing changed" checks."""
        state = self.host.state_dir
        bindings = {}
        for name in sorted(os.listdir(os.path.join(state, 'bindings'))):
            with open(os.path.join(state, 'bindings', name)) as f:
                bindings[name] = json.load(f)
        queue = os.path.join(state, 'del-queue')
        return {
            'bindings': bindings,
            'locks': sorted(os.listdir(os.path.join(state, 'locks'))),
            'del-queue': sorted(os.listdir(queue)) if os.path.isdir(queue) else [],
            'registry': ctl.fetch(self.host.socket, '/v1/pods'),
            'host links': _links(self.host.links()),
            'pod links': {name: _links(self.host.links('/run/netns/' + name))
                          for name in self.host.pod_namespaces},
        }


def _links(links):
    return {name: (link['index'], link.get('address'), link.get('master'),
                   link.get('ifalias'), link.get('mtu'))
            for name, link in links.items()}


def start(tmp_path_factory):
    """Yield a World on a fresh host running the daemon; closes it all afterwards."""
    with testhost.Host(prefix=conftest.SESSION_PREFIX) as host:
        host.start_api()
        host.start_daemon(workers=2, vif_timeout=20)
        yield World(host, str(tmp_path_factory.mktemp('cni-world')))
