"""kuryr-kubernetes' kuryr.conf: its names for ours are read, the rest ignored with a reason.

The file is tests/fixtures/kuryr-kubernetes.conf, a kuryr.conf as
kuryr-kubernetes' DevStack plugin writes it (every group of the controller and
the CNI side); the daemon started with it is in
tests/functional/test_kuryr_kubernetes_conf.py.
"""

import logging
import socket

from kuryr_cni import conf as config
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
        '[cni_daemon] worker_num is read as [cni_daemon] worker_count',
        '[cni_health_server] port is read as [health] port',
        '[kubernetes] ssl_ca_crt_file is read as [kubernetes] ca_file',
        '[kubernetes] ssl_verify_server_crt is read as [kubernetes] verify_server_cert',
        '[prometheus_exporter] cni_exporter_port is read as [prometheus] port',
    ]


def test_a_later_file_of_ours_overrides_its_names(tmp_path):
    ours = tmp_path / 'kuryr-cni.conf'
    ours.write_text('[cni_daemon]\nworker_count = 5\n[health]\nport = 8095\n')
    conf, _ = _loaded(fixtures.kuryr_kubernetes_conf(tmp_path), ours)
    assert (conf.cni_daemon.worker_count, conf.health.port) == (5, 8095)


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
    path.write_text('[kubernetes]\napi_root = https://192.0.2.10:6443\n'
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
