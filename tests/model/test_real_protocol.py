"""Issue 32, item 2: the real daemon code through the protocol's actions and crash points.

The state machine is :class:`tests.model.real_protocol.Protocol`. Profiles:
``ci`` (default: derandomized, so every CI run
explores the same examples, bounded to run in about a minute on two cores)
and ``long`` (``KURYR_CNI_MODEL_LONG=1``: random seeds, many more and longer
examples; ``tox -e model-long``, for nights).
"""

import os

from hypothesis import HealthCheck
from hypothesis import settings

from tests.model import real_protocol

settings.register_profile(
    'model-ci', derandomize=True, database=None, max_examples=300, stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
settings.register_profile(
    'model-long', max_examples=2000, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
PROFILE = 'model-' + ('long' if os.environ.get('KURYR_CNI_MODEL_LONG') == '1' else 'ci')
TestRealProtocol = real_protocol.Protocol.TestCase
TestRealProtocol.settings = settings.get_profile(PROFILE)
