"""etc/prometheus/kuryr-cni-alerts.yaml and etc/grafana/kuryr-cni-dashboard.json.

Both must only speak of metrics the daemon exports, with the right suffix for
their type (``_total`` counters, ``_bucket`` histograms) and labels they carry.
With ``promtool`` (Debian package ``prometheus``; or point $PROMTOOL at the
binary) the rules are also checked by Prometheus itself, every dashboard query
is parsed as PromQL, and every alert is unit-tested on synthetic series:
firing when it should, silent when it should not.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kuryr_cni import version

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / 'etc' / 'prometheus' / 'kuryr-cni-alerts.yaml'
DASHBOARD = REPO / 'etc' / 'grafana' / 'kuryr-cni-dashboard.json'

# What the daemon's /metrics serves: kuryr_cni.metrics after setup() read back
# through the ops process's collectors (multiprocess files plus the scrape
# collector), in a subprocess because prometheus_client picks multiprocess
# mode once, at import time. Two DELs wait in the queue (and one entry is
# being written), and the watcher last heard from the API server 100 s ago.
_EXPORTED = r"""
import json, os, sys, tempfile, time
from kuryr_cni import metrics, registry
from kuryr_cni.daemon import collector

with tempfile.TemporaryDirectory() as tmp:
    metrics.setup(tmp + '/metrics')
    queue = os.path.join(tmp, 'state', 'del-queue')
    os.makedirs(queue)
    for name in ('1-10.json', '2-11.json', '.3-12.tmp'):
        open(os.path.join(queue, name), 'w').close()
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess, parser
    served = CollectorRegistry()
    multiprocess.MultiProcessCollector(served)
    manager, reg = registry.Registry.start()
    try:
        reg.status.note_watch_activity(time.monotonic() - 100)
        served.register(collector.ScrapeCollector(reg, tmp + '/state'))
        text = generate_latest(served).decode()
    finally:
        manager.shutdown()
families = {}
samples = {}
for family in parser.text_string_to_metric_families(text):
    name = family.name + ('_total' if family.type == 'counter' else '')
    labels = set()
    for sample in family.samples:
        labels |= set(sample.labels) - {'le'}
        samples[sample.name + json.dumps(sample.labels, sort_keys=True)] = sample.value
    families[name] = [family.type, sorted(labels)]
json.dump({'families': families, 'samples': samples, 'text': text}, sys.stdout)
"""


def _exported():
    proc = subprocess.run([sys.executable, '-c', _EXPORTED], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


EXPORTED = _exported()


def _exported_metrics():
    """Name as exported -> (type, labels)."""
    return {name: (kind, set(labels)) for name, (kind, labels) in EXPORTED['families'].items()}


def _sample(name, **labels):
    return EXPORTED['samples'][name + json.dumps(labels, sort_keys=True)]


METRICS = _exported_metrics()
# Labels Prometheus attaches to every scraped series, and its own series.
TARGET_LABELS = {'job', 'instance'}
PROMETHEUS_SERIES = {'up': set()}
LABEL_VALUES = {
    'command': {'ADD', 'DEL', 'CHECK', 'GC', 'STATUS'},
    'reason': {'container_id_mismatch', 'pod_uid_mismatch'},
    'error': {'True', 'False'},
    'job': {'kuryr-cni'},
}


def _series_names():
    """Sample name as it appears in PromQL -> labels it can carry."""
    names = dict(PROMETHEUS_SERIES)
    for name, (kind, labels) in METRICS.items():
        if kind == 'histogram':
            names[name + '_bucket'] = labels | {'le'}
            names[name + '_sum'] = labels
            names[name + '_count'] = labels
        else:
            names[name] = labels
    return names


SERIES = _series_names()
PROMQL_WORDS = {'sum', 'max', 'min', 'avg', 'count', 'rate', 'increase', 'irate', 'by',
                'without', 'histogram_quantile', 'label_values', 'or', 'and', 'unless',
                'vector', 'on', 'ignoring', 'bool', 'offset', 'instance', 'le', 'job'}


def _check_promql(expr):
    """Every series is a known one, with labels it has and values it takes."""
    problems = []
    names = set(re.findall(r'\b(kuryr_cni_[a-z0-9_]+)\b', expr))
    names |= {n for n in PROMETHEUS_SERIES if re.search(r'\b%s\s*\{' % n, expr)}
    if not names:
        problems.append('no kuryr-cni series')
    available = set(TARGET_LABELS)
    for name in names:
        if name not in SERIES:
            problems.append('unknown series %s' % name)
            continue
        available |= SERIES[name]
    for name, body in re.findall(r'\b([a-z_][a-z0-9_]*)\s*\{([^}]*)\}', expr):
        if name not in SERIES:
            continue
        for label, op, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', body):
            if label not in SERIES[name] | TARGET_LABELS:
                problems.append('%s has no label %s' % (name, label))
            elif (op == '=' and label in LABEL_VALUES and value not in LABEL_VALUES[label]
                  and not value.startswith('$')):      # a dashboard variable
                problems.append('%s{%s="%s"}: no such value' % (name, label, value))
    for clause in re.findall(r'\b(?:by|without)\s*\(([^)]*)\)', expr):
        for label in re.findall(r'\w+', clause):
            if label not in available:
                problems.append('grouping by %s, which no series here has' % label)
    for match in re.finditer(r'histogram_quantile\s*\(', expr):
        rest = expr[match.end():]
        if not re.search(r'_bucket\b', rest) or not re.search(r'by\s*\([^)]*\ble\b', rest):
            problems.append('histogram_quantile without a _bucket series summed by le')
    return problems


# --- the metric set ------------------------------------------------------------

# The contract (DESIGN.md 4.4, plus watcher events, in-flight requests and worker
# restarts): operators' dashboards and alerts rely on these names and labels.
CONTRACT = {
    'kuryr_cni_requests_total': ('counter', {'command', 'result'}),
    # kuryr-kubernetes' name and labels, error = "True" | "False" (DESIGN 4.4).
    'kuryr_cni_request_duration_seconds': ('histogram', {'command', 'error'}),
    'kuryr_cni_stale_del_rejected_total': ('counter', {'reason'}),
    'kuryr_cni_attachments': ('gauge', set()),
    'kuryr_cni_vif_wait_seconds': ('histogram', set()),
    'kuryr_cni_watch_restarts_total': ('counter', {'reason'}),
    'kuryr_cni_sandbox_evictions_total': ('counter', set()),
    'kuryr_cni_watch_events_total': ('counter', {'type'}),
    'kuryr_cni_requests_in_flight': ('gauge', set()),
    'kuryr_cni_worker_restarts_total': ('counter', {'service'}),
    'kuryr_cni_ready': ('gauge', set()),
    'kuryr_cni_build_info': ('gauge', {'version'}),
    'kuryr_cni_queued_dels': ('gauge', set()),
    'kuryr_cni_watch_activity_age_seconds': ('gauge', set()),
}


def test_the_daemon_exports_the_contracted_metrics():
    assert {name: METRICS.get(name) for name in CONTRACT} == CONTRACT


def test_the_scraped_gauges_read_what_they_say():
    assert _sample('kuryr_cni_build_info', version=version.VERSION) == 1
    # Complete entries only: a temporary file is a write in progress.
    assert _sample('kuryr_cni_queued_dels') == 2
    assert 100 <= _sample('kuryr_cni_watch_activity_age_seconds') < 3600
    assert _sample('kuryr_cni_attachments') == 0
    assert _sample('kuryr_cni_ready') == 0      # no worker, no watcher: not ready


def test_metric_names_follow_prometheus_conventions():
    for name, (kind, labels) in METRICS.items():
        assert re.match(r'^kuryr_cni_[a-z][a-z0-9_]*[a-z0-9]$', name), name
        assert name.endswith('_total') == (kind == 'counter'), name
        if kind == 'histogram':
            assert name.endswith('_seconds'), 'histograms here measure time: %s' % name
        for label in labels:
            assert re.match(r'^[a-z][a-z0-9_]*$', label) and label != 'le', (name, label)


# --- the checker itself --------------------------------------------------------

@pytest.mark.parametrize('expr, problem', [
    ('rate(kuryr_cni_requests[5m])', 'unknown series kuryr_cni_requests'),
    ('kuryr_cni_attachments_total', 'unknown series'),
    ('rate(kuryr_cni_vif_wait_seconds[5m])', 'unknown series'),
    ('kuryr_cni_ready{pod="x"}', 'has no label pod'),
    ('rate(kuryr_cni_requests_total{command="add"}[5m])', 'no such value'),
    ('sum by (reason) (kuryr_cni_requests_total)', 'grouping by reason'),
    ('histogram_quantile(0.9, sum by (instance) '
     '(rate(kuryr_cni_request_duration_seconds_bucket[5m])))', 'summed by le'),
    ('up == 0', 'no kuryr-cni series'),
])
def test_promql_checker_finds(expr, problem):
    assert any(problem in p for p in _check_promql(expr)), _check_promql(expr)


def test_promql_checker_accepts():
    assert _check_promql(
        'histogram_quantile(0.99, sum by (instance, le) (rate('
        'kuryr_cni_request_duration_seconds_bucket{job="kuryr-cni", command="ADD"}[5m])))'
        ' > 30') == []


# --- alerting rules ----------------------------------------------------------

def _rules():
    with open(ALERTS) as f:
        data = yaml.safe_load(f)
    assert set(data) == {'groups'}
    return [(group['name'], rule) for group in data['groups'] for rule in group['rules']]


RULES = _rules()
DURATION = re.compile(r'^\d+[smhd]$')


def _seconds(duration):
    return int(duration[:-1]) * {'s': 1, 'm': 60, 'h': 3600, 'd': 86400}[duration[-1]]


def test_alert_file_structure():
    with open(ALERTS) as f:
        groups = yaml.safe_load(f)['groups']
    assert len({g['name'] for g in groups}) == len(groups)
    names = [rule['alert'] for _, rule in RULES]
    assert len(set(names)) == len(names)
    for group, rule in RULES:
        assert set(rule) <= {'alert', 'expr', 'for', 'labels', 'annotations'}, rule['alert']
        assert re.match(r'^KuryrCNI[A-Z][A-Za-z]+$', rule['alert'])
        assert isinstance(rule['expr'], str) and rule['expr'].strip()
        if 'for' in rule:
            assert DURATION.match(rule['for']), rule['alert']
        assert rule['labels']['severity'] in ('warning', 'critical')
        assert {'summary', 'description'} <= set(rule['annotations'])


@pytest.mark.parametrize('rule', [r for _, r in RULES], ids=[r['alert'] for _, r in RULES])
def test_alert_uses_only_exported_metrics(rule):
    assert _check_promql(rule['expr']) == []


def _rule_using(series):
    found = [rule for _, rule in RULES if re.search(r'\b%s\b' % series, rule['expr'])]
    assert found, 'no alert on %s' % series
    return found


def test_the_alerts_operators_rely_on_exist():
    stale, = _rule_using('kuryr_cni_stale_del_rejected_total')
    assert 'rate(' in stale['expr'] and re.search(r'>\s*0\s*$', stale['expr'])
    assert _seconds(stale['for']) == 600 and stale['labels']['severity'] == 'warning'

    latency, = _rule_using('kuryr_cni_request_duration_seconds_bucket')
    assert 'histogram_quantile(0.99' in latency['expr'] and 'command="ADD"' in latency['expr']
    errors, = _rule_using('kuryr_cni_request_duration_seconds_count')
    assert 'error="True"' in errors['expr'] and re.search(r'>\s*0\.5\s*$', errors['expr'])

    ready, = _rule_using('kuryr_cni_ready')
    assert re.search(r'==\s*0\s*$', ready['expr']) and _seconds(ready['for']) == 300

    down, = [rule for _, rule in RULES if re.match(r'^up\{', rule['expr'])]
    assert down['labels']['severity'] == 'critical'
    # A target that vanishes must not silence the alert meant for it.
    assert 'absent(up{job="kuryr-cni"})' in down['expr']

    _rule_using('kuryr_cni_watch_restarts_total')
    stalled, = _rule_using('kuryr_cni_watch_activity_age_seconds')
    assert re.search(r'>\s*600\s*$', stalled['expr'])
    queued, = _rule_using('kuryr_cni_queued_dels')
    assert re.search(r'>\s*0\s*$', queued['expr'])


def test_annotations_only_use_labels_the_alert_keeps():
    for _, rule in RULES:
        kept = set(rule['labels'])
        grouping = re.findall(r'\bby\s*\(([^)]*)\)', rule['expr'])
        if grouping:
            kept |= set(re.findall(r'\w+', grouping[-1])) - {'le'}
        else:
            kept |= TARGET_LABELS
        for text in rule['annotations'].values():
            for label in re.findall(r'\$labels\.(\w+)', text):
                assert label in kept, '%s: %s is gone after aggregation' % (rule['alert'], label)


# --- dashboard ---------------------------------------------------------------

def _dashboard():
    with open(DASHBOARD) as f:
        return json.load(f)


def _panels(dashboard):
    for panel in dashboard['panels']:
        yield panel
        yield from panel.get('panels', [])


def _queries(dashboard):
    """(where, PromQL) of every panel target and query variable."""
    for panel in _panels(dashboard):
        for target in panel.get('targets', []):
            yield 'panel %r' % panel['title'], target['expr']
    for var in dashboard['templating']['list']:
        if var['type'] == 'query':
            query = var['query']['query'] if isinstance(var['query'], dict) else var['query']
            yield 'variable %s' % var['name'], query


def test_dashboard_structure():
    dashboard = _dashboard()
    assert dashboard['title'] and dashboard['uid']
    assert isinstance(dashboard['schemaVersion'], int)
    ids = [p['id'] for p in _panels(dashboard)]
    assert len(ids) == len(set(ids))
    variables = {v['name']: v for v in dashboard['templating']['list']}
    assert variables['datasource']['type'] == 'datasource'
    assert variables['datasource']['query'] == 'prometheus'
    for panel in _panels(dashboard):
        grid = panel['gridPos']
        assert grid['x'] + grid['w'] <= 24 and grid['w'] > 0 and grid['h'] > 0
        if panel['type'] != 'row':
            assert panel['datasource'] == {'type': 'prometheus', 'uid': '${datasource}'}
            assert panel['targets'], panel['title']
            refs = [t['refId'] for t in panel['targets']]
            assert len(refs) == len(set(refs))


def test_dashboard_panels_do_not_overlap():
    cells = {}
    for panel in _panels(_dashboard()):
        g = panel['gridPos']
        for x in range(g['x'], g['x'] + g['w']):
            for y in range(g['y'], g['y'] + g['h']):
                assert (x, y) not in cells, '%r overlaps %r' % (panel['title'], cells[(x, y)])
                cells[(x, y)] = panel['title']


def test_dashboard_shows_what_operators_need():
    queries = ' '.join(q for _, q in _queries(_dashboard()))
    for needle in ('sum by (command, result) (rate(kuryr_cni_requests_total',
                   'command="ADD"', 'command="DEL"', 'histogram_quantile(0.5',
                   'histogram_quantile(0.99', 'sum by (reason) (rate(kuryr_cni_stale_del',
                   'kuryr_cni_attachments', 'kuryr_cni_vif_wait_seconds_bucket',
                   'kuryr_cni_requests_in_flight', 'kuryr_cni_watch_restarts_total',
                   'sum by (type) (rate(kuryr_cni_watch_events_total', 'kuryr_cni_ready',
                   'count by (version) (kuryr_cni_build_info', 'kuryr_cni_queued_dels',
                   'kuryr_cni_watch_activity_age_seconds'):
        assert needle in queries, needle


def test_dashboard_job_is_a_variable_every_query_uses():
    dashboard = _dashboard()
    variables = {v['name']: v for v in dashboard['templating']['list']}
    job = variables['job']
    assert job['type'] == 'query' and job['current']['value'] == 'kuryr-cni'
    assert not job['multi'] and not job['includeAll']
    for where, expr in _queries(dashboard):
        if where == 'variable job':
            assert 'job=' not in expr
            continue
        for name, body in re.findall(r'\b(kuryr_cni_[a-z0-9_]+)\s*\{([^}]*)\}', expr):
            assert 'job="$job"' in body, '%s: %s' % (where, expr)
        assert 'kuryr-cni"' not in expr, where


@pytest.mark.parametrize('where, expr', list(_queries(_dashboard())))
def test_dashboard_query_uses_only_exported_metrics(where, expr):
    assert _check_promql(expr) == [], where


# --- promtool ----------------------------------------------------------------

@pytest.fixture(scope='module')
def promtool():
    # $PROMTOOL (tox: the one tools/bootstrap unpacks) if it is there, else PATH's.
    path = next((p for p in (os.environ.get('PROMTOOL'), shutil.which('promtool'))
                 if p and os.path.isfile(p)), None)
    if not path:
        pytest.skip('promtool is not installed (Debian package prometheus, or set $PROMTOOL)')
    return path


def _promtool(promtool, *args, cwd):
    proc = subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def test_promtool_checks_the_exported_metrics(promtool, tmp_path):
    proc = subprocess.run([promtool, 'check', 'metrics'], input=EXPORTED['text'],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ('kuryr_cni_build_info', 'kuryr_cni_queued_dels',
                 'kuryr_cni_watch_activity_age_seconds'):
        assert '# HELP %s ' % name in EXPORTED['text'], name


def test_promtool_check_metrics_catches_a_mistake(promtool, tmp_path):
    text = EXPORTED['text'].replace('kuryr_cni_requests_total', 'kuryr_cni_requests')
    proc = subprocess.run([promtool, 'check', 'metrics'], input=text, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode != 0


def test_promtool_checks_the_rules(promtool, tmp_path):
    rc, out = _promtool(promtool, 'check', 'rules', str(ALERTS), cwd=tmp_path)
    assert rc == 0, out


def test_promtool_rejects_a_broken_rule(promtool, tmp_path):
    broken = tmp_path / 'broken.yaml'
    broken.write_text(ALERTS.read_text().replace('> 0', '> > 0', 1))
    rc, _ = _promtool(promtool, 'check', 'rules', str(broken), cwd=tmp_path)
    assert rc != 0


def _grafana_to_promql(expr):
    return (expr.replace('$__rate_interval', '5m').replace('$__interval', '1m')
            .replace('$instance', '.*').replace('$job', 'kuryr-cni'))


def test_promtool_parses_every_dashboard_query(promtool, tmp_path):
    rules = []
    for i, (where, expr) in enumerate(_queries(_dashboard())):
        if expr.startswith('label_values('):
            expr = re.match(r'label_values\((.*),\s*\w+\)$', expr).group(1)
        rules.append({'record': 'dashboard:query_%d' % i, 'expr': _grafana_to_promql(expr)})
    path = tmp_path / 'dashboard-queries.yaml'
    path.write_text(yaml.safe_dump({'groups': [{'name': 'dashboard', 'rules': rules}]}))
    rc, out = _promtool(promtool, 'check', 'rules', str(path), cwd=tmp_path)
    assert rc == 0, out


def _annotations(alertname, labels, value=None):
    """The alert's annotations as Prometheus renders them for ``labels`` (and ``value``)."""
    rule, = [r for _, r in RULES if r['alert'] == alertname]
    rendered = {}
    for key, template in rule['annotations'].items():
        text = re.sub(r'\{\{\s*if \$labels\.(\w+)\s*\}\}(.*?)\{\{\s*else\s*\}\}(.*?)'
                      r'\{\{\s*end\s*\}\}',
                      lambda m: m.group(2) if labels.get(m.group(1)) else m.group(3), template)
        text = re.sub(r'\{\{\s*\$labels\.(\w+)\s*\}\}', lambda m: labels[m.group(1)], text)
        text = re.sub(r'\{\{\s*\$value\s*\}\}', lambda m: str(value), text)
        assert '{{' not in text, 'teach _annotations this template: %s' % template
        rendered[key] = text
    return rendered


def _alert(alertname, value=None, **labels):
    rule, = [r for _, r in RULES if r['alert'] == alertname]
    return {'exp_labels': dict(rule['labels'], **labels),
            'exp_annotations': _annotations(alertname, labels, value)}


N1 = 'node-1:9655'
N2 = 'node-2:9655'


def _series(name, values, **labels):
    labels = dict({'job': 'kuryr-cni', 'instance': N1}, **labels)
    return {'series': '%s{%s}' % (name, ', '.join('%s="%s"' % kv for kv in sorted(
        labels.items()))), 'values': values}


def _buckets(command, per_minute_in_30s_to_60s, instance=N1, error='False'):
    """Cumulative buckets of requests that all took between 30 s and 60 s."""
    name = 'kuryr_cni_request_duration_seconds_bucket'
    n = per_minute_in_30s_to_60s
    labels = dict(command=command, instance=instance, error=error)
    return [_series(name, '0x40', le='10', **labels),
            _series(name, '0x40', le='30', **labels),
            _series(name, '0+%dx40' % n, le='60', **labels),
            _series(name, '0+%dx40' % n, le='+Inf', **labels)]


def _counts(command, per_minute, error, instance=N1):
    return _series('kuryr_cni_request_duration_seconds_count', '0+%dx40' % per_minute,
                   command=command, error=error, instance=instance)


def _alert_tests():
    """promtool test cases: each alert fires when due, and only then."""
    return [
        {'interval': '1m', 'name': 'stale DELs', 'input_series': [
            _series('kuryr_cni_stale_del_rejected_total', '0+1x30',
                    reason='container_id_mismatch'),
            _series('kuryr_cni_stale_del_rejected_total', '0x30', reason='pod_uid_mismatch'),
            _series('kuryr_cni_stale_del_rejected_total', '0+1x5 5x25', instance=N2,
                    reason='container_id_mismatch'),
        ], 'alert_rule_test': [
            {'eval_time': '10m', 'alertname': 'KuryrCNIStaleDelRejected', 'exp_alerts': []},
            {'eval_time': '20m', 'alertname': 'KuryrCNIStaleDelRejected', 'exp_alerts': [
                _alert('KuryrCNIStaleDelRejected', instance=N1,
                       reason='container_id_mismatch')]},
        ]},
        {'interval': '1m', 'name': 'ADD latency', 'input_series': [
            # Every ADD on node-1 takes 30-60 s; DELs on node-2 as well, and
            # ADDs on node-2 fail that slowly (the error alert's business).
            *_buckets('ADD', 10), *_buckets('DEL', 10, instance=N2),
            *_buckets('ADD', 10, instance=N2, error='True'),
        ], 'alert_rule_test': [
            {'eval_time': '12m', 'alertname': 'KuryrCNIAddLatencyHigh', 'exp_alerts': []},
            {'eval_time': '30m', 'alertname': 'KuryrCNIAddLatencyHigh', 'exp_alerts': [
                _alert('KuryrCNIAddLatencyHigh', instance=N1)]},
        ]},
        {'interval': '1m', 'name': 'ADD errors', 'input_series': [
            # node-1: 9 of 10 ADDs fail; node-2: 1 of 10; DELs failing do not count.
            _counts('ADD', 9, 'True'), _counts('ADD', 1, 'False'),
            _counts('ADD', 1, 'True', instance=N2), _counts('ADD', 9, 'False', instance=N2),
            _counts('DEL', 10, 'True', instance=N2),
        ], 'alert_rule_test': [
            {'eval_time': '10m', 'alertname': 'KuryrCNIAddErrors', 'exp_alerts': []},
            {'eval_time': '30m', 'alertname': 'KuryrCNIAddErrors', 'exp_alerts': [
                _alert('KuryrCNIAddErrors', instance=N1)]},
        ]},
        {'interval': '1m', 'name': 'not ready', 'input_series': [
            _series('kuryr_cni_ready', '1 1 0x10'),
            _series('kuryr_cni_ready', '1x12', instance=N2),
        ], 'alert_rule_test': [
            {'eval_time': '5m', 'alertname': 'KuryrCNIDaemonNotReady', 'exp_alerts': []},
            {'eval_time': '8m', 'alertname': 'KuryrCNIDaemonNotReady', 'exp_alerts': [
                _alert('KuryrCNIDaemonNotReady', instance=N1)]},
        ]},
        {'interval': '1m', 'name': 'target down', 'input_series': [
            _series('up', '0x10'),
            _series('up', '1x10', instance=N2),
        ], 'alert_rule_test': [
            {'eval_time': '3m', 'alertname': 'KuryrCNIDaemonDown', 'exp_alerts': []},
            {'eval_time': '6m', 'alertname': 'KuryrCNIDaemonDown', 'exp_alerts': [
                _alert('KuryrCNIDaemonDown', instance=N1, job='kuryr-cni')]},
        ]},
        {'interval': '1m', 'name': 'target gone from discovery', 'input_series': [
            # node-1's pod is deleted after 2 minutes: its series just stop.
            _series('up', '1 1 1 _x30'),
            _series('up', '1x33', instance=N2),
        ], 'alert_rule_test': [
            {'eval_time': '6m', 'alertname': 'KuryrCNIDaemonDown', 'exp_alerts': []},
            {'eval_time': '13m', 'alertname': 'KuryrCNIDaemonDown', 'exp_alerts': [
                _alert('KuryrCNIDaemonDown', instance=N1, job='kuryr-cni')]},
        ]},
        {'interval': '1m', 'name': 'no target at all', 'input_series': [
            _series('up', '1 _x80'),
        ], 'alert_rule_test': [
            {'eval_time': '70m', 'alertname': 'KuryrCNIDaemonDown', 'exp_alerts': [
                _alert('KuryrCNIDaemonDown', job='kuryr-cni')]},
        ]},
        {'interval': '1m', 'name': 'watch restarts', 'input_series': [
            # Broken: two restarts a minute. Healthy: one per watch_timeout (5m).
            _series('kuryr_cni_watch_restarts_total', '0+2x40', reason='error'),
            _series('kuryr_cni_watch_restarts_total', '0 0 0 0 1+0x4 2+0x4 3+0x4 4+0x4 '
                    '5+0x4 6+0x4 7+0x4 8+0x3', instance=N2, reason='timeout'),
        ], 'alert_rule_test': [
            {'eval_time': '20m', 'alertname': 'KuryrCNIWatchRestartsFrequent',
             'exp_alerts': []},
            {'eval_time': '35m', 'alertname': 'KuryrCNIWatchRestartsFrequent', 'exp_alerts': [
                _alert('KuryrCNIWatchRestartsFrequent', instance=N1)]},
        ]},
        {'interval': '1m', 'name': 'worker restarts', 'input_series': [
            _series('kuryr_cni_worker_restarts_total', '0x5 1x30', service='cni-worker'),
            _series('kuryr_cni_worker_restarts_total', '0x35', instance=N2,
                    service='cni-worker'),
        ], 'alert_rule_test': [
            {'eval_time': '4m', 'alertname': 'KuryrCNIWorkerRestarts', 'exp_alerts': []},
            {'eval_time': '10m', 'alertname': 'KuryrCNIWorkerRestarts', 'exp_alerts': [
                _alert('KuryrCNIWorkerRestarts', instance=N1)]},
            {'eval_time': '30m', 'alertname': 'KuryrCNIWorkerRestarts', 'exp_alerts': []},
        ]},
        {'interval': '1m', 'name': 'watch stalled', 'input_series': [
            # node-1 hears nothing from the start; node-2 gets a bookmark a minute.
            _series('kuryr_cni_watch_activity_age_seconds', '0+60x30'),
            _series('kuryr_cni_watch_activity_age_seconds', '0 30 0 30 0 30 0 30 0 30 0 30 0 '
                    '30 0 30 0 30 0 30', instance=N2),
        ], 'alert_rule_test': [
            {'eval_time': '12m', 'alertname': 'KuryrCNIWatchStalled', 'exp_alerts': []},
            {'eval_time': '17m', 'alertname': 'KuryrCNIWatchStalled', 'exp_alerts': [
                _alert('KuryrCNIWatchStalled', instance=N1)]},
        ]},
        {'interval': '1m', 'name': 'queued DELs', 'input_series': [
            _series('kuryr_cni_queued_dels', '0 0 2x30'),
            _series('kuryr_cni_queued_dels', '0x32', instance=N2),
        ], 'alert_rule_test': [
            {'eval_time': '10m', 'alertname': 'KuryrCNIQueuedDels', 'exp_alerts': []},
            {'eval_time': '20m', 'alertname': 'KuryrCNIQueuedDels', 'exp_alerts': [
                _alert('KuryrCNIQueuedDels', value=2, instance=N1)]},
        ]},
    ]


def test_every_alert_has_a_promtool_test():
    tested = {t['alertname'] for case in _alert_tests() for t in case['alert_rule_test']}
    assert tested == {rule['alert'] for _, rule in RULES}


def test_promtool_alert_unit_tests(promtool, tmp_path):
    shutil.copy(ALERTS, tmp_path / 'alerts.yaml')
    tests = tmp_path / 'alerts-test.yaml'
    tests.write_text(yaml.safe_dump({'rule_files': ['alerts.yaml'],
                                     'evaluation_interval': '1m',
                                     'tests': _alert_tests()}, sort_keys=False))
    rc, out = _promtool(promtool, 'test', 'rules', str(tests), cwd=tmp_path)
    assert rc == 0, out
