"""One log line per CNI request, read from the real daemon's log file.

Operators follow one pod by grepping its name or its sandbox's container ID:
each request leaves exactly one line with the command, the pod, the
container ID, the interface, how it ended (the CNI code, and for an error its
class and message) and how long it took.
"""

import re

import pytest

from tests.functional import conftest
from tests.functional import test_operations as ops

pytestmark = pytest.mark.skipif(not conftest.CAN_RUN, reason=conftest.SKIP_REASON)

REQUEST_LINE = re.compile(
    r'^\S+ \S+ \d+ (?P<level>INFO|WARNING) kuryr_cni\.daemon\.api \[-\] '
    r'(?P<command>[A-Z]+) pod (?P<pod>\S+) container (?P<container>\S+) ifname (?P<ifname>\S+): '
    r'(?P<result>.*) in (?P<seconds>\d+\.\d{3}) s$')


def _request_lines(node):
    with open(node.workdir + '/daemon.log') as f:
        text = f.read()
    return text, [m.groupdict() for m in map(REQUEST_LINE.match, text.splitlines()) if m]


@pytest.mark.parametrize('vif_timeout', [2])
def test_every_request_leaves_one_line_naming_pod_sandbox_and_outcome(daemon, runtime):
    node = daemon
    ops.create_pod(node, active=False)
    a, b = ops.sandbox(node, 'A'), ops.sandbox(node, 'B')
    assert runtime.add(a).error_code == 11          # its VIFs never turn active
    assert runtime.delete(a).ok
    node.api.set_vifs('default', ops.POD, node.vifs(ops.INDEX))
    assert runtime.add(b).ok
    assert runtime.delete(b).ok

    text, lines = _request_lines(node)
    assert [(line['command'], line['container']) for line in lines] == [
        ('ADD', 'sandbox-A'), ('DEL', 'sandbox-A'), ('ADD', 'sandbox-B'), ('DEL', 'sandbox-B')]
    assert {(line['pod'], line['ifname']) for line in lines} == {(ops.POD_KEY, 'eth0')}
    failed, *rest = lines
    assert failed['level'] == 'WARNING'
    assert re.match(r'error code 11 TryAgainLater: \S.*$', failed['result']), failed['result']
    assert float(failed['seconds']) >= 2
    assert [line['level'] for line in rest] == ['INFO'] * 3
    assert re.match(r'(success|noop) \(code 0\)$', rest[0]['result'])
    assert [line['result'] for line in rest[1:]] == ['success (code 0)'] * 2
    # The error is told once, in words: no exception summary tacked on by oslo.log.
    assert 'kuryr_cni.errors' not in text and '(): ' not in text
