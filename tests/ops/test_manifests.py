"""etc/kubernetes/kuryr-cni-daemonset.yaml: schema-valid, and deployable as designed.

Every document is validated against the Kubernetes OpenAPI schemas bundled
in the PyPI package ``kubernetes-validate`` (no network, strict: unknown
fields fail), for the oldest and the newest Kubernetes version we claim. The
rest checks what a schema cannot: the privileges, probes, host mounts and
RBAC the daemon needs, and that the ConfigMap, the conflist, the entrypoint
and the daemon's options agree with each other.
"""

import configparser
import json
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / 'etc' / 'kubernetes' / 'kuryr-cni-daemonset.yaml'
PODMONITOR = REPO / 'etc' / 'kubernetes' / 'kuryr-cni-podmonitor.yaml'
ALERTS = REPO / 'etc' / 'prometheus' / 'kuryr-cni-alerts.yaml'
DASHBOARD = REPO / 'etc' / 'grafana' / 'kuryr-cni-dashboard.json'
ENTRYPOINT = REPO / 'tools' / 'container-entrypoint.sh'

OLDEST_KUBERNETES = '1.28.0'
SOCKET = '/run/kuryr-cni/daemon.sock'
STATE_DIR = '/var/lib/kuryr-cni'


def _documents():
    with open(MANIFEST) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


DOCS = _documents()


def _one(kind):
    found = [doc for doc in DOCS if doc['kind'] == kind]
    assert len(found) == 1, 'expected one %s, found %d' % (kind, len(found))
    return found[0]


@pytest.fixture(scope='module')
def daemonset():
    return _one('DaemonSet')


@pytest.fixture(scope='module')
def pod(daemonset):
    return daemonset['spec']['template']['spec']


@pytest.fixture(scope='module')
def container(pod):
    assert len(pod['containers']) == 1
    return pod['containers'][0]


@pytest.fixture(scope='module')
def mounts(pod, container):
    """mountPath -> (volumeMount, volume)."""
    volumes = {v['name']: v for v in pod['volumes']}
    return {m['mountPath']: (m, volumes[m['name']]) for m in container['volumeMounts']}


@pytest.fixture(scope='module')
def configmap():
    return _one('ConfigMap')


def _kubernetes_versions():
    kv = pytest.importorskip(
        'kubernetes_validate',
        reason='kubernetes-validate is not installed (pip install -r test-requirements.txt)')
    return [OLDEST_KUBERNETES, kv.latest_version()]


@pytest.mark.parametrize('index', range(len(DOCS)),
                         ids=['%s/%s' % (d['kind'], d['metadata']['name']) for d in DOCS])
def test_document_is_valid_for_kubernetes(index):
    import kubernetes_validate
    for version in _kubernetes_versions():
        try:
            kubernetes_validate.validate(DOCS[index], version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail('%s against Kubernetes %s: %s at %s' % (
                DOCS[index]['kind'], version, e.caught.message, list(e.caught.path)))


def test_schema_validation_catches_mistakes():
    """Guard against a validator that accepts anything."""
    import copy
    kubernetes_validate = pytest.importorskip('kubernetes_validate')
    broken = copy.deepcopy(_one('DaemonSet'))
    broken['spec']['template']['spec']['hostNetwrok'] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, OLDEST_KUBERNETES, strict=True)
    broken = copy.deepcopy(_one('DaemonSet'))
    broken['spec']['template']['spec']['containers'][0]['livenessProbe']['httpGet'][
        'port'] = [8090]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, OLDEST_KUBERNETES, strict=True)


def test_the_manifest_holds_what_the_daemonset_needs():
    kinds = sorted(doc['kind'] for doc in DOCS)
    assert kinds == ['ClusterRole', 'ClusterRoleBinding', 'ConfigMap', 'DaemonSet',
                     'ServiceAccount']
    for doc in DOCS:
        if doc['kind'] not in ('ClusterRole', 'ClusterRoleBinding'):
            assert doc['metadata']['namespace'] == 'kube-system', doc['kind']


def test_pod_runs_on_every_node_in_the_host_namespaces(pod):
    assert pod['hostNetwork'] is True
    assert pod['hostPID'] is True
    assert pod['priorityClassName'] == 'system-node-critical'
    # Tolerate every taint: one toleration with operator Exists and no key.
    assert {'operator': 'Exists'} in pod['tolerations']
    assert pod['dnsPolicy'] == 'Default'
    # Outlasts the daemon's graceful shutdown (request deadline + 10 s).
    from kuryr_cni import conf as kuryr_conf
    cni_daemon = dict(kuryr_conf.list_opts())['cni_daemon']
    request_timeout = next(o.default for o in cni_daemon if o.name == 'request_timeout')
    assert pod['terminationGracePeriodSeconds'] > request_timeout + 10


def test_container_is_privileged_and_named_by_the_downward_api(container):
    assert container['securityContext']['privileged'] is True
    env = {e['name']: e for e in container['env']}
    assert env['NODE_NAME']['valueFrom']['fieldRef']['fieldPath'] == 'spec.nodeName'


def test_probes_use_the_health_endpoints(container):
    def http_get(probe):
        return container[probe]['httpGet']['path'], container[probe]['httpGet']['port']

    assert http_get('livenessProbe') == ('/alive', 8090)
    assert http_get('readinessProbe') == ('/ready', 8090)
    assert http_get('startupProbe') == ('/alive', 8090)
    ports = {p['name']: p['containerPort'] for p in container['ports']}
    assert ports == {'health': 8090, 'metrics': 9655}


def test_resources_are_bounded(container):
    resources = container['resources']
    assert {'cpu', 'memory'} <= set(resources['requests'])
    assert 'memory' in resources['limits']


def _host_path(volume):
    return volume['hostPath']['path']


def test_network_namespaces_are_visible_as_the_runtime_creates_them(mounts):
    mount, volume = mounts['/run/netns']
    assert _host_path(volume) == '/run/netns'
    assert mount['mountPropagation'] == 'HostToContainer'
    # No second mount stacked onto the same directory through /var/run.
    assert '/var/run/netns' not in mounts
    assert '/proc' not in mounts


@pytest.mark.parametrize('path', [str(Path(SOCKET).parent), STATE_DIR, '/run/openvswitch'])
def test_paths_shared_with_the_node_keep_their_names(mounts, path):
    """The shim on the node uses the same paths as the daemon in the pod."""
    mount, volume = mounts[path]
    assert _host_path(volume) == path
    assert not mount.get('readOnly', False)


def _entrypoint_default(name):
    match = re.search(r'^%s=\$\{%s:-([^}]+)\}$' % (name, name), ENTRYPOINT.read_text(), re.M)
    assert match, '%s has no default in %s' % (name, ENTRYPOINT)
    return match.group(1)


@pytest.mark.parametrize('variable, host_path', [('CNI_BIN_DIR', '/opt/cni/bin'),
                                                 ('CNI_CONF_DIR', '/etc/cni/net.d')])
def test_cni_directories_are_mounted_where_the_entrypoint_looks(mounts, variable, host_path):
    mount, volume = mounts[_entrypoint_default(variable)]
    assert _host_path(volume) == host_path
    assert not mount.get('readOnly', False)


def test_configmap_is_mounted_where_the_entrypoint_reads_it(mounts, configmap):
    config = Path(_entrypoint_default('KURYR_CNI_CONFIG'))
    conflist = Path(_entrypoint_default('KURYR_CNI_CONFLIST'))
    assert config.parent == conflist.parent
    mount, volume = mounts[str(config.parent)]
    assert volume['configMap']['name'] == configmap['metadata']['name']
    assert mount['readOnly'] is True
    assert {config.name, conflist.name} <= set(configmap['data'])


def test_rbac_grants_exactly_what_the_daemon_uses(pod):
    account = _one('ServiceAccount')
    role = _one('ClusterRole')
    binding = _one('ClusterRoleBinding')
    assert pod['serviceAccountName'] == account['metadata']['name']
    assert binding['roleRef'] == {'apiGroup': 'rbac.authorization.k8s.io',
                                  'kind': 'ClusterRole', 'name': role['metadata']['name']}
    assert binding['subjects'] == [{'kind': 'ServiceAccount',
                                    'name': account['metadata']['name'],
                                    'namespace': account['metadata']['namespace']}]

    granted = set()
    for rule in role['rules']:
        for group in rule['apiGroups']:
            for resource in rule['resources']:
                for verb in rule['verbs']:
                    granted.add((group, resource, verb))
    # Each one is needed, on a real kube-apiserver: tests/k8s/test_rbac.py.
    expected = {(g, r, v) for g, r, verbs in [
        ('', 'pods', ('list', 'watch')),
        ('openstack.org', 'kuryrports', ('list', 'watch')),
        ('', 'events', ('create',)),
    ] for v in verbs}
    assert granted == expected


def _config(configmap):
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(configmap['data']['kuryr-cni.conf'])
    return parser


def test_configmap_conflist_is_the_kuryr_network(configmap):
    conflist = json.loads(configmap['data']['10-kuryr.conflist'])
    assert conflist == {
        'cniVersion': '1.0.0',
        'cniVersions': ['1.0.0', '1.1.0'],
        'name': 'kuryr',
        'plugins': [{'type': 'kuryr-cni', 'daemon_socket': SOCKET, 'timeout': 110,
                     'state_dir': STATE_DIR}],
    }


def test_configmap_config_agrees_with_the_conflist(configmap):
    config = _config(configmap)
    plugin = json.loads(configmap['data']['10-kuryr.conflist'])['plugins'][0]
    assert config['cni_daemon']['socket'] == plugin['daemon_socket']
    assert config['cni_daemon']['state_dir'] == plugin['state_dir']
    # Shared by all nodes: the node name must come from NODE_NAME.
    assert 'node_name' not in config['cni_daemon']
    assert config['health']['port'] == '8090'
    assert config['prometheus']['port'] == '9655'


def test_configmap_config_sets_only_daemon_options(configmap, tmp_path):
    from kuryr_cni import conf as kuryr_conf
    path = tmp_path / 'kuryr-cni.conf'
    path.write_text(configmap['data']['kuryr-cni.conf'])
    conf = kuryr_conf.load(['--config-file', str(path)])

    known = {group: {opt.name for opt in opts} for group, opts in kuryr_conf.list_opts()}
    written = _config(configmap)
    for section in written.sections():
        for option in written.options(section):
            if option not in written.defaults():
                assert option in known.get(section, ()), '[%s] %s' % (section, option)
    assert conf.cni_daemon.vif_source == 'kuryrport'
    assert conf.health.host == conf.prometheus.host == '::'
    assert conf.kubernetes.api_root is None and conf.kubernetes.kubeconfig is None


# --- the PodMonitor (Prometheus Operator) ---------------------------------------------

# PodMonitor fields (monitoring.coreos.com/v1) used here: the Operator's CRDs
# are not available offline, so unknown fields are caught by this list.
PODMONITOR_SPEC = {'jobLabel', 'namespaceSelector', 'selector', 'podMetricsEndpoints',
                   'podTargetLabels', 'sampleLimit'}
ENDPOINT_FIELDS = {'port', 'path', 'interval', 'scrapeTimeout', 'scheme', 'relabelings',
                   'metricRelabelings', 'honorLabels'}


@pytest.fixture(scope='module')
def podmonitor():
    with open(PODMONITOR) as f:
        [doc] = [d for d in yaml.safe_load_all(f) if d is not None]
    return doc


def test_podmonitor_is_a_podmonitor_beside_the_daemonset(podmonitor, daemonset):
    assert (podmonitor['apiVersion'], podmonitor['kind']) == ('monitoring.coreos.com/v1',
                                                              'PodMonitor')
    assert set(podmonitor['spec']) <= PODMONITOR_SPEC
    namespace = daemonset['metadata']['namespace']
    assert podmonitor['metadata']['namespace'] == namespace
    assert podmonitor['spec']['namespaceSelector'] == {'matchNames': [namespace]}


def test_podmonitor_selects_the_pods_and_their_metrics_port(podmonitor, daemonset, container):
    pod_labels = daemonset['spec']['template']['metadata']['labels']
    for key, value in podmonitor['spec']['selector']['matchLabels'].items():
        assert pod_labels[key] == value, key
    [endpoint] = podmonitor['spec']['podMetricsEndpoints']
    assert set(endpoint) <= ENDPOINT_FIELDS
    ports = {p['name']: p['containerPort'] for p in container['ports']}
    assert endpoint['port'] in ports and ports[endpoint['port']] == 9655
    assert endpoint['path'] == '/metrics'


def test_podmonitor_job_is_the_one_alerts_and_dashboard_expect(podmonitor, daemonset):
    """The Operator names the job after the value of the pods' jobLabel label."""
    pod_labels = daemonset['spec']['template']['metadata']['labels']
    job = pod_labels[podmonitor['spec']['jobLabel']]
    assert job == 'kuryr-cni'
    with open(ALERTS) as f:
        exprs = [rule['expr'] for group in yaml.safe_load(f)['groups']
                 for rule in group['rules']]
    assert all('job="%s"' % job in expr for expr in exprs)
    with open(DASHBOARD) as f:
        variables = {v['name']: v for v in json.load(f)['templating']['list']}
    assert variables['job']['current']['value'] == job
