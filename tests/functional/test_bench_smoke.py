"""The benchmark runs end to end with tiny numbers and leaves the machine clean.

It runs ``python -m tools.bench`` as ``tox -e bench`` would, with 4 pods and
no chart: the real daemon behind the real shim, the reference plugins when
Debian's containernetworking-plugins is installed (skipped by the benchmark
itself, with a message, when not). The figures' values are not judged here
(four pods measure nothing reliable); that every figure is there, and that
nothing the run made is left, is.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.functional import conftest
from tools.bench import systems

pytestmark = pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LATENCIES = ('serial_add_ms', 'serial_del_ms', 'add_none_ms', 'add_attached_ms',
             'del_attached_ms')
THROUGHPUTS = ('add_c10', 'del_c10', 'add_c50', 'del_c50')


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    results = tmp_path_factory.mktemp('bench-results')
    proc = subprocess.run(
        [sys.executable, '-m', 'tools.bench', '--pods', '4', '--memory-pods', '6',
         '--version-runs', '5', '--rounds', '1', '--no-chart', '--results', str(results)],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (folder,) = os.listdir(results)
    with open(os.path.join(results, folder, 'bench.json')) as f:
        return proc, json.load(f)


def _numbers(*values):
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def test_every_figure_is_in_the_json(run):
    proc, report = run
    fig = report['figures']
    reference = report['reference_skipped'] is None
    names = ['kuryr', 'reference'] if reference else ['kuryr']
    assert sorted(fig['shim_alone_cpu_ms']) == ['add', 'del']
    assert all(_numbers(v) and v > 0 for v in fig['shim_alone_cpu_ms'].values())
    for name in names:
        assert _numbers(fig['version_ms'][name]['median'])
        for key in LATENCIES:
            entry = fig[key][name]
            # With none attached: before attaching and after deleting, pooled.
            assert entry['n'] == (8 if key == 'add_none_ms' else 4)
            assert _numbers(entry['median'], entry['p90'], entry['p99'])
        for key in THROUGHPUTS:
            assert _numbers(fig['throughput_ops_per_s'][key][name]) \
                and fig['throughput_ops_per_s'][key][name] > 0
            cpu = fig['cpu_ms_per_op'][key][name]
            assert sorted(cpu) == ['plugin', 'service_sys', 'service_user', 'total']
            assert _numbers(*cpu.values())
        assert _numbers(fig['add_growth'][name])
        assert fig['pings'][name] is True     # the pods it measured had a working network
    pss = fig['daemon_pss_mib']
    assert _numbers(pss['idle'], pss['attached'], pss['per_extra_worker'], *pss[
        'after_warm_up'].values())
    assert sorted(pss['after_warm_up']) == ['4', '6']
    assert 50 < pss['idle'] < 1000
    roles = {p['role'] for p in report['raw']['pss_idle']['processes']}
    assert roles >= {'parent', 'registry', 'watcher', 'cni-worker', 'ops'}
    assert len(report['targets']) == 8
    for target in report['targets']:
        # Ratio targets are not judged without the reference; the others always are.
        judged = reference or target['unit'] != 'x'
        assert target['met'] in ((True, False) if judged else (None,)), target
    if reference:
        for key in LATENCIES:
            assert _numbers(*fig[key]['ratio'].values())
        assert _numbers(fig['version_ms']['ratio'],
                        *(fig['throughput_ops_per_s'][k]['ratio'] for k in THROUGHPUTS))
    else:
        assert 'Reference skipped' in proc.stdout
    assert 'target: shim VERSION median vs reference' in proc.stdout
    assert 'the daemon in the kernel' in proc.stdout


def test_the_run_leaves_nothing_behind(run):
    _proc, report = run
    fig = report['figures']
    assert fig['clean'], report['leftovers']
    namespaces = subprocess.run(['ip', 'netns', 'list'], capture_output=True, text=True,
                                check=True).stdout
    processes = subprocess.run(['ps', '-eo', 'args'], capture_output=True, text=True,
                               check=True).stdout
    assert len(report['hosts']) == (2 if report['reference_skipped'] is None else 1)
    for host in report['hosts']:
        prefix = host['netns'][:-len('-host')]
        assert prefix not in namespaces
        assert not os.path.exists(host['workdir'])
        assert host['workdir'] not in processes


def test_the_reference_is_skipped_with_a_message_when_absent(monkeypatch):
    monkeypatch.setattr(systems, 'REFERENCE_PLUGIN', '/nonexistent/bridge')
    assert 'containernetworking-plugins' in systems.reference_missing()
