"""Bad input through the real shim: the right CNI error, and nothing changed anywhere.

One pod is attached for the whole module. Every case below is a request
aimed at it (ADD from an intruding sandbox of the same pod, CHECK or DEL
from its own) with one thing wrong, which an accepted request would show:
each must exit non-zero with exactly one CNI error object on stdout carrying
the expected code, and leave the daemon's state (binding files, lock files,
DEL queue, the registry as /v1/pods shows it) and the kernel's devices (host
namespace, pod namespaces) exactly as they were.
"""

import dataclasses
import json
import os

import pytest

from tools.testbed import host as testhost
from tools.testbed import runtime as testruntime

from tests.functional import cni_world
from tests.functional import conftest

pytestmark = pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON)

VERSIONS = ('0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0')
DELETE = object()       # a config key to remove


@dataclasses.dataclass
class Case:
    name: str
    code: int
    command: str = 'ADD'
    env: dict = dataclasses.field(default_factory=dict)
    config: dict = dataclasses.field(default_factory=dict)
    stdin: bytes | None = None
    own: bool = False   # the live sandbox itself rather than an intruder of its pod

    def __str__(self):
        return self.name


def pod_args(name='{pod}', **extra):
    items = ['IgnoreUnknown=1', 'K8S_POD_NAMESPACE=default', 'K8S_POD_NAME=' + name]
    items += ['%s=%s' % item for item in extra.items()]
    return ';'.join(items)


CASES = [
    # CNI_COMMAND
    Case('CNI_COMMAND empty', 4, command=''),
    Case('CNI_COMMAND unknown', 4, command='FROB'),
    Case('CNI_COMMAND in lower case', 4, command='add'),
    # CNI_CONTAINERID
    Case('CNI_CONTAINERID empty for ADD', 4, env={'CNI_CONTAINERID': ''}),
    Case('CNI_CONTAINERID empty for DEL', 4, command='DEL', env={'CNI_CONTAINERID': ''}),
    Case('CNI_CONTAINERID empty for CHECK', 4, command='CHECK', env={'CNI_CONTAINERID': ''}),
    Case('CNI_CONTAINERID starting with -', 4, env={'CNI_CONTAINERID': '-cid'}),
    Case('CNI_CONTAINERID with a /', 4, command='DEL', env={'CNI_CONTAINERID': '../cid'}),
    Case('CNI_CONTAINERID with a space', 4, env={'CNI_CONTAINERID': 'c id'}),
    Case('CNI_CONTAINERID too long', 4, env={'CNI_CONTAINERID': 'c' * 129}),
    # CNI_IFNAME
    Case('CNI_IFNAME empty for ADD', 4, env={'CNI_IFNAME': ''}),
    Case('CNI_IFNAME empty for DEL', 4, command='DEL', env={'CNI_IFNAME': ''}, own=True),
    Case('CNI_IFNAME of 16 characters', 4, env={'CNI_IFNAME': 'eth0123456789abc'}),
    Case('CNI_IFNAME with a /', 4, env={'CNI_IFNAME': 'eth/0'}),
    Case('CNI_IFNAME with a :', 4, env={'CNI_IFNAME': 'eth:0'}),
    Case('CNI_IFNAME with a space', 4, env={'CNI_IFNAME': 'eth 0'}),
    Case('CNI_IFNAME ..', 4, command='DEL', env={'CNI_IFNAME': '..'}, own=True),
    # CNI_NETNS
    Case('CNI_NETNS empty for ADD', 4, env={'CNI_NETNS': ''}),
    Case('CNI_NETNS empty for CHECK', 4, command='CHECK', env={'CNI_NETNS': ''}, own=True),
    Case('CNI_NETNS relative', 4, env={'CNI_NETNS': 'run/netns/pod'}),
    Case('CNI_NETNS a regular file', 4, env={'CNI_NETNS': '{file}'}),
    Case('CNI_NETNS a directory', 4, env={'CNI_NETNS': '/run/netns'}),
    Case('CNI_NETNS a FIFO', 4, env={'CNI_NETNS': '{fifo}'}),
    Case('CNI_NETNS missing', 4, env={'CNI_NETNS': '/run/netns/kc-test-no-such-netns'}),
    Case('CNI_NETNS the daemon\'s own namespace', 4, env={'CNI_NETNS': '{host}'}),
    Case('CNI_NETNS the daemon\'s own namespace, CHECK', 4, command='CHECK',
         env={'CNI_NETNS': '{host}'}, own=True),
    Case('CNI_NETNS the daemon\'s own namespace, DEL', 4, command='DEL',
         env={'CNI_NETNS': '{host}'}, own=True),
    Case('CNI_NETNS a mount namespace', 4, env={'CNI_NETNS': '/proc/self/ns/mnt'}),
    Case('CNI_NETNS a mount namespace, CHECK', 4, command='CHECK',
         env={'CNI_NETNS': '/proc/self/ns/mnt'}, own=True),
    # CNI_ARGS
    Case('CNI_ARGS item without =', 4, env={'CNI_ARGS': 'IgnoreUnknown;K8S_POD_NAME={pod}'}),
    Case('CNI_ARGS empty item', 4, env={'CNI_ARGS': pod_args() + ';;A=b'}),
    Case('CNI_ARGS trailing ;', 4, env={'CNI_ARGS': pod_args() + ';'}),
    Case('CNI_ARGS value with =', 4, env={'CNI_ARGS': pod_args(A='b=c')}),
    Case('CNI_ARGS empty key', 4, env={'CNI_ARGS': '=x;' + pod_args()}),
    Case('CNI_ARGS malformed, DEL', 4, command='DEL', env={'CNI_ARGS': 'K8S_POD_NAME'},
         own=True),
    Case('ADD without K8S_POD_NAME', 4,
         env={'CNI_ARGS': 'IgnoreUnknown=1;K8S_POD_NAMESPACE=default'}),
    Case('ADD with an empty K8S_POD_NAME', 4, env={'CNI_ARGS': pod_args('')}),
    Case('K8S_POD_NAME invalid', 4, env={'CNI_ARGS': pod_args('Pod_X')}),
    Case('K8S_POD_NAMESPACE invalid', 4,
         env={'CNI_ARGS': 'K8S_POD_NAMESPACE=Bad_NS;K8S_POD_NAME={pod}'}),
    Case('K8S_POD_UID invalid', 4, env={'CNI_ARGS': pod_args(K8S_POD_UID='-uid')}),
    # stdin
    Case('stdin empty', 6, stdin=b''),
    Case('stdin blank', 6, stdin=b' \n'),
    Case('stdin cut short', 6, stdin=b'{"cniVersion": "1.1.0", "name": '),
    Case('stdin a JSON array', 6, stdin=b'[{"cniVersion": "1.1.0"}]'),
    Case('stdin a JSON string', 6, stdin=b'"1.1.0"'),
    Case('stdin not UTF-8', 6, stdin=b'{"cniVersion": "\xff\xfe"}'),
    Case('stdin two documents', 6, stdin=b'{"cniVersion": "1.1.0"} {}'),
    Case('stdin over 1 MiB', 4, config={'padding': 'x' * (1024 * 1024)}),
    # cniVersion
    Case('cniVersion unknown', 1, config={'cniVersion': '9.9.9'}),
    Case('cniVersion 0.2.0', 1, config={'cniVersion': '0.2.0'}),
    Case('cniVersion missing', 1, config={'cniVersion': DELETE}),
    Case('cniVersion a number', 1, config={'cniVersion': 1.1}),
    Case('cniVersion unknown, DEL', 1, command='DEL', config={'cniVersion': '2.0.0'},
         own=True),
    Case('CHECK on 0.3.1', 1, command='CHECK', config={'cniVersion': '0.3.1'}, own=True),
    Case('CHECK on 0.3.0', 1, command='CHECK', config={'cniVersion': '0.3.0'}, own=True),
    Case('GC on 1.0.0', 1, command='GC',
         config={'cniVersion': '1.0.0', 'cni.dev/valid-attachments': []}),
    Case('STATUS on 0.4.0', 1, command='STATUS', config={'cniVersion': '0.4.0'}),
    # the network configuration
    Case('timeout a string', 7, config={'timeout': 'soon'}),
    Case('timeout negative', 7, config={'timeout': -1}),
    Case('timeout a boolean', 7, config={'timeout': True}),
    Case('daemon_socket a number', 7, config={'daemon_socket': 5}),
    Case('daemon_socket relative', 7, config={'daemon_socket': 'daemon.sock'}),
    Case('state_dir relative', 7, command='DEL', config={'state_dir': 'state'}, own=True),
    Case('name missing', 7, config={'name': DELETE}),
    Case('name with a /', 7, command='DEL', config={'name': 'a/b'}, own=True),
    Case('name a number', 7, config={'name': 5}),
    Case('prevResult an array', 7, command='DEL', config={'prevResult': []}, own=True),
    Case('prevResult ips an object', 7, command='CHECK',
         config={'prevResult': {'cniVersion': '1.1.0', 'ips': {}}}, own=True),
    Case('GC valid-attachments an object', 7, command='GC',
         config={'cni.dev/valid-attachments': {}}),
    Case('GC valid-attachment without ifname', 7, command='GC',
         config={'cni.dev/valid-attachments': [{'containerID': 'cid-1'}]}),
    Case('GC attachments alias not a list', 7, command='GC',
         config={'cni.dev/attachments': 'all'}),
]


@pytest.fixture(scope='module')
def world(tmp_path_factory):
    if not conftest.CAN_RUN:
        pytest.skip(conftest.SKIP_REASON)
    yield from cni_world.start(tmp_path_factory)


@pytest.fixture(scope='module')
def live(world):
    """The attached pod every case aims at: ``(runtime, its sandbox, an intruder)``."""
    runtime = world.runtime('1.1.0')
    sandbox, _ = world.pod(runtime)
    outcome = runtime.add(sandbox)
    assert outcome.ok, outcome
    intruder = testruntime.Sandbox(
        'cid-intruder', world.host.pod_netns(), sandbox.pod_name, pod_uid=sandbox.pod_uid)
    yield runtime, sandbox, intruder
    world.clean()


@pytest.fixture(scope='module')
def places(world):
    """Paths that exist and are no network namespace."""
    regular = os.path.join(world.workdir, 'not-a-netns')
    with open(regular, 'w') as f:
        f.write('just a file\n')
    fifo = os.path.join(world.workdir, 'a-fifo')
    os.mkfifo(fifo)
    return {'file': regular, 'fifo': fifo, 'host': world.host.path}


def request(case, live, places):
    """``(sandbox, env, config)`` of ``case`` for the runtime's execute()."""
    runtime, own, intruder = live
    sandbox = own if case.own else intruder
    fill = dict(places, pod=sandbox.pod_name)
    if case.command in ('GC', 'STATUS'):
        sandbox = None          # sent without any sandbox, as a runtime does
    env = {key: value.format(**fill) for key, value in case.env.items()}
    config = dict(runtime.netconf)
    if case.command in ('CHECK', 'DEL') and case.own:
        config['prevResult'] = runtime._cache_read(own)
    for key, value in case.config.items():
        if value is DELETE:
            del config[key]
        else:
            config[key] = value
    return sandbox, env, config


@pytest.mark.parametrize('case', CASES, ids=str)
def test_bad_input_is_refused_and_changes_nothing(world, live, places, case):
    sandbox, env, config = request(case, live, places)
    before = world.snapshot()
    runtime = live[0]
    outcome = runtime.execute(case.command, sandbox, env=env, config=config, stdin=case.stdin)

    assert outcome.code == 1, outcome
    assert outcome.stderr == b'', outcome
    error = json.loads(outcome.stdout)     # exactly one JSON document
    assert set(error) == {'cniVersion', 'code', 'msg', 'details'}, error
    assert error['code'] == case.code, error
    assert isinstance(error['msg'], str) and error['msg'], error
    version = config.get('cniVersion') if case.stdin is None else None
    assert error['cniVersion'] == (version if version in VERSIONS else '1.1.0'), error
    assert world.snapshot() == before


def test_the_live_pod_survived_every_case(world, live):
    runtime, sandbox, _ = live
    assert runtime.check(sandbox).ok
    assert world.host.ping(sandbox.netns, testhost.GATEWAY)
