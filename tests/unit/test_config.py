"""The configuration: the sample file is the generator's output, options load."""

import os
import subprocess
import sys

import pytest

from kuryr_cni import conf as config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GENERATOR_CONF = os.path.join(REPO, 'etc', 'oslo-config-generator', 'kuryr-cni.conf')
SAMPLE = os.path.join(REPO, 'etc', 'kuryr-cni.conf.sample')


def test_sample_config_is_up_to_date(tmp_path):
    out = tmp_path / 'sample.conf'
    generator = os.path.join(os.path.dirname(sys.executable), 'oslo-config-generator')
    subprocess.run([generator, '--config-file', GENERATOR_CONF, '--output-file', str(out)],
                   check=True, cwd=REPO, timeout=60)
    with open(SAMPLE) as f:
        committed = f.read()
    assert out.read_text() == committed, 'run "tox -e genconfig" and commit the result'


def test_defaults_match_the_contract(tmp_path):
    conf = config.load([])
    assert conf.cni_daemon.socket == '/run/kuryr-cni/daemon.sock'
    assert conf.cni_daemon.state_dir == '/var/lib/kuryr-cni'
    assert 'bind_address' not in conf.cni_daemon        # no TCP listener (issue 13 item 1)
    assert conf.cni_daemon.vif_source == 'kuryrport'    # what kuryr-controller writes
    assert conf.binding.ovsdb_connection == 'unix:/run/openvswitch/db.sock'
    assert (conf.health.host, conf.health.port) == ('::', 8090)
    assert (conf.prometheus.host, conf.prometheus.port) == ('::', 9655)
    assert conf.kubernetes.verify_server_cert is True


def test_a_config_file_overrides_and_bad_values_are_refused(tmp_path):
    path = tmp_path / 'k.conf'
    path.write_text('[cni_daemon]\nworker_count = 2\nvif_source = annotation\n')
    conf = config.load(['--config-file', str(path)])
    assert conf.cni_daemon.worker_count == 2
    assert conf.cni_daemon.vif_source == 'annotation'
    path.write_text('[cni_daemon]\nvif_source = somewhere\n')
    conf = config.load(['--config-file', str(path)])
    try:
        conf.cni_daemon.vif_source
    except ValueError as exc:
        assert 'somewhere' in str(exc)
    else:
        raise AssertionError('an invalid vif_source was accepted')


# --- eager validation -----------------------------------------------------------

def _validated(path):
    conf = config.load(['--config-file', str(path)])
    config.validate(conf)
    return conf


@pytest.mark.parametrize('text, line', [
    ('[cni_damon]\nworker_count = 2\n',
     '[cni_damon]: unknown group (did you mean cni_daemon?)'),
    ('[cni_daemon]\nwroker_count = 2\n',
     '[cni_daemon] wroker_count: unknown option (did you mean worker_count?)'),
    # oslo.config reads option names exactly: a dashed one would be ignored.
    ('[cni_daemon]\nnode-name = n1\n',
     '[cni_daemon] node-name: unknown option (did you mean node_name?)'),
    ('[DEFAULT]\ndebgu = true\n', '[DEFAULT] debgu: unknown option (did you mean debug?)'),
    ('[cni_daemon]\nworker_count = 0\n',
     '[cni_daemon] worker_count: Should be greater than or equal to 1'),
    ('[cni_daemon]\nworker_count = many\n', '[cni_daemon] worker_count: '),
    ('[cni_daemon]\nvif_source = somewhere\n',
     "[cni_daemon] vif_source: Valid values are [kuryrport, annotation], but found 'somewhere'"),
    ('[health]\nport = 99999\n', '[health] port: Should be less than or equal to 65535'),
    ('[DEFAULT]\ndebug = perhaps\n', '[DEFAULT] debug: Invalid Boolean value: perhaps'),
    ('[cni_daemon]\nsocket = run/daemon.sock\n',
     "[cni_daemon] socket: 'run/daemon.sock' must be an absolute path"),
    ('[kubernetes]\nkubeconfig = /nonexistent/kubeconfig\n',
     "[kubernetes] kubeconfig: '/nonexistent/kubeconfig' no such file"),
    # kuryr-kubernetes' names are known; typos of them, in our groups or in the groups
    # our deprecated names come from, still end the start.
    ('[cni_daemon]\nworker_nmu = 3\n',
     '[cni_daemon] worker_nmu: unknown option (did you mean worker_num?)'),
    ('[kubernetes]\nssl_ca_crt_fiel = /x\n',
     '[kubernetes] ssl_ca_crt_fiel: unknown option (did you mean ssl_ca_crt_file?)'),
    ('[cni_health_server]\nprot = 8090\n',
     '[cni_health_server] prot: unknown option (did you mean port?)'),
    ('[prometheus_exporter]\ncni_exporter_prot = 1\n',
     '[prometheus_exporter] cni_exporter_prot: unknown option (did you mean '
     'cni_exporter_port?)'),
    ('[neutron_defualts]\nproject = x\n', '[neutron_defualts]: unknown group'),
    ('[cni_daemon]\nworker_num = 0\n', '[cni_daemon] worker_num (read as [cni_daemon] '
     'worker_count): Should be greater than or equal to 1'),
])
def test_every_problem_is_one_line_naming_file_option_and_problem(tmp_path, text, line):
    path = tmp_path / 'kuryr-cni.conf'
    path.write_text(text)
    with pytest.raises(config.ConfigError) as info:
        _validated(path)
    message = str(info.value)
    assert message.startswith('%s: %s' % (path, line)), message
    assert '\n' not in message and 'LocationInfo' not in message


def test_a_missing_or_unparsable_file_is_a_config_error(tmp_path):
    with pytest.raises(config.ConfigError, match='no such file'):
        config.load(['--config-file', str(tmp_path / 'missing.conf')])
    path = tmp_path / 'broken.conf'
    path.write_text('[cni_daemon\nworker_count = 2\n')
    with pytest.raises(config.ConfigError, match='Invalid section'):
        config.load(['--config-file', str(path)])


def test_the_second_file_and_a_config_dir_are_checked_too(tmp_path):
    good = tmp_path / 'a.conf'
    good.write_text('[cni_daemon]\nworker_count = 2\n')
    bad = tmp_path / 'b.conf'
    bad.write_text('[promethues]\nport = 1\n')
    with pytest.raises(config.ConfigError, match='b.conf: .promethues.: unknown group'):
        _validated_many(['--config-file', str(good), '--config-file', str(bad)])
    confd = tmp_path / 'conf.d'
    confd.mkdir()
    (confd / '10-x.conf').write_text('[health]\nprot = 1\n')
    with pytest.raises(config.ConfigError, match=r'10-x.conf: \[health\] prot'):
        _validated_many(['--config-file', str(good), '--config-dir', str(confd)])


def _validated_many(argv):
    config.validate(config.load(argv))


def test_a_valid_file_and_the_sample_pass(tmp_path):
    path = tmp_path / 'kuryr-cni.conf'
    path.write_text('[DEFAULT]\ndebug = true\n[cni_daemon]\nnode_name = node-1\n'
                    'worker_count = 2\n[health]\nport = 8091\n')
    conf = _validated(path)
    assert (conf.debug, conf.cni_daemon.node_name, conf.health.port) == (True, 'node-1', 8091)
    _validated(SAMPLE)


def test_the_daemon_refuses_a_bad_config_before_touching_anything(tmp_path):
    run_dir, state_dir = tmp_path / 'run', tmp_path / 'state'
    path = tmp_path / 'kuryr-cni.conf'
    path.write_text('[cni_daemon]\nsocket = %s/daemon.sock\nstate_dir = %s\n'
                    '[cni_damon]\nworker_count = 2\n' % (run_dir, state_dir))
    daemon = os.path.join(os.path.dirname(sys.executable), 'kuryr-cni-daemon')
    proc = subprocess.run([daemon, '--config-file', str(path)], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2
    assert proc.stdout == ''
    assert proc.stderr == ('kuryr-cni-daemon: configuration error: %s: [cni_damon]: unknown '
                           'group (did you mean cni_daemon?)\n' % path)
    assert not run_dir.exists() and not state_dir.exists()


def test_the_daemon_answers_version_from_the_one_version(capsys):
    from kuryr_cni import version
    from kuryr_cni.daemon import main
    with pytest.raises(SystemExit) as info:
        main.main(['--version'])
    assert info.value.code == 0
    assert capsys.readouterr().out == 'kuryr-cni-daemon %s\n' % version.VERSION
