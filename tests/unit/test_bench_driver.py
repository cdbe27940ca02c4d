"""The bench's driver: a plugin run that outlasts its op's timeout is one failed op.

kuryr-daemon's forked-per-request operations can take minutes under load, so
its ops carry a timeout of their own; a run killed at it must come back as a
failure the bench reports (code -1, saying so), not take the driver down with
every other op of the batch.
"""

import sys

from tools.bench import driver


def _op(code, timeout=None):
    op = {'argv': [sys.executable, '-c', code], 'env': {}, 'stdin': ''}
    if timeout is not None:
        op['timeout'] = timeout
    return op


def test_an_op_killed_at_its_timeout_fails_alone():
    answer = driver.run_batch([_op('import time; time.sleep(30)', timeout=1),
                               _op('print("ok")')], concurrency=2)
    slow, quick = answer['results']
    assert slow['code'] == -1
    assert 'after 1 s' in slow['stderr']
    assert 1 <= slow['seconds'] < 25
    assert (quick['code'], quick['stdout'].strip()) == (0, 'ok')
