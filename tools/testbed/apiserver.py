"""A wire-level stand-in for the Kubernetes API server, for tests and the demo.

It speaks enough of the REST list/watch protocol over HTTP/1.1 that the official
``kubernetes`` client runs unchanged against it: lists honouring field selectors
(on the fields kube-apiserver supports for the resource) and label selectors,
chunked watch streams that replay from a resourceVersion, ``410 Gone`` (an
``ERROR`` event, as the real server sends) once the history has been compacted,
``BOOKMARK`` events and ``timeoutSeconds``, and the metadata alone of lists
and watches that ask for it (``Accept: application/json;as=PartialObjectMetadata
[List];g=meta.k8s.io;v=v1``). It serves pods, Events and KuryrPort custom
resources (``openstack.org/v1``).

Its answers were checked against kube-apiserver 1.20.2 (``tests/k8s``), with
which it agrees on status codes, Status bodies, the 410 event, bookmarks (one
two seconds before a watch's timeout; ``bookmark_interval`` adds periodic ones,
as later releases send every minute), and resourceVersion semantics: a list at
``0`` or at a version the server has seen answers the current state, one newer
than the server's is refused (504), garbage is a 500; a restarted server
(:meth:`APIServer.restart`) has forgotten the history a watch could resume
from, as kube-apiserver's watch cache does.

Tests drive the state through the Python control methods (``create_pod``,
``set_vifs``, ``compact``, ``stop``/``start``, ``restart`` ...), which are
thread-safe.

Boundaries: one optional bearer token and no authorization, no admission,
defaulting or schema validation, no PUT/PATCH over HTTP, no graceful deletion
over HTTP, state in memory only. Bind it to loopback or to an address inside a
throwaway network namespace, never to anything reachable.
"""

import bisect
import collections
import contextlib
import copy
import datetime
import errno
import http.server
import itertools
import json
import re
import socket
import threading
import time
import typing
import urllib.parse
import uuid

from oslo_log import log as logging

from kuryr_cni import vif as vifmod

LOG = logging.getLogger(__name__)

MAX_BODY = 1024 * 1024
REQUEST_QUEUE_SIZE = 128       # socketserver's default backlog of 5 stalls bursts of clients
CONNECTION_TIMEOUT = 30.0      # a connection idle or stalled this long is dropped
MAX_CONNECTIONS = 512
JOIN_TIMEOUT = 5.0
NODE_LABEL = 'kuryr.openstack.org/nodeName'
PAUSE_IMAGE = 'registry.k8s.io/pause:3.9'
BOOKMARK_LEAD = 2.0            # seconds before a watch's timeout its bookmark is sent


_STOPPED = object()


# The field labels kube-apiserver 1.20 lets a field selector use, per resource.
COMMON_FIELDS = ('metadata.name', 'metadata.namespace')
POD_FIELDS = COMMON_FIELDS + ('spec.nodeName', 'spec.restartPolicy', 'spec.schedulerName',
                              'spec.serviceAccountName', 'status.phase', 'status.podIP',
                              'status.podIPs', 'status.nominatedNodeName')
EVENT_FIELDS = COMMON_FIELDS + tuple('involvedObject.' + f for f in (
    'kind', 'namespace', 'name', 'uid', 'apiVersion', 'resourceVersion', 'fieldPath')) + (
    'reason', 'reportingComponent', 'source', 'type')


class Resource(typing.NamedTuple):
    prefix: str          # '/api/v1' or '/apis/<group>/<version>'
    plural: str
    kind: str
    api_version: str
    fields: tuple = COMMON_FIELDS       # what field selectors may use

    @property
    def list_kind(self):
        return self.kind + 'List'


PODS = Resource('/api/v1', 'pods', 'Pod', 'v1', POD_FIELDS)
EVENTS = Resource('/api/v1', 'events', 'Event', 'v1', EVENT_FIELDS)
KURYRPORTS = Resource('/apis/openstack.org/v1', 'kuryrports', 'KuryrPort', 'openstack.org/v1')
RESOURCES = {r.plural: r for r in (PODS, EVENTS, KURYRPORTS)}


class Request(typing.NamedTuple):
    """One request the stand-in saw; ``query`` keeps the last value of each parameter."""

    method: str
    path: str
    query: dict
    headers: dict        # lower-cased names

    @property
    def is_watch(self):
        return _truthy(self.query.get('watch'))


class _Entry(typing.NamedTuple):
    """One change in the event log; ``obj`` is None for a deletion."""

    rv: int
    plural: str
    obj: dict | None
    prev: dict | None


class APIError(Exception):
    """An API error, answered over HTTP with a ``Status`` object; control methods raise it too."""

    def __init__(self, code, reason, message, details=None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self):
        return status_object(self.code, self.reason, self.message, self.details)


class _Gone(Exception):
    """A watch asked for history the event log no longer holds."""

    def __init__(self, since, horizon):
        super().__init__('too old resource version: %d (%d)' % (since, horizon))
        self.message = str(self)


def status_object(code, reason, message, details=None):
    """A failure ``Status`` as kube-apiserver writes it (no reason for a bare 500)."""
    status = {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure',
              'message': message}
    if reason is not None:
        status['reason'] = reason
    if details is not None:
        status['details'] = details
    status['code'] = code
    return status


def route(path):
    """Map a URL path to ``(resource, namespace, name)``, or None for paths not served."""
    for resource in RESOURCES.values():
        if not path.startswith(resource.prefix + '/'):
            continue
        parts = path[len(resource.prefix) + 1:].split('/')
        if parts == [resource.plural]:
            return resource, None, None
        if (len(parts) in (3, 4) and parts[0] == 'namespaces' and parts[1]
                and parts[2] == resource.plural and all(parts)):
            return resource, parts[1], parts[3] if len(parts) == 4 else None
    return None


class Selector:
    """A namespace, field selectors (``=``, ``==``, ``!=`` on the fields the resource
    supports) and label selectors (also ``in``, ``notin``, ``key`` and ``!key``)."""

    def __init__(self, resource, namespace=None, fields='', labels=''):
        self.namespace = namespace
        self.fields = _field_requirements(resource, fields)
        self.labels = [_label_requirement(term) for term in _split_terms(labels or '')]

    def matches(self, obj):
        meta = obj.get('metadata', {})
        if self.namespace is not None and meta.get('namespace') != self.namespace:
            return False
        for path, equal, value in self.fields:
            if (_field(obj, path) == value) != equal:
                return False
        labels = meta.get('labels') or {}
        return all(_label_matches(labels, *requirement) for requirement in self.labels)


def _field_requirements(resource, text):
    requirements = []
    for term in _split_terms(text or ''):
        for op in ('!=', '==', '='):
            key, found, value = term.partition(op)
            if found:
                break
        else:
            raise APIError(400, 'BadRequest', 'invalid field selector %r' % term)
        if key.strip() not in resource.fields:
            raise APIError(400, 'BadRequest', 'field label not supported: %s' % key.strip())
        requirements.append((key.strip(), op != '!=', value.strip()))
    return requirements


def _split_terms(text):
    """The comma-separated terms of a selector (commas inside ``( )`` belong to their set)."""
    terms, depth, start = [], 0, 0
    for i, char in enumerate(text + ','):
        depth += {'(': 1, ')': -1}.get(char, 0)
        if char == ',' and depth == 0:
            if text[start:i].strip():
                terms.append(text[start:i].strip())
            start = i + 1
    return terms


_SET_TERM = re.compile(r'^(\S+)\s+(in|notin)\s*\(([^()]*)\)$')
_LABEL_KEY = re.compile(r'^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?'
                        r'[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$')


def _label_requirement(term):
    """``(key, operator, values)``: ``=``, ``!=``, ``in``, ``notin``, ``exists`` or ``!``."""
    match = _SET_TERM.match(term)
    if match:
        key, op, values = match[1], match[2], {v.strip() for v in match[3].split(',')}
    elif term.startswith('!') and not term.startswith('!='):
        key, op, values = term[1:].strip(), '!', None
    else:
        for op in ('!=', '==', '='):
            key, found, value = term.partition(op)
            if found:
                key, op, values = key.strip(), '!=' if op == '!=' else '=', {value.strip()}
                break
        else:
            key, op, values = term, 'exists', None
    if not _LABEL_KEY.match(key):
        raise APIError(400, 'BadRequest', 'unable to parse requirement: invalid label key %r'
                       % key)
    return key, op, values


def _label_matches(labels, key, op, values):
    if op == 'exists':
        return key in labels
    if op == '!':
        return key not in labels
    if op in ('=', 'in'):
        return labels.get(key) in values
    # "!=" and "notin" match objects without the label too, as in Kubernetes.
    return labels.get(key) not in values


def _field(obj, path):
    value = obj
    for part in path.split('.'):
        if not isinstance(value, dict):
            return ''
        value = value.get(part)
    # Kubernetes compares a missing field as the empty string.
    return '' if value is None else str(value)


def _now():
    return datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')


def _truthy(value):
    return value in ('1', 'true', 'True')


def _parse_version(value):
    """None for "any version" ('' or '0'), else the int; garbage is a 500, as in 1.20."""
    if value in (None, '', '0'):
        return None
    if not value.isdigit():
        raise APIError(500, None, 'resourceVersion: Invalid value: "%s": strconv.ParseUint: '
                                  'parsing "%s": invalid syntax' % (value, value))
    return int(value)


def _parse_timeout(value):
    if value in (None, ''):
        return None
    try:
        seconds = int(value)
    except ValueError:
        raise APIError(400, 'BadRequest', 'strconv.ParseInt: parsing "%s": invalid syntax'
                       % value) from None
    return seconds if seconds > 0 else None


METADATA_GROUP_VERSION = 'meta.k8s.io/v1'
JSON = 'application/json'


def _representation(accept, resource, is_list):
    """What an ``Accept`` header asks of a list of ``resource`` (``is_list``) or of
    the objects of a watch: ``None`` for the objects themselves,
    ``'PartialObjectMetadata'`` (or ``...List``) for their metadata alone.

    As kube-apiserver 1.20 does: the first media type it can serve wins (a
    fallback after it is never used); a list asked for as one object is 406
    Not Acceptable, and a watch asking for lists gets an empty stream (the
    caller's part).
    """
    for media in (accept or JSON).split(','):
        kind, *params = [part.strip() for part in media.split(';')]
        options = dict(p.partition('=')[::2] for p in params)
        if kind not in (JSON, 'application/*', '*/*'):
            continue
        wanted = options.get('as')
        if wanted is None:
            return None
        if (options.get('g'), options.get('v')) != ('meta.k8s.io', 'v1') or \
                wanted not in ('PartialObjectMetadata', 'PartialObjectMetadataList'):
            continue
        if is_list and wanted == 'PartialObjectMetadata':
            raise APIError(406, 'NotAcceptable', 'you requested PartialObjectMetadata, but '
                           'the requested object is a list (*%s)' % (
                               'core.%sList' % resource.kind if resource.prefix == '/api/v1'
                               else 'unstructured.UnstructuredList'))
        return wanted
    raise APIError(406, 'NotAcceptable', 'only the following media types are accepted: '
                   'application/json, application/yaml, application/vnd.kubernetes.protobuf')


def _as_metadata(obj):
    """``obj`` as PartialObjectMetadata: its kind and metadata alone."""
    return {'kind': 'PartialObjectMetadata', 'apiVersion': METADATA_GROUP_VERSION,
            'metadata': obj['metadata']}


def _pod_object(namespace, name, node, annotations, uid, labels):
    spec = {'containers': [{'name': 'main', 'image': PAUSE_IMAGE}]}
    if node is not None:
        spec['nodeName'] = node
    return {'kind': 'Pod', 'apiVersion': 'v1',
            'metadata': {'name': name, 'namespace': namespace, 'uid': uid or str(uuid.uuid4()),
                         'creationTimestamp': _now(), 'labels': dict(labels or {}),
                         'annotations': dict(annotations or {})},
            'spec': spec,
            'status': {'phase': 'Pending'}}


def _kuryrport_object(namespace, name, node, spec, status, labels, uid):
    all_labels = {NODE_LABEL: node} if node is not None else {}
    all_labels.update(labels or {})
    return {'kind': KURYRPORTS.kind, 'apiVersion': KURYRPORTS.api_version,
            'metadata': {'name': name, 'namespace': namespace, 'uid': uid or str(uuid.uuid4()),
                         'creationTimestamp': _now(), 'labels': all_labels},
            'spec': copy.deepcopy(spec) if spec is not None else {'podUid': '', 'podStatic': False},
            'status': copy.deepcopy(status) if status is not None else {'vifs': {}}}


def _bookmark_object(resource, rv):
    """An empty object of ``resource`` carrying ``rv``, as kube-apiserver's bookmarks are."""
    obj = {'kind': resource.kind, 'apiVersion': resource.api_version,
           'metadata': {'resourceVersion': str(rv), 'creationTimestamp': None}}
    if resource is PODS:
        obj.update(spec={'containers': None}, status={})
    return obj


def _merge(target, changes):
    """Apply ``changes`` to ``target``; a None value removes the key (as a merge patch does)."""
    for key, value in changes.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value


class APIServer:
    """The stand-in: an in-memory store, its event log and a threaded HTTP/1.1 front.

    Stored objects are never mutated in place: every change stores a fresh
    object, so readers may serialise what they took under the lock after
    releasing it. Control methods return deep copies.
    """

    def __init__(self, host='127.0.0.1', port=0, *, sock=None, bookmark_interval=None,
                 expired_as='event', log_limit=10000, token=None):
        """Serve on ``host``/``port`` (0: ephemeral) or on an already bound ``sock``.

        A watch that allows bookmarks gets one two seconds before its timeout
        and, with ``bookmark_interval``, one every so many seconds. ``expired_as``
        picks how a watch from a compacted resourceVersion is refused:
        ``'event'`` (200 and an ERROR event, as the real server does) or
        ``'http'`` (an HTTP 410 response). ``log_limit`` bounds the event log;
        older history is compacted away. With ``token``, requests without
        ``Authorization: Bearer <token>`` get 401.
        """
        if expired_as not in ('event', 'http'):
            raise ValueError('expired_as must be "event" or "http"')
        self.bookmark_interval = bookmark_interval
        self.expired_as = expired_as
        self.token = token
        self._log_limit = max(2, log_limit)
        self._cond = threading.Condition()
        self._rv = 1
        self._horizon = self._rv         # the log holds every change after this resourceVersion
        self._objects = {}               # (plural, namespace, name) -> object
        self._log = []
        self._log_rvs = []
        self._requests = collections.deque(maxlen=10000)
        self._serving = False
        self._epoch = 0                  # bumped by stop(); open watch streams end on a change
        self._closed = False
        self._listener_down = False
        self._connections = {}           # socket -> handler thread
        self._conn_lock = threading.Lock()
        self._accept_thread = None
        if sock is None:
            family = socket.AF_INET6 if ':' in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        sock.listen(REQUEST_QUEUE_SIZE)
        self._listener = sock
        self.address = sock.getsockname()[:2]
        self.start()

    @property
    def url(self):
        host, port = self.address
        return 'http://%s:%d' % ('[%s]' % host if ':' in host else host, port)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # Lifecycle -------------------------------------------------------------------

    def start(self):
        """Serve again on the same address after :meth:`stop` (the store is kept)."""
        with self._cond:
            if self._closed:
                raise RuntimeError('the API stand-in is closed')
            if self._serving:
                return
            if self._listener_down:
                self._rebind()
                self._listener.listen(REQUEST_QUEUE_SIZE)
                self._listener_down = False
            self._serving = True
        self._accept_thread = threading.Thread(target=self._accept_loop, daemon=True,
                                               name='apiserver-accept')
        self._accept_thread.start()

    def _rebind(self):
        """Take the port back after stop(), on the same socket.

        Reusing the socket keeps it in the network namespace it was made in (the
        demo's). On Linux a listening socket shut down for reading loses an
        ephemeral port but keeps one bound explicitly, where bind() says EINVAL.
        """
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind(self.address)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise

    def stop(self):
        """Simulate an outage: refuse connections, cut open ones and end every watch."""
        with self._cond:
            if not self._serving:
                return
            self._serving = False
            self._epoch += 1
            self._cond.notify_all()
        with contextlib.suppress(OSError):
            # Wakes the blocked accept() and makes new connections be refused.
            self._listener.shutdown(socket.SHUT_RD)
        self._listener_down = True
        self._accept_thread.join(JOIN_TIMEOUT)
        with self._conn_lock:
            connections = dict(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for thread in connections.values():
            thread.join(JOIN_TIMEOUT)

    def close(self):
        self.stop()
        with self._cond:
            self._closed = True
        self._listener.close()

    # Control API for tests -----------------------------------------------------

    def create_pod(self, namespace, name, node, annotations=None, uid=None, labels=None):
        return self.create('pods', _pod_object(namespace, name, node, annotations, uid, labels))

    def update_pod(self, namespace, name, annotations=None, labels=None, node=None, phase=None):
        """Merge ``annotations``/``labels`` (a None value removes a key); MODIFIED."""
        def change(pod):
            meta = pod['metadata']
            _merge(meta.setdefault('annotations', {}), annotations or {})
            _merge(meta.setdefault('labels', {}), labels or {})
            if node is not None:
                pod['spec']['nodeName'] = node
            if phase is not None:
                pod.setdefault('status', {})['phase'] = phase
        return self._modify('pods', namespace, name, change)

    def set_vifs(self, namespace, name, vifs):
        """Write the VIF annotation: a dict as JSON, a str verbatim, None removes it."""
        text = vifs if vifs is None or isinstance(vifs, str) else json.dumps(vifs)
        return self.update_pod(namespace, name, annotations={vifmod.ANNOTATION: text})

    def delete_pod(self, namespace, name, grace_period=0):
        """Delete now (DELETED) or, with ``grace_period`` > 0, only mark it (MODIFIED)."""
        if grace_period > 0:
            def mark(pod):
                deadline = (datetime.datetime.now(datetime.timezone.utc)
                            + datetime.timedelta(seconds=grace_period))
                pod['metadata']['deletionTimestamp'] = deadline.strftime('%Y-%m-%dT%H:%M:%SZ')
                pod['metadata']['deletionGracePeriodSeconds'] = grace_period
            return self._modify('pods', namespace, name, mark)
        return self.delete('pods', namespace, name)

    def create_kuryrport(self, namespace, name, node, spec=None, status=None, labels=None,
                         uid=None):
        return self.create('kuryrports',
                           _kuryrport_object(namespace, name, node, spec, status, labels, uid))

    def update_kuryrport(self, namespace, name, spec=None, status=None, labels=None):
        """Replace ``spec`` and/or ``status`` wholesale, merge ``labels``; MODIFIED."""
        def change(port):
            if spec is not None:
                port['spec'] = copy.deepcopy(spec)
            if status is not None:
                port['status'] = copy.deepcopy(status)
            _merge(port['metadata'].setdefault('labels', {}), labels or {})
        return self._modify('kuryrports', namespace, name, change)

    def delete_kuryrport(self, namespace, name):
        return self.delete('kuryrports', namespace, name)

    def create(self, plural, obj):
        """Store a whole object (a plain dict with metadata.namespace and .name); ADDED."""
        obj = copy.deepcopy(obj)
        resource = RESOURCES[plural]
        obj.setdefault('kind', resource.kind)
        obj.setdefault('apiVersion', resource.api_version)
        meta = obj.setdefault('metadata', {})
        meta.setdefault('uid', str(uuid.uuid4()))
        meta.setdefault('creationTimestamp', _now())
        key = (plural, meta['namespace'], meta['name'])
        with self._cond:
            if key in self._objects:
                raise APIError(409, 'AlreadyExists',
                               '%s "%s" already exists' % (plural, meta['name']))
            return copy.deepcopy(self._commit(key, obj))

    def delete(self, plural, namespace, name):
        key = (plural, namespace, name)
        with self._cond:
            if key not in self._objects:
                raise _not_found(plural, name)
            return copy.deepcopy(self._commit(key, None))

    def get(self, namespace, name, plural='pods'):
        with self._cond:
            return copy.deepcopy(self._objects.get((plural, namespace, name)))

    def events(self):
        """The v1 Events clients have posted, oldest first."""
        with self._cond:
            found = [obj for (plural, _, _), obj in self._objects.items() if plural == 'events']
            found.sort(key=lambda e: int(e['metadata']['resourceVersion']))
            return copy.deepcopy(found)

    def requests(self):
        """Every request seen (the last 10000), oldest first."""
        with self._cond:
            return list(self._requests)

    def wait_for_request(self, predicate, timeout):
        """Block until a recorded request satisfies ``predicate``; return it, or None."""
        found = []

        def seen():
            found[:] = [r for r in self._requests if predicate(r)][:1]
            return bool(found)

        with self._cond:
            self._cond.wait_for(seen, timeout)
        return found[0] if found else None

    def clear_requests(self):
        with self._cond:
            self._requests.clear()

    @property
    def resource_version(self):
        with self._cond:
            return str(self._rv)

    def restart(self):
        """Stop and start again as kube-apiserver restarts: its watch cache starts anew.

        Watches resume only from the current resourceVersion; older ones get 410
        Gone, even for versions etcd still holds. (:meth:`stop` and :meth:`start`
        alone are an outage of this server while the cluster's history stays
        whole, as with several API servers behind a load balancer.)
        """
        self.stop()
        self.compact()
        self.start()

    def compact(self):
        """Forget the event log: watches from any older resourceVersion get 410 Gone."""
        with self._cond:
            self._log.clear()
            self._log_rvs.clear()
            self._horizon = self._rv
            self._cond.notify_all()

    # The store (callers hold self._cond) ----------------------------------------------

    def _modify(self, plural, namespace, name, change):
        key = (plural, namespace, name)
        with self._cond:
            current = self._objects.get(key)
            if current is None:
                raise _not_found(plural, name)
            obj = copy.deepcopy(current)
            change(obj)
            return copy.deepcopy(self._commit(key, obj))

    def _commit(self, key, obj):
        """Store ``obj`` (None deletes) under a new resourceVersion and log the change."""
        self._rv += 1
        prev = self._objects.get(key)
        if obj is None:
            final = copy.deepcopy(prev)
            final['metadata']['resourceVersion'] = str(self._rv)
            del self._objects[key]
            entry = _Entry(self._rv, key[0], None, final)
        else:
            obj['metadata']['resourceVersion'] = str(self._rv)
            self._objects[key] = final = obj
            entry = _Entry(self._rv, key[0], obj, prev)
        self._log.append(entry)
        self._log_rvs.append(entry.rv)
        if len(self._log) > self._log_limit:
            cut = len(self._log) // 2
            self._horizon = self._log_rvs[cut - 1]
            del self._log[:cut]
            del self._log_rvs[:cut]
        self._cond.notify_all()
        return final

    def _record(self, request):
        with self._cond:
            self._requests.append(request)
            self._cond.notify_all()

    def _list(self, resource, selector, version=None):
        """Not older than ``version``: the current state, unless ``version`` is in the future."""
        with self._cond:
            if version is not None and version > self._rv:
                raise APIError(504, 'Timeout', 'Timeout: Too large resource version: %d, current: '
                               '%d' % (version, self._rv),
                               {'causes': [{'reason': 'ResourceVersionTooLarge',
                                            'message': 'Too large resource version'}],
                                'retryAfterSeconds': 1})
            items = [obj for (plural, ns, name), obj in sorted(self._objects.items(),
                                                               key=lambda kv: kv[0])
                     if plural == resource.plural and selector.matches(obj)]
            rv = self._rv
        listed = {'kind': resource.list_kind, 'apiVersion': resource.api_version,
                  'metadata': {'resourceVersion': str(rv)}, 'items': items}
        if resource.prefix.startswith('/apis/'):
            # A custom resource list is unstructured: kube-apiserver writes its
            # keys in alphabetical order, metadata after items.
            listed = dict(sorted(listed.items()))
        return listed

    def _open_watch(self, resource, selector, since):
        """Return ``(initial events, cursor, epoch)``; raise _Gone for lost history."""
        with self._cond:
            if since is None:
                initial = [{'type': 'ADDED', 'object': obj}
                           for key, obj in sorted(self._objects.items(), key=lambda kv: kv[0])
                           if key[0] == resource.plural and selector.matches(obj)]
                return initial, self._rv, self._epoch
            if since < self._horizon:
                raise _Gone(since, self._horizon)
            return [], since, self._epoch

    def _follow(self, resource, selector, cursor, epoch, timeout, bookmarks):
        """Yield watch events after ``cursor`` until timeout, stop() or lost history."""
        now = time.monotonic()
        start = cursor
        deadline = now + timeout if timeout else None
        # kube-apiserver 1.20 sends one bookmark BOOKMARK_LEAD seconds before the
        # watch's end, and only when it carries news: a version past the watch's
        # start. (Later releases also send one a minute; ``bookmark_interval`` here
        # sends them unconditionally, which tests use to see a stream is open.)
        last_bookmark = deadline - BOOKMARK_LEAD if bookmarks and deadline else None
        periodic = bookmarks and self.bookmark_interval
        next_bookmark = now + self.bookmark_interval if periodic else None
        while True:
            due = [t for t in (next_bookmark, last_bookmark) if t is not None]
            entries, gone = self._wait_for_entries(cursor, epoch, deadline,
                                                   min(due) if due else None)
            if entries is None:
                return
            if entries is _STOPPED:
                # An outage, not a graceful end: the client must see a broken stream.
                raise ConnectionAbortedError('the API stand-in was stopped')
            if gone:
                yield {'type': 'ERROR', 'object': status_object(410, 'Expired', gone.message)}
                return
            for entry in entries:
                event = self._visible(entry, resource, selector)
                if event is not None:
                    yield event
            if entries:
                cursor = entries[-1].rv
            now = time.monotonic()
            bookmark = False
            if last_bookmark is not None and now >= last_bookmark:
                bookmark, last_bookmark = cursor > start, None
            if next_bookmark is not None and now >= next_bookmark:
                bookmark, next_bookmark = True, now + self.bookmark_interval
            if bookmark:
                yield {'type': 'BOOKMARK', 'object': _bookmark_object(resource, cursor)}

    def _wait_for_entries(self, cursor, epoch, deadline, next_bookmark):
        """Block until there is news.

        Returns ``(entries, None)``, ``([], _Gone)`` for lost history, ``(None, None)``
        at the timeout and ``(_STOPPED, None)`` when stop() was called.
        """
        with self._cond:
            while True:
                if self._epoch != epoch or not self._serving:
                    return _STOPPED, None
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return None, None
                if cursor < self._horizon:
                    return [], _Gone(cursor, self._horizon)
                start = bisect.bisect_right(self._log_rvs, cursor)
                if start < len(self._log):
                    return self._log[start:], None
                if next_bookmark is not None and now >= next_bookmark:
                    return [], None
                waits = [t - now for t in (deadline, next_bookmark) if t is not None]
                self._cond.wait(min(waits) if waits else None)

    @staticmethod
    def _visible(entry, resource, selector):
        """The event a watcher with this selector sees for ``entry``, or None."""
        if entry.plural != resource.plural:
            return None
        now = entry.obj is not None and selector.matches(entry.obj)
        before = entry.prev is not None and selector.matches(entry.prev)
        if now:
            return {'type': 'MODIFIED' if before else 'ADDED', 'object': entry.obj}
        if before:
            # Deleted, or changed so that it no longer matches: gone for this watcher.
            return {'type': 'DELETED', 'object': entry.obj or entry.prev}
        return None

    # Connections -----------------------------------------------------------------------

    def _accept_loop(self):
        while True:
            try:
                conn, peer = self._listener.accept()
            except OSError as exc:
                with self._cond:
                    if not self._serving:
                        return
                    LOG.warning('API stand-in: accept failed: %s', exc)
                    self._cond.wait(0.1)     # do not spin on a persistent error (EMFILE)
                continue
            with self._conn_lock:
                if len(self._connections) >= MAX_CONNECTIONS:
                    conn.close()
                    continue
                thread = threading.Thread(target=self._serve_connection, args=(conn, peer),
                                          daemon=True, name='apiserver-conn')
                self._connections[conn] = thread
            thread.start()

    def _serve_connection(self, conn, peer):
        try:
            _Handler(conn, peer, self)
        except OSError as exc:
            # A client that went away, or stop() cutting the connection.
            LOG.debug('API stand-in: connection from %s ended: %s', peer, exc)
        except Exception:
            LOG.exception('API stand-in: request from %s failed', peer)
        finally:
            with self._conn_lock:
                self._connections.pop(conn, None)
            with contextlib.suppress(OSError):
                conn.close()


def _not_found(plural, name):
    resource = RESOURCES[plural]
    details = {'name': name, 'kind': plural}
    qualified = plural
    if resource.prefix != '/api/v1':
        details['group'] = resource.prefix.split('/')[2]
        qualified = '%s.%s' % (plural, details['group'])
    return APIError(404, 'NotFound', '%s "%s" not found' % (qualified, name), details)


class _Handler(http.server.BaseHTTPRequestHandler):
    """One HTTP/1.1 connection; ``self.server`` is the :class:`APIServer`."""

    protocol_version = 'HTTP/1.1'
    server_version = 'kuryr-cni-apiserver-standin'
    timeout = CONNECTION_TIMEOUT

    def do_GET(self):
        self._handle('GET')

    def do_POST(self):
        self._handle('POST')

    def do_DELETE(self):
        self._handle('DELETE')

    def do_PUT(self):
        self._handle('PUT')

    def do_PATCH(self):
        self._handle('PATCH')

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        LOG.debug('API stand-in: %s - %s', self.address_string(), format % args)

    def _handle(self, method):
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[-1] for k, v in
                 urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.server._record(Request(method, url.path, query, headers))
        try:
            raw = self._read_body()
            target = route(url.path)
            self._authenticate(headers.get('authorization', ''))
            if target is None:
                raise APIError(404, 'NotFound', 'the server could not find the requested resource',
                               {})
            resource, namespace, name = target
            if method == 'GET' and name is None and _truthy(query.get('watch')):
                self._watch(resource, namespace, query)
                return
            code, obj = self._dispatch(method, resource, namespace, name, query, raw)
        except APIError as failure:
            code, obj = failure.code, failure.status()
        self._send_json(code, obj)

    def _authenticate(self, authorization):
        scheme, _, token = authorization.partition(' ')
        if self.server.token is not None and (scheme.lower() != 'bearer'
                                              or token.strip() != self.server.token):
            raise APIError(401, 'Unauthorized', 'Unauthorized')

    def _read_body(self):
        """Read the whole body (even one we ignore, to keep the connection in step)."""
        if 'chunked' in self.headers.get('Transfer-Encoding', '').lower():
            self.close_connection = True
            raise APIError(411, 'LengthRequired', 'a Content-Length is required')
        try:
            length = int(self.headers.get('Content-Length') or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            raise APIError(400, 'BadRequest', 'invalid Content-Length')
        if length > MAX_BODY:
            self.close_connection = True
            raise APIError(413, 'RequestEntityTooLarge',
                           'request body larger than %d bytes' % MAX_BODY)
        raw = self.rfile.read(length) if length else b''
        if len(raw) < length:
            raise ConnectionError('client sent a short body')
        return raw

    def _dispatch(self, method, resource, namespace, name, query, raw):
        api = self.server
        if method == 'GET' and name is None:
            selector = Selector(resource, namespace, query.get('fieldSelector'),
                                query.get('labelSelector'))
            listed = api._list(resource, selector, _parse_version(query.get('resourceVersion')))
            if _representation(self.headers.get('Accept'), resource, True) is not None:
                listed = {'kind': 'PartialObjectMetadataList',
                          'apiVersion': METADATA_GROUP_VERSION, 'metadata': listed['metadata'],
                          'items': [_as_metadata(obj) for obj in listed['items']]}
            return 200, listed
        if method == 'GET':
            obj = api.get(namespace, name, resource.plural)
            if obj is None:
                raise _not_found(resource.plural, name)
            return 200, obj
        if method == 'POST' and name is None and namespace is not None:
            return 201, api.create(resource.plural, _new_object(resource, namespace, raw))
        if method == 'DELETE' and name is not None:
            return 200, api.delete(resource.plural, namespace, name)
        raise APIError(405, 'MethodNotAllowed',
                       'the server does not allow this method on the requested resource', {})

    def _watch(self, resource, namespace, query):
        api = self.server
        selector = Selector(resource, namespace, query.get('fieldSelector'),
                            query.get('labelSelector'))
        since = _parse_version(query.get('resourceVersion'))
        timeout = _parse_timeout(query.get('timeoutSeconds'))
        bookmarks = _truthy(query.get('allowWatchBookmarks'))
        metadata_only = _representation(self.headers.get('Accept'), resource, False)
        try:
            initial, cursor, epoch = api._open_watch(resource, selector, since)
        except _Gone as gone:
            if api.expired_as == 'http':
                raise APIError(410, 'Expired', gone.message) from None
            events = iter([{'type': 'ERROR', 'object': status_object(410, 'Expired',
                                                                     gone.message)}])
        else:
            events = itertools.chain(initial, api._follow(resource, selector, cursor, epoch,
                                                          timeout, bookmarks))
        self.send_response(200)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Transfer-Encoding', 'chunked')
        self.end_headers()
        for event in events:
            if metadata_only == 'PartialObjectMetadataList':
                break           # kube-apiserver cannot encode an object as a list: it ends
            if metadata_only and event['type'] != 'ERROR':
                event = dict(event, object=_as_metadata(event['object']))
            data = json.dumps(event).encode() + b'\n'
            # One event per chunk: clients read chunk by chunk and must not wait for more.
            self.wfile.write(b'%x\r\n%s\r\n' % (len(data), data))
        self.wfile.write(b'0\r\n\r\n')

    def _send_json(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(data)))
        if self.close_connection:
            self.send_header('Connection', 'close')
        self.end_headers()
        self.wfile.write(data)


def _new_object(resource, namespace, raw):
    """Validate a POSTed object enough to store it."""
    try:
        obj = json.loads(raw or b'null')
    except ValueError:
        raise APIError(400, 'BadRequest', 'request body is not JSON') from None
    if not isinstance(obj, dict) or not isinstance(obj.get('metadata', {}), dict):
        raise APIError(400, 'BadRequest', 'request body must be an object with metadata')
    meta = obj.setdefault('metadata', {})
    if meta.get('namespace') not in (None, namespace):
        raise APIError(400, 'BadRequest', 'the namespace of the provided object does not '
                                          'match the namespace sent on the request')
    meta['namespace'] = namespace
    if not meta.get('name'):
        if not meta.get('generateName'):
            raise APIError(422, 'Invalid', 'metadata.name or metadata.generateName is required')
        meta['name'] = meta['generateName'] + uuid.uuid4().hex[:5]
    for key in ('uid', 'resourceVersion', 'creationTimestamp'):
        meta.pop(key, None)
    obj['kind'], obj['apiVersion'] = resource.kind, resource.api_version
    return obj
