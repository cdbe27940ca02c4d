"""The configuration: the sample file is the generator's output, options load."""

import os
import subprocess
import sys

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
    assert conf.cni_daemon.vif_source == 'annotation'
    assert conf.binding.ovsdb_connection == 'unix:/run/openvswitch/db.sock'
    assert (conf.health.host, conf.health.port) == ('0.0.0.0', 8090)
    assert (conf.prometheus.host, conf.prometheus.port) == ('0.0.0.0', 9655)


def test_a_config_file_overrides_and_bad_values_are_refused(tmp_path):
    path = tmp_path / 'k.conf'
    path.write_text('[cni_daemon]\nworker_count = 2\nvif_source = kuryrport\n')
    conf = config.load(['--config-file', str(path)])
    assert conf.cni_daemon.worker_count == 2
    assert conf.cni_daemon.vif_source == 'kuryrport'
    path.write_text('[cni_daemon]\nvif_source = somewhere\n')
    conf = config.load(['--config-file', str(path)])
    try:
        conf.cni_daemon.vif_source
    except ValueError as exc:
        assert 'somewhere' in str(exc)
    else:
        raise AssertionError('an invalid vif_source was accepted')
