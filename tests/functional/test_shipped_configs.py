"""The daemon started on configurations as they are shipped or found on nodes.

- kuryr-kubernetes' kuryr.conf (tests/fixtures/kuryr-kubernetes.conf, every
  group of the controller and the CNI side): its names for ours are honoured,
  the rest ignored with one line each;
- the DaemonSet's ConfigMap file, read out of etc/kubernetes/kuryr-cni-daemonset.yaml;
- etc/kuryr-cni.conf.sample.

Each runs beside a small file of the test's own with what must differ in a
throwaway namespace: where the socket, state and log go, and the API server
(the stand-in, inside the namespace). Nothing else is changed.
"""

import json
import os
import pathlib
import re
import time

import pytest
import yaml

from tests import fixtures
from tests import wait
from tests.functional import conftest
from tests.functional import helpers
from tools.testbed import host as testhost

pytestmark = pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON)

REPO = pathlib.Path(__file__).resolve().parents[2]
MANIFEST = REPO / 'etc' / 'kubernetes' / 'kuryr-cni-daemonset.yaml'
SAMPLE = REPO / 'etc' / 'kuryr-cni.conf.sample'
TOKEN = 'a-token'           # what tests/fixtures writes into the token file
RUN_FOR = 12                # seconds the daemon must keep running on kuryr.conf


@pytest.fixture
def node():
    with testhost.Host(prefix=conftest.SESSION_PREFIX) as host:
        host.start_api(token=TOKEN)
        yield host


def _log(node):
    return pathlib.Path(node.workdir, 'daemon.log').read_text()


def _titles(node):
    return sorted(t for t in node.processes().values() if t.startswith('kuryr-cni-daemon: '))


def _kuryr_conf(node, options=None, **values):
    """kuryr-kubernetes' kuryr.conf for this node (the stand-in's URL, our log, 8091, 9656)."""
    upstream_dir = pathlib.Path(node.workdir) / 'kuryr'
    upstream_dir.mkdir()
    filled = dict(API_ROOT=node.api.url, LOG_FILE=os.path.join(node.workdir, 'daemon.log'),
                  HEALTH_PORT='8091', METRICS_PORT='9656')
    filled.update(values)
    return fixtures.kuryr_kubernetes_conf(upstream_dir, options=options, **filled)


def _add_bridge(node, name):
    """A bridge of that name in the node: what [neutron_defaults] ovs_bridge = br-int asks for."""
    testhost.ip('-n', node.ns, 'link', 'add', name, 'type', 'bridge')


def test_runs_on_kuryr_kubernetes_conf_with_its_workers_and_ports(node):
    upstream = _kuryr_conf(node)
    _add_bridge(node, 'br-int')
    node.start_daemon(config_files=[helpers.node_config(node, api=False), str(upstream)],
                      env={'KUBERNETES_NODE_NAME': 'worker-3'})
    started = time.monotonic()          # READY=1: serving from here on
    pids = node.daemon_pids()
    assert _titles(node).count('kuryr-cni-daemon: cni-worker') == 3      # worker_num = 3

    # Upstream's ports, its token file and API root, upstream's node name.
    # The requests are there, by KUBERNETES_NODE_NAME, with the token:
    kuryrports = node.api.wait_for_request(
        lambda r: r.path.endswith('/kuryrports')
        and r.query.get('labelSelector') == 'kuryr.openstack.org/nodeName=worker-3', 10)
    assert kuryrports and kuryrports.headers['authorization'] == 'Bearer ' + TOKEN
    while time.monotonic() - started < RUN_FOR:
        assert node.http_get(8091, '/alive')[0] == 200
        assert node.http_get(9656, '/metrics')[0] == 200
        time.sleep(1)
    assert node.http_get(8091, '/ready')[0] == 200
    assert node.daemon.poll() is None and node.daemon_pids() == pids
    assert _titles(node).count('kuryr-cni-daemon: cni-worker') == 3
    status, text = node.http_get(9656, '/metrics')
    assert 'kuryr_cni_worker_restarts_total{service="cni-worker"} 0.0' in text

    log = _log(node)
    warnings = re.findall(r' WARNING kuryr_cni\.daemon\.main \[-\] (.*) is ignored: ', log)
    assert sorted(w.split(': ', 1)[1] for w in warnings) == fixtures.KURYR_KUBERNETES_CONF_IGNORED
    [controller] = re.findall(r" INFO kuryr_cni\.daemon\.main \[-\] Ignored as "
                              r"kuryr-controller's: (.*)", log)
    assert '; [health_server]; ' in controller and '[kubernetes] pod_project_driver, ' in controller
    assert 'for node worker-3 with 3 workers' in log
    assert 'secret-not-for-logs' not in log


def _configmap_file():
    with open(MANIFEST) as f:
        [configmap] = [d for d in yaml.safe_load_all(f) if d and d['kind'] == 'ConfigMap']
    return configmap['data']['kuryr-cni.conf']


@pytest.mark.parametrize('shipped', ['daemonset', 'sample'])
def test_runs_on_the_shipped_config(node, shipped):
    """Read as shipped: the ConfigMap's text out of the manifest, the sample in place."""
    if shipped == 'daemonset':
        path = os.path.join(node.workdir, 'kuryr-cni.conf')
        with open(path, 'w') as f:
            f.write(_configmap_file())
    else:
        path = str(SAMPLE)
    # Shipped first, ours after, as the entrypoint orders them: ours wins where both say.
    node.start_daemon(config_files=[path, helpers.node_config(node, token=TOKEN)],
                      env={'KUBERNETES_NODE_NAME': testhost.NODE})
    assert node.http_get(8090, '/ready')[0] == 200
    assert node.http_get(8090, '/alive', address='::1')[0] == 200
    assert helpers.scrape(node)
    # The kuryrport source, the default the shipped files keep.
    assert node.api.wait_for_request(lambda r: r.path.endswith('/kuryrports'), 10)
    assert _titles(node).count('kuryr-cni-daemon: cni-worker') == 4
    assert ' WARNING kuryr_cni' not in _log(node)


def test_ready_waits_for_the_bridge_its_ovs_bridge_names(node):
    """kuryr-daemon checked [neutron_defaults] ovs_bridge before each plug.

    Before, a missing br-int showed only as failing ADDs; now /ready names it,
    and READY=1 waits for it.
    """
    upstream = _kuryr_conf(node)
    node.start_daemon(config_files=[helpers.node_config(node, api=False), str(upstream)],
                      wait=False)
    status, body = wait.until(lambda: _probe(node, '/ready', 'bridge br-int missing'), 60,
                              '/ready naming br-int')
    assert status == 503 and json.loads(body)['bridges_missing'] == ['br-int']
    assert node.http_get(8091, '/alive')[0] == 200
    _add_bridge(node, 'br-int')
    node.wait_ready()                               # READY=1 follows the bridge
    assert node.http_get(8091, '/ready')[0] == 200
    testhost.ip('-n', node.ns, 'link', 'del', 'br-int')
    status, body = node.http_get(8091, '/ready')
    assert status == 503 and json.loads(body)['problems'] == ['bridge br-int missing']


def _probe(node, path, problem):
    """(status, body) of ``path`` once its problems name ``problem``, else None."""
    try:
        status, body = node.http_get(8091, path)
    except OSError:                                 # not listening yet
        return None
    return (status, body) if problem in json.loads(body).get('problems', []) else None


def test_an_https_api_root_without_token_file_is_refused_at_start(node):
    """kuryr-kubernetes read the service account's token then: here there is none."""
    upstream = _kuryr_conf(node, options={('kubernetes', 'token_file'): None},
                           API_ROOT=node.api.url.replace('http://', 'https://'))
    proc = node.start_daemon(config_files=[helpers.node_config(node, api=False),
                                           str(upstream)], wait=False)
    assert proc.wait(60) == 2
    stderr = pathlib.Path(node.workdir, 'daemon.stderr').read_text().splitlines()
    assert stderr == ['kuryr-cni-daemon: configuration error: %s: [kubernetes] api_root: is '
                      'set with neither token_file nor client_cert_file, and no service '
                      "account token /var/run/secrets/kubernetes.io/serviceaccount/token "
                      "(kuryr-kubernetes' default token_file): its requests would be "
                      'unauthenticated; set token_file (token_file = "" sends none)'
                      % upstream]
    assert not node.api.requests()
    assert not os.path.exists(node.socket)
