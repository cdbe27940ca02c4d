"""The daemon's CNI API (DESIGN §4.2): HTTP paths to ownership operations.

This is the one place where errors become CNI error JSON: everything below
raises :mod:`kuryr_cni.errors`; anything else is logged with its traceback and
answered as an internal error. Every request is counted and timed here.
"""

import json
import time

from oslo_log import log as logging

from kuryr_cni import errors
from kuryr_cni import metrics
from kuryr_cni import ownership as rules
from kuryr_cni import records
from kuryr_cni.cni import request as cni_request
from kuryr_cni.daemon import health
from kuryr_cni.daemon import server

LOG = logging.getLogger(__name__)

ROUTES = {
    '/addNetwork': 'ADD',
    '/delNetwork': 'DEL',
    '/checkNetwork': 'CHECK',
    '/gc': 'GC',
    '/status': 'STATUS',
}
_VALID_ATTACHMENTS_KEYS = ('cni.dev/valid-attachments', 'cni.dev/attachments')


class CNIApp:
    """Answer one CNI request: ``handle(path, raw_body) -> (http status, bytes)``."""

    def __init__(self, ownership, registry, request_timeout):
        self.ownership = ownership
        self.registry = registry
        self.request_timeout = request_timeout

    def handle(self, path, raw_body):
        command = ROUTES.get(path)
        started = time.monotonic()
        body = req = error = None
        outcome = 'error'
        metrics.in_flight(1)
        try:
            if command is None:
                raise errors.InvalidEnvironment('unknown path %s' % path)
            body = cni_request.decode(raw_body)
            req = cni_request.parse(body, command)
            outcome, result = self.dispatch(req, started + self.request_timeout)
            answer = (204, b'') if result is None else (200, json.dumps(result).encode())
        except errors.CNIError as exc:
            error = exc
            level = logging.WARNING if exc.retry else logging.INFO
        except (ConnectionError, EOFError) as exc:
            # The registry Manager is gone; the supervisor restarts the daemon.
            error = errors.TryAgainLater('daemon registry unavailable', str(exc))
            level = logging.ERROR
        except OSError as exc:
            if exc.errno in errors.SHORTAGES:
                # Out of descriptors or memory for a moment: the runtime's retry may pass.
                error = errors.TryAgainLater('the daemon ran short of resources', str(exc))
                level = logging.ERROR
            else:
                LOG.exception('%s failed unexpectedly', command)
                error = errors.CNIError('internal error', repr(exc))
                level = logging.ERROR
        except Exception as exc:
            LOG.exception('%s failed unexpectedly', command)
            error = errors.CNIError('internal error', repr(exc))
            level = logging.ERROR
        finally:
            metrics.in_flight(-1)
            seconds = time.monotonic() - started
            metrics.observe_request(command or 'unknown', outcome, seconds)
        # Outside the except clauses: oslo.log would append the exception being
        # handled to a WARNING, a second, garbled account of the same error.
        if error is None:
            level = logging.DEBUG if command == 'STATUS' else logging.INFO
        _log_request(level, command or path, req, outcome, error, seconds)
        if error is not None:
            return error.http_status, _error_json(error, body)
        return answer

    def dispatch(self, req, deadline):
        """Run ``req``; returns ``(outcome, result or None)``."""
        if req.command == 'ADD':
            return 'success', self.ownership.add(req, deadline)
        if req.command == 'DEL':
            return self._delete(req, deadline), None
        if req.command == 'CHECK':
            self.ownership.check(req, deadline)
            return 'success', None
        if req.command == 'GC':
            return self._gc(req, deadline), None
        self._status()
        return 'success', None

    def _delete(self, req, deadline):
        outcome = self.ownership.delete(req, deadline)
        if outcome != rules.DEFERRED:
            return outcome
        # Just started, the pods not listed yet: what kuryr-daemon made for this
        # sandbox can be proven (and removed) only by its pod's VIFs. A no-op now would
        # leave its devices for good, as the runtime forgets a sandbox it was told is gone.
        if self.ownership.wait_vifs_listed(req.pod, deadline):
            outcome = self.ownership.delete(req, deadline)
            if outcome != rules.DEFERRED:
                return outcome
        raise errors.TryAgainLater(
            'the pods of this node are not listed yet since the daemon started: the devices '
            'of sandbox %s of pod %s cannot be proven yet' % (req.container_id, req.pod.key))

    def _status(self):
        """Fail only when an ADD arriving now would fail (``serves_adds`` of
        :func:`health.judge`: the /ready judgement but for a saturated socket,
        which delays ADDs, never fails them).

        Never 51: pods already plugged keep their connectivity without the
        daemon (their data path is in the kernel), so "not available" is the
        whole truth.
        """
        facts = health.judge(self.registry)
        if not facts['serves_adds']:
            raise errors.PluginNotAvailable(
                'kuryr-cni daemon not ready to add pods',
                ', '.join(facts.get('add_problems') or ['not ready']))

    def _gc(self, req, deadline):
        """Collect every stale attachment of the network; report failures after trying all.

        The spec asks a GC to remove as much as it can and then report errors;
        the error raised is of the first failure's class (so its code and
        retry hint), naming every failure in ``details``.
        """
        valid = _valid_attachments(req.config)
        if valid is None:
            return 'noop'     # a missing key is not an empty list: collect nothing
        stale = self.ownership.stale_attachments(req.network, valid,
                                                 max_add_age=self.request_timeout)
        failures = []
        for pod_key, container_id, ifname, added_at in stale:
            namespace, _, name = pod_key.partition('/')
            try:
                self.ownership.collect(cni_request.Request(
                    command='DEL', cni_version=req.cni_version, network=req.network,
                    container_id=container_id, netns=None, ifname=ifname,
                    pod=cni_request.PodRef(namespace, name), config=req.config),
                    deadline, added_at, max_add_age=self.request_timeout)
            except errors.CNIError as exc:
                LOG.warning('GC of %s/%s of pod %s failed: %s (%s)',
                            container_id, ifname, pod_key, exc.msg, exc.details)
                failures.append((container_id, ifname, exc))
        if failures:
            raise type(failures[0][2])(
                'GC could not remove %d of %d stale attachments' % (len(failures), len(stale)),
                '; '.join('%s/%s: %s' % (cid, ifname, exc.msg) for cid, ifname, exc in failures))
        return 'success'


class InspectApp:
    """Read-only views for ``kuryr-cni-ctl``: ``inspect(path) -> (status, object)``."""

    def __init__(self, registry, store, version):
        self.registry = registry
        self.store = store          # the bindings, whole, are read from their files
        self.version = version

    def inspect(self, path):
        if path == '/v1/status':
            facts = health.judge(self.registry)
            facts.update(version=self.version, pods=self.registry.pods.size(),
                         bindings=self.registry.bindings.size())
            return 200, facts
        if path == '/v1/pods':
            bindings = self.store.load_all()
            return 200, [bindings[key].to_dict() for key in sorted(bindings)]
        if path.startswith('/v1/pods/'):
            binding = self._load(path[len('/v1/pods/'):])
            if binding is None:
                return 404, {'error': 'no binding for pod %s' % path[len('/v1/pods/'):]}
            return 200, binding.to_dict()
        if path == '/v1/stale-dels':
            return 200, self.registry.stale_dels.recent()
        if path == '/v1/adoptions':
            log = self.registry.adoptions
            return 200, log.recent() if log is not None else []
        if path == '/v1/queued-dels':
            return 200, self.registry.status.queued_dels()
        return 404, {'error': 'unknown path %s' % path}

    def _load(self, pod_key):
        try:
            records.pod_key(pod_key)
        except records.RecordError:
            return None
        return self.store.load(pod_key)


def _valid_attachments(config):
    for key in _VALID_ATTACHMENTS_KEYS:
        if key in config:
            items = config[key]
            break
    else:
        return None
    if not isinstance(items, list):
        raise errors.InvalidConfig('%s must be a list' % key)
    valid = set()
    for item in items:
        if not (isinstance(item, dict) and isinstance(item.get('containerID'), str)
                and isinstance(item.get('ifname'), str)):
            raise errors.InvalidConfig('%s entries are {"containerID", "ifname"}' % key)
        valid.add((item['containerID'], item['ifname']))
    return valid


def _log_request(level, command, req, outcome, error, seconds):
    """The one line of a CNI request: who asked what, and how it ended.

    Names the pod, the sandbox and the interface as the runtime gave them,
    never the network config (it may hold anything).
    """
    pod = '%s/%s' % (req.pod.namespace, req.pod.name) if req and req.pod else '-'
    who = '%s pod %s container %s ifname %s' % (
        command, pod, (req and req.container_id) or '-', (req and req.ifname) or '-')
    if error is None:
        LOG.log(level, '%s: %s (code 0) in %.3f s', who, outcome, seconds)
    else:
        LOG.log(level, '%s: error code %d %s: %s%s in %.3f s', who, error.code,
                type(error).__name__, error.msg,
                ' (%s)' % error.details if error.details else '', seconds)


def _error_json(exc, body):
    return json.dumps(exc.to_dict(cni_request.error_version(body))).encode()


class CNIHandler:
    """The HTTP face of :class:`CNIApp` (POST) and :class:`InspectApp` (GET).

    A :class:`kuryr_cni.daemon.server.App`: malformed requests, and bodies
    over 1 MiB (left unread), get a CNI error JSON with code 4.
    """

    def __init__(self, app, inspect):
        self.app = app
        self.inspect = inspect

    def answer(self, request):
        if request.method == 'GET':
            status, payload = self.inspect.inspect(request.path)
            return server.Response(status, json.dumps(payload).encode())
        if request.method != 'POST':
            return self.refuse(405, 'method %s not allowed' % request.method)
        return server.Response(*self.app.handle(request.path, request.body))

    def refuse(self, status, message):
        error = errors.BodyTooLarge if status == 413 else errors.InvalidEnvironment
        return server.Response(status, _error_json(error(message), None))
