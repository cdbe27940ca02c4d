"""kuryr-kubernetes' kuryr.conf: its names for ours are read, the rest ignored with a reason.

The file is tests/fixtures/kuryr-kubernetes.conf, a kuryr.conf as
kuryr-kubernetes' DevStack plugin writes it (every group of the controller and
the CNI side); the daemon started with it is in
tests/functional/test_kuryr_kubernetes_conf.py.
"""

import http.server
import logging
import socket
import threading

import pytest
from kubernetes import client

from kuryr_cni import apiclient
from kuryr_cni import conf as config
from kuryr_cni.daemon import worker
from tests import api_versions
from tests import fixtures


def _loaded(*paths):
    conf = config.load([arg for path in paths for arg in ('--config-file', str(path))])
    return conf, config.validate(conf)


def test_its_names_for_ours_are_read(tmp_path):
    path = fixtures.kuryr_kubernetes_conf(tmp_path)
    conf, _ = _loaded(path)
    assert conf.cni_daemon.worker_count == 3                      # worker_num
    assert conf.cni_daemon.vif_timeout == 45                      # vif_annotation_timeout
    assert conf.health.port == 8091                               # [cni_health_server] port
    assert conf.prometheus.port == 9656         # [prometheus_exporter] cni_exporter_port
    assert conf.kubernetes.api_root == 'https://192.0.2.10:6443'
    assert conf.kubernetes.token_file == str(tmp_path / 'token')
    assert conf.kubernetes.ca_file == str(tmp_path / 'ca.crt')    # ssl_ca_crt_file
    assert conf.kubernetes.verify_server_cert is True             # ssl_verify_server_crt
    assert conf.binding.link_iface == ''                          # "unset", upstream's way
    assert conf.binding.required_bridges == ['br-int']      # [neutron_defaults] ovs_bridge
    assert conf.binding.network_device_mtu == 1442          # [neutron_defaults], the same name
    assert conf.cni_daemon.vif_source == 'kuryrport'


def test_what_it_holds_for_others_is_ignored_once_each_saying_why(tmp_path):
    path = fixtures.kuryr_kubernetes_conf(tmp_path)
    _, notes = _loaded(path)
    warnings = [n.message for n in notes if n.level == logging.WARNING]
    ignored = sorted(m.split(': ', 1)[1].split(' is ignored: ')[0] for m in warnings)
    assert ignored == fixtures.KURYR_KUBERNETES_CONF_IGNORED
    assert all(m.startswith(str(path) + ': ') and m.split(' is ignored: ')[1]
               for m in warnings)
    assert ('%s: [cni_daemon] bind_address is ignored: the shim reaches the daemon over the '
            'unix socket [cni_daemon] socket, never TCP' % path) in warnings

    [controller] = [n.message for n in notes if n.message.startswith('Ignored as kuryr-controller')]
    assert [n.level for n in notes if n.message == controller] == [logging.INFO]
    for group in ('[neutron]', '[neutron_defaults]', '[vif_pool]', '[pod_vif_nested]',
                  '[octavia_defaults]', '[health_server]', '[cache_defaults]'):
        assert group + ';' in controller + ';'
    assert '[kubernetes] pod_project_driver, ' in controller
    assert '[prometheus_exporter] controller_exporter_port' in controller
    # Nothing of what the ignored groups hold is repeated, secrets least of all.
    assert all('secret-not-for-logs' not in n.message for n in notes)

    renamed = sorted(n.message.split(': ', 1)[1] for n in notes
                     if n.level == logging.INFO and n.message != controller)
    assert renamed == [
        '[cni_daemon] vif_annotation_timeout is read as [cni_daemon] vif_timeout',
        "[cni_daemon] worker_num = 3, kuryr-daemon's most processes forked at once (one per "
        'request), is read as 3 resident CNI workers serving up to 32 requests at once each '
        '([cni_daemon] worker_count, at most 4 from worker_num)',
        '[cni_health_server] port is read as [health] port',
        '[kubernetes] ssl_ca_crt_file is read as [kubernetes] ca_file',
        '[kubernetes] ssl_verify_server_crt is read as [kubernetes] verify_server_cert',
        '[neutron_defaults] network_device_mtu is read as [binding] network_device_mtu',
        '[neutron_defaults] ovs_bridge is read as [binding] required_bridges',
        '[prometheus_exporter] cni_exporter_port is read as [prometheus] port',
    ]


def test_a_later_file_of_ours_overrides_its_names(tmp_path):
    ours = tmp_path / 'kuryr-cni.conf'
    ours.write_text('[cni_daemon]\nworker_count = 5\n[health]\nport = 8095\n')
    conf, _ = _loaded(fixtures.kuryr_kubernetes_conf(tmp_path), ours)
    assert (conf.cni_daemon.worker_count, conf.health.port) == (5, 8095)


def test_a_nested_node_does_not_require_the_ovs_bridge(tmp_path):
    # kuryr-daemon checked [neutron_defaults] ovs_bridge in its Open vSwitch driver
    # alone; a nested node (its pods on VLANs of link_iface) has no br-int.
    path = fixtures.kuryr_kubernetes_conf(tmp_path)
    path.write_text(path.read_text().replace('\nlink_iface =\n', '\nlink_iface = eth0\n'))
    conf, notes = _loaded(path)
    assert conf.binding.required_bridges == []
    assert config.Note(logging.INFO, '%s: [neutron_defaults] ovs_bridge is not required on '
                       'this nested node ([binding] link_iface = eth0): kuryr-daemon checked '
                       'it only for Open vSwitch VIFs' % path) in notes


def test_old_daemon_options_of_any_release_are_named(tmp_path):
    path = tmp_path / 'kuryr.conf'
    path.write_text('[cni_daemon]\ndaemon_enabled = True\n')
    _, notes = _loaded(path)
    assert notes == [config.Note(logging.WARNING, '%s: [cni_daemon] daemon_enabled is '
                                 'ignored: kuryr-cni is always a daemon' % path)]


def test_empty_strings_mean_unset_as_upstream_writes_them(tmp_path):
    path = tmp_path / 'kuryr.conf'
    path.write_text('[kubernetes]\napi_root = ""\ntoken_file = ""\nssl_ca_crt_file = ""\n')
    conf, _ = _loaded(path)
    assert (conf.kubernetes.api_root, conf.kubernetes.token_file) == ('', '')


def test_unverified_api_server_is_warned_about(tmp_path):
    path = tmp_path / 'kuryr.conf'
    path.write_text('[kubernetes]\napi_root = https://192.0.2.10:6443\ntoken_file = ""\n'
                    'ssl_verify_server_crt = False\n')
    conf, notes = _loaded(path)
    assert conf.kubernetes.verify_server_cert is False
    assert config.Note(logging.WARNING, "The API server's certificate is not verified "
                       "([kubernetes] verify_server_cert is false)") in notes


def test_kubernetes_node_name_names_the_node_unless_the_file_does(tmp_path, monkeypatch):
    monkeypatch.setenv('KUBERNETES_NODE_NAME', 'worker-7')
    assert config.load([]).cni_daemon.node_name == 'worker-7'
    path = tmp_path / 'kuryr-cni.conf'
    path.write_text('[cni_daemon]\nnode_name = node-1\n')
    assert config.load(['--config-file', str(path)]).cni_daemon.node_name == 'node-1'
    monkeypatch.delenv('KUBERNETES_NODE_NAME')
    assert config.load([]).cni_daemon.node_name == socket.gethostname().lower()


@pytest.fixture
def service_account(tmp_path, monkeypatch):
    """kuryr-kubernetes' default token and CA directory, empty: the test fills it."""
    directory = tmp_path / 'serviceaccount'
    directory.mkdir()
    monkeypatch.setattr(config, 'SERVICE_ACCOUNT_DIR', str(directory))
    return directory


@pytest.fixture
def recording_api():
    """A plain-HTTP API stand-in; yields (url, the Authorization headers it received)."""
    seen = []
    server = http.server.ThreadingHTTPServer(
        ('127.0.0.1', 0), type('Handler', (api_versions.APIVersions,), {'seen': seen}))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield 'http://127.0.0.1:%d' % server.server_port, seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_without_token_file_the_service_account_token_is_sent_as_upstream_did(
        tmp_path, service_account, recording_api):
    """Before: an api_root without token_file sent requests with no credentials."""
    url, seen = recording_api
    (service_account / 'token').write_text('service-account-token\n')
    path = fixtures.kuryr_kubernetes_conf(tmp_path, API_ROOT=url,
                                          options={('kubernetes', 'token_file'): None})
    conf, notes = _loaded(path)
    assert conf.kubernetes.token_file is None
    assert config.Note(logging.INFO, "[kubernetes] token_file is not set: requests to %s carry "
                       "the service account's token %s/token, as kuryr-kubernetes' did"
                       % (url, service_account)) in notes
    assert client.CoreApi(apiclient.from_options(conf.kubernetes)).get_api_versions(
        _request_timeout=10).versions == ['v1']
    assert seen == ['Bearer service-account-token']


def test_an_https_api_root_without_any_credential_is_refused(tmp_path, service_account):
    path = fixtures.kuryr_kubernetes_conf(tmp_path, options={('kubernetes', 'token_file'): None})
    with pytest.raises(config.ConfigError) as refusal:
        _loaded(path)
    assert str(refusal.value) == (
        '%s: [kubernetes] api_root: is set with neither token_file nor client_cert_file, and '
        "no service account token %s/token (kuryr-kubernetes' default token_file): its "
        'requests would be unauthenticated; set token_file (token_file = "" sends none)'
        % (path, service_account))


def test_a_plain_http_api_root_without_credentials_is_warned_about(
        tmp_path, service_account, recording_api):
    url, seen = recording_api
    path = fixtures.kuryr_kubernetes_conf(tmp_path, API_ROOT=url,
                                          options={('kubernetes', 'token_file'): None})
    conf, notes = _loaded(path)
    [warning] = [n.message for n in notes if n.message.startswith('Requests to')]
    assert warning.startswith('Requests to %s carry no credentials: neither token_file' % url)
    assert warning.endswith('(plain HTTP: a proxy must add them)')
    client.CoreApi(apiclient.from_options(conf.kubernetes)).get_api_versions(_request_timeout=10)
    assert seen == [None]


def test_token_file_empty_sends_none_knowingly(tmp_path, service_account):
    (service_account / 'token').write_text('service-account-token\n')
    path = fixtures.kuryr_kubernetes_conf(tmp_path, options={('kubernetes', 'token_file'): '""'})
    conf, notes = _loaded(path)
    assert config.api_credentials(conf.kubernetes)[0] is None
    assert ('Requests to https://192.0.2.10:6443 carry no credentials: no token_file (it is '
            'empty)') in [n.message for n in notes]


def test_without_ssl_ca_crt_file_the_service_account_ca_verifies_as_upstream(
        tmp_path, service_account):
    (service_account / 'ca.crt').write_text('')
    path = fixtures.kuryr_kubernetes_conf(tmp_path,
                                          options={('kubernetes', 'ssl_ca_crt_file'): None})
    conf, notes = _loaded(path)
    assert config.api_credentials(conf.kubernetes) == (
        str(tmp_path / 'token'), str(service_account / 'ca.crt'))
    assert config.Note(logging.INFO, "The API server's certificate is verified against the "
                       "service account's CA %s/ca.crt, as kuryr-kubernetes' default "
                       "ssl_ca_crt_file" % service_account) in notes
    (service_account / 'ca.crt').unlink()
    conf, notes = _loaded(path)
    assert config.api_credentials(conf.kubernetes)[1] is None
    assert any("against the system's CA certificates" in n.message for n in notes)


@pytest.mark.parametrize('worker_num, workers, level', [
    ('30', 4, logging.WARNING),        # upstream's default: not thirty resident processes
    ('4', 4, logging.INFO), ('1', 1, logging.INFO)])
def test_worker_num_is_read_as_at_most_four_resident_workers(tmp_path, worker_num, workers,
                                                             level):
    path = fixtures.kuryr_kubernetes_conf(
        tmp_path, options={('cni_daemon', 'worker_num'): worker_num})
    conf, notes = _loaded(path)
    assert conf.cni_daemon.worker_count == workers
    [note] = [n for n in notes if '[cni_daemon] worker_num' in n.message]
    assert note.level == level
    assert note.message == (
        "%s: [cni_daemon] worker_num = %s, kuryr-daemon's most processes forked at once (one "
        'per request), is read as %d resident CNI workers serving up to 32 requests at once '
        'each ([cni_daemon] worker_count, at most 4 from worker_num)'
        % (path, worker_num, workers))


def test_worker_count_under_our_name_is_taken_as_it_is(tmp_path):
    ours = tmp_path / 'kuryr-cni.conf'
    ours.write_text('[cni_daemon]\nworker_count = 8\n')
    upstream = fixtures.kuryr_kubernetes_conf(tmp_path,
                                              options={('cni_daemon', 'worker_num'): '30'})
    conf, notes = _loaded(upstream, ours)
    assert conf.cni_daemon.worker_count == 8
    assert not [n for n in notes if 'worker_num' in n.message]


def test_worker_count_beside_worker_num_in_one_file_wins_whatever_the_order(tmp_path):
    for lines in (('worker_count = 8', 'worker_num = 30'), ('worker_num = 30', 'worker_count = 8')):
        path = tmp_path / 'kuryr.conf'
        path.write_text('[cni_daemon]\n%s\n' % '\n'.join(lines))
        conf, notes = _loaded(path)
        assert conf.cni_daemon.worker_count == 8
        assert not [n for n in notes if 'worker_num =' in n.message]


def test_a_vif_annotation_timeout_past_the_request_timeout_is_warned_about(tmp_path):
    """OpenShift's 200 s: the request's own deadline (100 s) ends the ADD first."""
    path = fixtures.kuryr_kubernetes_conf(
        tmp_path, options={('cni_daemon', 'vif_annotation_timeout'): '200'})
    conf, notes = _loaded(path)
    assert conf.cni_daemon.vif_timeout == 200
    assert config.Note(logging.WARNING, '%s: [cni_daemon] vif_annotation_timeout = 200 is not '
                       'shorter than [cni_daemon] request_timeout (100 s): an ADD whose VIFs '
                       'are late fails after request_timeout, and kubelet retries it'
                       % path) in notes
    _, notes = _loaded(fixtures.kuryr_kubernetes_conf(tmp_path))
    assert not [n for n in notes if 'is not shorter than' in n.message]


@pytest.mark.parametrize('use_events, posted', [(None, True), ('True', True), ('False', False)])
def test_use_events_false_means_no_events(tmp_path, use_events, posted):
    path = fixtures.kuryr_kubernetes_conf(tmp_path,
                                          options={('kubernetes', 'use_events'): use_events})
    conf, notes = _loaded(path)
    assert (worker.build_event_poster(conf) is not None) is posted
    assert not [n for n in notes if '] use_events' in n.message]


def test_ssl_verify_server_crt_unset_verifies_here(tmp_path):
    """kuryr-kubernetes' default was false (no verification); kuryr-cni's is true."""
    path = fixtures.kuryr_kubernetes_conf(
        tmp_path, options={('kubernetes', 'ssl_verify_server_crt'): None})
    conf, notes = _loaded(path)
    assert conf.kubernetes.verify_server_cert is True
    assert not [n for n in notes if 'not verified' in n.message]
