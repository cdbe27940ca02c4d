"""The DaemonSet's ClusterRole is minimal: without any one of its permissions, a named
behaviour breaks, on a real kube-apiserver with RBAC on.

The table below has one row per (API group, resource, verb) the manifest
grants, and a test checks that the rows are exactly those: a permission added
to the manifest without a behaviour that needs it fails here. That the role
is sufficient is shown by every other test of the tier (no 403 anywhere).
"""

import pytest

from tests import wait
from tests.functional import crash
from tools.testbed import runtime as testruntime

ROWS = {
    ('', 'pods', 'list'): ('the watcher lists this node\'s pods', 'annotation',
                           'cannot list resource "pods"'),
    ('', 'pods', 'watch'): ('the watcher follows this node\'s pods', 'annotation',
                            'cannot watch resource "pods"'),
    ('openstack.org', 'kuryrports', 'list'): ('the KuryrPort source lists this node\'s ports',
                                              'kuryrport', 'cannot list resource "kuryrports"'),
    ('openstack.org', 'kuryrports', 'watch'): ('the KuryrPort source follows them',
                                               'kuryrport',
                                               'cannot watch resource "kuryrports"'),
    ('', 'events', 'create'): ('an ADD that timed out posts its Event', 'annotation',
                               'cannot create resource "events"'),
}


def granted(rules):
    return {(group, resource, verb) for rule in rules for group in rule['apiGroups']
            for resource in rule['resources'] for verb in rule['verbs']}


def without(rules, triple):
    group, resource, verb = triple
    kept = []
    for rule in rules:
        rule = dict(rule)
        if group in rule['apiGroups'] and resource in rule['resources']:
            rule['verbs'] = [v for v in rule['verbs'] if v != verb]
        if rule['verbs']:
            kept.append(rule)
    return kept


def test_the_table_covers_exactly_what_the_manifest_grants(cluster):
    assert granted(cluster.daemonset_rules()) == set(ROWS)


@pytest.mark.parametrize('triple', sorted(ROWS), ids=['/'.join(t) for t in sorted(ROWS)])
def test_each_permission_is_needed(cluster, node_factory, tmp_path, triple):
    behaviour, source, refusal = ROWS[triple]
    full = cluster.daemonset_rules()
    cluster.set_daemon_rules(without(full, triple))
    try:
        node = node_factory()
        since = cluster.audit_offset()
        if triple[1] == 'events':
            _add_times_out(cluster, node, tmp_path)
            wait.until(lambda: 'Could not post' in node.daemon_log(), 20, 'the failed post')
            assert [e for e in cluster.events() if e['source'].get('host') == node.name] == []
        else:
            node.start_daemon(vif_source=source, wait=False)
            wait.until(lambda: refusal in node.daemon_log(), 30, 'the refusal logged')
            status, facts = crash.health(node, 'ready')
            assert status == 503 and not facts['watcher_synced'], behaviour
        # Logged with the server's message: who may not do what.
        line = next(line for line in node.daemon_log().splitlines() if refusal in line)
        assert 'HTTP 403 Forbidden' in line and 'system:serviceaccount:kube-system:kuryr-cni' \
            in line, line
        if triple[1] != 'events':       # and what was being watched
            assert 'for the watch of %s of node %s' % (
                'pods' if triple[1] == 'pods' else 'KuryrPorts', node.name) in line, line
        assert cluster.refused(since), behaviour
    finally:
        cluster.set_daemon_rules(full)


def _add_times_out(cluster, node, tmp_path):
    node.start_daemon(vif_timeout=1)
    pod = cluster.create_pod('default', 'no-vifs-1', node.name)
    runtime = testruntime.Runtime(node.socket, node.state_dir, str(tmp_path / 'cni-cache'),
                                  shim=node.install_shim())
    outcome = runtime.add(node.sandbox(pod))
    assert outcome.error_code == 11, outcome
