"""List+watch of this node's pods into the registry.

The one job: keep a sink (the Manager-backed registry) in step with the pods the
API server has on this node, as small records ``"ns/name" -> {uid, vifs, error,
deleting}``. It lists with ``fieldSelector=spec.nodeName=<node>``, watches from
the list's resourceVersion with bookmarks, resumes from the last seen
resourceVersion when a watch ends, relists on 410 Gone and backs off with jitter
while the API is unreachable.

Boundaries: requests go through the official client, but the JSON is read here
(deserialising every V1Pod into model classes is slow) and validated at this
edge; a malformed pod or VIF annotation becomes a skipped object or an error
record, never an exception. No decision about attachments is taken here.

Sync state: ``mark_synced(True)`` after every successful list;
``mark_synced(False)`` once the API has been failing for ``unsynced_after``
seconds without a break (the records are kept, but may be stale), after which
the next success is a full relist rather than a resumed watch.
"""

import contextlib
import json
import random
import threading
import time

from kubernetes import client
from oslo_log import log as logging
import urllib3

from kuryr_cni import errors
from kuryr_cni import vif as vifmod

LOG = logging.getLogger(__name__)

MAX_EVENT_BYTES = 4 * 1024 * 1024   # a pod in etcd is at most 1.5 MiB; anything bigger is garbage
MAX_BACKOFF_EXPONENT = 16


class _Expired(Exception):
    """The API server no longer holds our resourceVersion: relist."""


class _Unavailable(Exception):
    """A request or a stream failed: back off, then resume from the last resourceVersion."""


class _BadObject(Exception):
    """An API object lacking what we need to use it."""


class PodWatcher:
    """Feeds ``sink`` from a list+watch of the pods on ``node_name``.

    ``sink`` needs ``replace_pods(records)``, ``put_pod(key, record)``,
    ``drop_pod(key)`` and ``mark_synced(bool)``. ``on_restart(reason)`` is
    called each time the list or watch is re-established after a failure
    (``reason`` is ``'error'`` or ``'expired'``), ``on_event(type)`` for every
    watch event. Exceptions raised by the sink or the callbacks are not caught:
    without its registry the watcher has nothing to do, and its process manager
    restarts it.
    """

    what = 'pods'     # the watched objects, for the logs

    def __init__(self, api_client, node_name, sink, *, watch_timeout=300,
                 request_timeout=(10, 60), backoff_max=30, backoff_initial=0.5,
                 unsynced_after=120, on_restart=None, on_event=None):
        """``request_timeout`` is (connect, read) seconds for the list; a watch
        may stay silent for ``watch_timeout`` plus that read timeout.
        ``unsynced_after`` None never marks the sink unsynced.
        """
        if isinstance(request_timeout, (int, float)):
            request_timeout = (request_timeout, request_timeout)
        self.node_name = node_name
        self.sink = sink
        self.watch_timeout = max(1, int(watch_timeout))
        self.request_timeout = tuple(request_timeout)
        self.backoff_max = backoff_max
        self.backoff_initial = min(backoff_initial, backoff_max)
        self.unsynced_after = unsynced_after
        self.on_restart = on_restart
        self.on_event = on_event
        self._core = client.CoreV1Api(api_client)
        self._selector = 'spec.nodeName=%s' % node_name
        self._rv = None               # None: the next step is a (re)list
        self._failures = 0            # consecutive attempts that got nothing through
        self._down_since = None
        self._restart_reason = None
        self._unsynced = False
        self._reported = {}           # key -> resourceVersion whose bad annotation was logged
        self._lock = threading.Lock()
        self._response = None         # the response being read, so stop can cut it
        self._stop_event = threading.Event()

    def run(self, stop_event=None):
        """List and watch until ``stop_event`` is set (from any thread or signal handler).

        Setting the event also cuts an open watch stream, so it returns promptly.
        """
        if stop_event is not None:
            self._stop_event = stop_event
        stop_event = self._stop_event
        threading.Thread(target=self._cut_on_stop, daemon=True, name='watch-stopper').start()
        LOG.info('Watching %s of node %s', self.what, self.node_name)
        while not stop_event.is_set():
            try:
                if self._rv is None:
                    self._relist()
                self._watch()
            except _Expired as exc:
                LOG.info('Resource version %s expired (%s); relisting', self._rv, exc)
                self._rv = None
                self._note_failure('expired', backoff=self._failures > 0)
            except _Unavailable as exc:
                if stop_event.is_set():
                    break
                LOG.warning('Kubernetes API unavailable (%s); retrying', exc)
                self._note_failure('error', backoff=True)
        LOG.info('Stopped watching %s of node %s', self.what, self.node_name)

    def stop(self):
        """Ask :meth:`run` to return; safe from any thread."""
        self._stop_event.set()

    # Steps -----------------------------------------------------------------------

    def _list(self, **kwargs):
        """The list request (a watch with ``watch=True``) for the objects watched.

        The one place that names the resource, so a subclass can watch
        another one (:class:`kuryr_cni.kuryrport.KuryrPortWatcher`).
        """
        return self._call(self._core.list_pod_for_all_namespaces,
                          field_selector=self._selector, **kwargs)

    def _relist(self):
        response = self._list(_request_timeout=self.request_timeout)
        with self._reading(response):
            body = _read_json(response)
        try:
            rv = _resource_version(body)
            items = body['items'] or []
            if not isinstance(items, list):
                raise _BadObject('items is not a list')
        except (_BadObject, KeyError, TypeError) as exc:
            raise _Unavailable('malformed pod list: %s' % exc) from None
        records = {}
        for pod in items:
            try:
                key, pod_rv = _identify(pod)
            except _BadObject as exc:
                LOG.warning('Skipping a listed pod: %s', exc)
                continue
            if self._is_ours(pod):
                records[key] = self._record(key, pod_rv, pod)
        self.sink.replace_pods(records)
        self._reported = {k: v for k, v in self._reported.items() if k in records}
        self._rv = rv
        self._note_established()
        self._unsynced = False
        self.sink.mark_synced(True)
        LOG.info('Listed %d %s of node %s at resource version %s', len(records), self.what,
                 self.node_name, rv)

    def _watch(self):
        read_timeout = self.watch_timeout + self.request_timeout[1]
        response = self._list(watch=True,
                              resource_version=self._rv, allow_watch_bookmarks=True,
                              timeout_seconds=self.watch_timeout,
                              _request_timeout=(self.request_timeout[0], read_timeout))
        self._note_established()
        with self._reading(response):
            for event in _events(response):
                if self._stop_event.is_set():
                    return
                self._handle(event)
                self._failures = 0
        self._failures = 0

    def _handle(self, event):
        kind = event.get('type')
        obj = event.get('object')
        if self.on_event is not None:
            self.on_event(kind)
        if not isinstance(obj, dict):
            LOG.warning('Ignoring a %s watch event without an object', kind)
            return
        if kind == 'ERROR':
            if obj.get('code') == 410:
                raise _Expired(obj.get('message'))
            raise _Unavailable('watch error %s: %s' % (obj.get('code'), obj.get('message')))
        if kind == 'BOOKMARK':
            with contextlib.suppress(_BadObject):
                self._rv = _resource_version(obj)
            return
        if kind not in ('ADDED', 'MODIFIED', 'DELETED'):
            LOG.warning('Ignoring a watch event of unknown type %r', kind)
            return
        try:
            key, rv = _identify(obj)
        except _BadObject as exc:
            LOG.warning('Skipping a %s event: %s', kind, exc)
            return
        if kind == 'DELETED' or not self._is_ours(obj):
            self.sink.drop_pod(key)
            self._reported.pop(key, None)
        else:
            self.sink.put_pod(key, self._record(key, rv, obj))
        self._rv = rv

    # Records ---------------------------------------------------------------------

    def _is_ours(self, pod):
        spec = pod.get('spec')
        return isinstance(spec, dict) and spec.get('nodeName') == self.node_name

    def _record(self, key, rv, pod):
        """The small plain dict the registry keeps for a pod."""
        meta = pod['metadata']
        annotations = meta.get('annotations')
        text = annotations.get(vifmod.ANNOTATION) if isinstance(annotations, dict) else None
        vifs, error = {}, None
        if text is not None:
            try:
                vifs = {ifname: v.to_dict()
                        for ifname, v in vifmod.parse_annotation(text).items()}
            except errors.InvalidVIF as exc:
                error = '%s: %s' % (exc.msg, exc.details) if exc.details else exc.msg
                self._report_bad_annotation(key, rv, error)
        if error is None:
            self._reported.pop(key, None)
        return {'uid': meta['uid'], 'vifs': vifs, 'error': error,
                'deleting': bool(meta.get('deletionTimestamp'))}

    def _report_bad_annotation(self, key, rv, error):
        # Relists replay the same version: log each bad version once, not once per relist.
        if self._reported.get(key) != rv:
            LOG.warning('Pod %s (resource version %s) has an unusable %s annotation: %s',
                        key, rv, vifmod.ANNOTATION, error)
            self._reported[key] = rv

    # Failure handling ----------------------------------------------------------------

    def _call(self, method, **kwargs):
        """Issue a request through the official client; return the raw response."""
        try:
            return method(_preload_content=False, **kwargs)
        except client.ApiException as exc:
            if exc.status == 410:
                raise _Expired('HTTP 410 %s' % exc.reason) from None
            raise _Unavailable('HTTP %s %s' % (exc.status, exc.reason)) from None
        except urllib3.exceptions.MaxRetryError as exc:
            raise _Unavailable(str(exc.reason)) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _Unavailable(str(exc) or type(exc).__name__) from None

    def _note_established(self):
        if self._restart_reason is not None:
            LOG.info('Watch re-established after %s', self._restart_reason)
            if self.on_restart is not None:
                self.on_restart(self._restart_reason)
            self._restart_reason = None
        self._down_since = None

    def _note_failure(self, reason, backoff):
        self._restart_reason = reason
        self._failures += 1
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
        if (self.unsynced_after is not None and not self._unsynced
                and now - self._down_since >= self.unsynced_after):
            LOG.warning('Kubernetes API unreachable for %.0f s; marking the pod table unsynced',
                        now - self._down_since)
            self.sink.mark_synced(False)
            self._unsynced = True
            self._rv = None
        if backoff:
            self._stop_event.wait(self._backoff_delay())

    def _backoff_delay(self):
        exponent = min(self._failures - 1, MAX_BACKOFF_EXPONENT)
        ceiling = min(self.backoff_max, self.backoff_initial * 2 ** exponent)
        # Jitter keeps a fleet of nodes from reconnecting in lockstep after an outage.
        return random.uniform(ceiling / 2, ceiling)

    # Interrupting a blocked read -----------------------------------------------------------

    @contextlib.contextmanager
    def _reading(self, response):
        with self._lock:
            self._response = response
            stopping = self._stop_event.is_set()
        try:
            if stopping:
                raise _Unavailable('stopping')
            yield
        finally:
            with self._lock:
                self._response = None
            if not response.isclosed():
                # Unread data left on it: the connection must not go back to the pool.
                response.close()
            response.release_conn()

    def _cut_on_stop(self):
        self._stop_event.wait()
        with self._lock:
            response = self._response
        if response is not None:
            # Unblocks the read in run(); errors mean it already finished with it.
            with contextlib.suppress(ValueError, RuntimeError, OSError):
                response.shutdown()


def _read_json(response):
    try:
        return json.loads(response.read())
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise _Unavailable(str(exc) or type(exc).__name__) from None
    except ValueError as exc:
        raise _Unavailable('response is not JSON: %s' % exc) from None


def _events(response):
    """Yield the decoded events of a watch stream, one JSON object per line."""
    pending = bytearray()
    try:
        for data in response.stream(amt=None):
            pending += data
            while (end := pending.find(b'\n')) >= 0:
                line = bytes(pending[:end])
                del pending[:end + 1]
                if line.strip():
                    yield _decode_event(line)
            if len(pending) > MAX_EVENT_BYTES:
                raise _Unavailable('watch event larger than %d bytes' % MAX_EVENT_BYTES)
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise _Unavailable('watch stream broken: %s' % (str(exc) or type(exc).__name__)) from None
    if pending.strip():
        yield _decode_event(bytes(pending))


def _decode_event(line):
    try:
        event = json.loads(line)
    except ValueError:
        raise _Unavailable('undecodable watch event %r' % line[:200]) from None
    if not isinstance(event, dict):
        raise _Unavailable('watch event is not an object: %r' % line[:200])
    return event


def _resource_version(obj):
    meta = obj.get('metadata') if isinstance(obj, dict) else None
    rv = meta.get('resourceVersion') if isinstance(meta, dict) else None
    if not isinstance(rv, str) or not rv:
        raise _BadObject('no metadata.resourceVersion')
    return rv


def _identify(pod):
    """Return ``("namespace/name", resourceVersion)``; raise _BadObject when unusable."""
    meta = pod.get('metadata') if isinstance(pod, dict) else None
    if not isinstance(meta, dict):
        raise _BadObject('object without metadata')
    missing = [f for f in ('namespace', 'name', 'uid')
               if not isinstance(meta.get(f), str) or not meta.get(f)]
    if missing:
        raise _BadObject('pod %s/%s lacks metadata.%s' % (meta.get('namespace'), meta.get('name'),
                                                          ', metadata.'.join(missing)))
    return '%s/%s' % (meta['namespace'], meta['name']), _resource_version(pod)
