"""tools/podstart reads each pod's ADD from the daemon's log (GateSteps): the line it
looks for must be the line the daemon writes, in oslo.log's default format."""

import logging
import types

from oslo_config import cfg
from oslo_log import formatters

from kuryr_cni import conf as kuryr_conf
from kuryr_cni import errors
from kuryr_cni.daemon import api
from tools import podstart


class Lines(logging.Handler):
    def __init__(self, formatter):
        super().__init__(logging.INFO)
        self.setFormatter(formatter)
        self.lines = []

    def emit(self, record):
        self.lines.append(self.format(record))


def _logged(*request):
    conf = kuryr_conf.register(cfg.ConfigOpts())
    conf([], default_config_files=[])
    # As oslo_log.log.setup builds each handler's formatter.
    lines = Lines(formatters.ContextFormatter(project='kuryr-cni', config=conf,
                                              datefmt=conf.log_date_format))
    logger = api.LOG.logger
    level, logger.level = logger.level, logging.INFO
    logger.addHandler(lines)
    try:
        api._log_request(logging.INFO, *request)
    finally:
        logger.removeHandler(lines)
        logger.level = level
    return '\n'.join(lines.lines)


def _request(name):
    return types.SimpleNamespace(pod=types.SimpleNamespace(namespace='default', name=name),
                                 container_id='c0ffee', ifname='eth0')


def test_a_successful_add_is_read_with_its_pod_and_duration():
    line = _logged('ADD', _request('gate-7'), 'success', None, 1.2345)
    match = podstart.ADD_LINE.search(line)
    assert match, line
    assert (match['name'], match['seconds']) == ('gate-7', '1.234'), line
    # The time stamp the tool parses, to the millisecond.
    assert podstart.datetime.datetime.strptime(match['at'], podstart.LOG_TIME)


def test_a_failed_add_is_not_read_as_an_answer():
    line = _logged('ADD', _request('gate-7'), None,
                   errors.TryAgainLater('no VIF for pod default/gate-7 yet'), 60.0)
    assert 'gate-7' in line and podstart.ADD_LINE.search(line) is None, line
