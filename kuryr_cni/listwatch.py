"""One list+watch: keeps a sink in step with the objects one API request selects.

The one job: list, then watch from the list's resourceVersion, and turn what
arrives into records through a *source* (:mod:`kuryr_cni.vifsource`) that
knows which objects to ask for and what to keep of each. The Kubernetes side
is the same for every source:

- a watch that ends (``timeoutSeconds``, a broken stream, an outage) is
  resumed from the last resourceVersion seen: an event's or a bookmark's. No
  relist, except on 410 Gone, which relists at once;
- lists are served from the API server's watch cache, never from etcd: the
  first asks for ``resourceVersion=0`` (any version), a relist for the last
  version seen (that one or newer, so the records never go back in time). A
  list of one node's pods from etcd reads every pod of the cluster, so its
  cost grows with the cluster, the cache's with the node (measured in
  ``doc/source/scale.rst``). Only when the server says it cannot serve that
  version (410, or "too large" after an etcd restore) does the next list ask
  for the latest, from etcd;
- failures back off with jitter; the backoff starts over once the server
  answers again (even with an error, after it was unreachable: kube-apiserver
  1.20 answers 403 for a moment after a restart, before its RBAC authorizer
  has read the roles);
- a backoff after an unreachable or failing server (not one over a limit) is
  cut short when a CNI request waits for an object not seen yet (``awaited``):
  a pod created as soon as the server is back is then read at once, not up
  to ``backoff_max`` later. At most one early retry per :data:`EARLY_FIRST`
  seconds, the spacing jittered and doubling while they fail, so a fleet of
  nodes retries early no faster than pods are started on it (the model in
  ``doc/source/scale.rst``);
- the sink is unsynced from the first failure until a list or a resumed
  watch is answered, so ``/ready`` tells when the records may be stale;
- :meth:`ListWatch.stop` cuts an open watch stream, so it returns promptly.

Every byte read is bounded, so a hostile or broken API server can neither grow
the watcher nor hold it for ever (figures in ``doc/source/scale.rst``):

- a list body, and a watch stream, are decoded as they arrive (ijson's
  events), one object at a time, each turned into its record at once: never
  the whole body in memory. A list may be at most ``list_max_bytes`` long,
  hold at most :data:`MAX_OBJECTS` objects, and arrive within
  ``list_timeout`` seconds in all (not per read: a server trickling a byte
  at a time is cut at that deadline);
- one object (of a list) or event (of a watch) is built only within the
  bounds on one object: :data:`MAX_EVENT_BYTES`, :data:`MAX_OBJECT_VALUES`
  JSON values (counted as parsed: its structure, whatever its strings hold)
  and :data:`MAX_DEPTH` levels, which bounds what decoding it costs. One
  past them is no fault of the server's, and must not stop the feed for the
  others: it is read on for its identity alone (:data:`IDENTITY` and the
  source's ``keep``), becomes the source's record of an object too large to
  read, is logged once per version and reported through ``on_skip``; the
  feed moves past its version. Only one JSON string over
  :data:`MAX_TOKEN_BYTES`, which the parser would hold whole, or one object
  over :data:`MAX_SKIPPED_BYTES`, more than any real server sends, is an
  overrun;
- a watch stream is cut once it runs past the ``timeoutSeconds`` it asked
  for by as much again (a minute at most: the read timeout), however busy;
- the records a watch adds count against :data:`MAX_OBJECTS` too.

A server past a limit is an :class:`Overrun`: logged once (until it answers
within limits again), reported through ``on_limit`` (a metric, and ``/ready``
names it), and backed off from like any failure, the backoff growing while it
persists.

Bookmarks are honoured but never relied on: kube-apiserver 1.20 sends them
only in the last two seconds before a watch's timeout.

Boundaries: requests go through the official client, but the JSON is read
here (deserialising every object into model classes is slow) and checked at
this edge; an object without namespace, name, uid or resourceVersion is
skipped, never an exception. Errors are reported without what a request
carried: an exception raised while sending it may quote its headers, and
with them the bearer token. No decision about attachments is taken here.
"""

import contextlib
import random
import threading
import time

import ijson
from kubernetes import client
from oslo_log import log as logging
import urllib3

from kuryr_cni import apiclient

LOG = apiclient.redacting(logging.getLogger(__name__))

# The bounds on one object (of a list) or event (of a watch) built in memory:
# its bytes, its JSON values (containers and scalars, counted as parsed, so a
# string is one whatever it holds: what building it costs, ~100 bytes each at
# worst, as {} and [] are; a 1.5 MiB pod holds ~80k) and its nesting. One past
# them is read on for its identity alone (IDENTITY and the source's ``keep``).
MAX_EVENT_BYTES = 4 * 1024 * 1024
MAX_OBJECT_VALUES = 256 * 1024
MAX_DEPTH = 64                      # a pod nests ~15 levels deep (its managedFields)
# One JSON string, which the parser holds whole: etcd holds objects of at
# most 1.5 MiB, and a pod's metadata (what is read of pods) at most 256 KiB of
# annotations, so a longer one is garbage, and the answer holding it is cut.
MAX_TOKEN_BYTES = MAX_EVENT_BYTES
# One object read for its identity alone: more than a real server sends (1.5
# MiB in etcd, at most six times that as JSON, every byte escaped).
MAX_SKIPPED_BYTES = 4 * MAX_EVENT_BYTES
# What is kept of an object past the bounds: enough to key, version and place it.
IDENTITY = (('metadata', 'namespace'), ('metadata', 'name'), ('metadata', 'uid'),
            ('metadata', 'resourceVersion'), ('metadata', 'deletionTimestamp'))
# Objects one list+watch keeps: kubelet runs at most max-pods (110 by
# default, 250 on large nodes) pods; terminated pods keep their node, and
# the pod GC lets 12,500 of them pile up cluster-wide before it acts.
MAX_OBJECTS = 10000
LIST_MAX_BYTES = 64 * 1024 * 1024   # [kubernetes] list_max_bytes; its reasoning in scale.rst
LIST_TIMEOUT = 120                  # [kubernetes] list_timeout, seconds for a whole list
READ_SIZE = 64 * 1024               # bytes asked of the socket at a time
MAX_BACKOFF_EXPONENT = 16
# Early retries (a CNI request waits for an object not seen yet): a backoff
# asks ``awaited`` every EARLY_POLL seconds; early retries are at least
# EARLY_FIRST seconds apart, twice that after each one that failed (up to
# backoff_max), jittered by up to half as much again.
EARLY_POLL = 0.25
EARLY_FIRST = 1.0

# The limits an API server can exceed (the metric's label values).
LIMITS = ('list_bytes', 'list_time', 'object_size', 'object_count', 'watch_time')
# The watch event types kube-apiserver sends; any other is counted as 'other'.
EVENT_TYPES = ('ADDED', 'MODIFIED', 'DELETED', 'BOOKMARK', 'ERROR')
# Why an object was skipped (the metric's label values): past the bounds on
# one object (read for its identity alone), or lacking what identifies it.
SKIPS = ('too_large', 'unusable')


class _Expired(Exception):
    """The API server no longer holds our resourceVersion: relist."""


class _Unavailable(Exception):
    """A request or a stream failed: back off, then resume from the last resourceVersion.

    ``answered``: the server answered with an error, rather than not at all.
    """

    def __init__(self, message, answered=False):
        # Whatever the server sent that it quotes, the token stays out of the logs.
        super().__init__(apiclient.clip(message))
        self.answered = answered


class Overrun(_Unavailable):
    """The API server sent more, or for longer, than a limit allows.

    ``limit`` is one of :data:`LIMITS`.
    """

    def __init__(self, limit, message):
        super().__init__(message, answered=True)
        self.limit = limit


class _BadObject(Exception):
    """An API object lacking what we need to use it."""


class ListWatch:
    """Feeds ``sink`` from a list+watch of the objects ``source`` selects.

    ``source`` has ``what`` (the watched objects, in words, for the logs),
    ``request(query, timeout)`` (a list, or a watch with ``watch`` in the
    API's ``query``, sent by :func:`kuryr_cni.apirequest.send` with urllib3's
    ``timeout``: the raw response), ``record(obj, too_large)`` (the record to keep of an
    object, None when it is not this node's; ``too_large`` says why only its
    identity was read, else None) and optionally ``keep`` (the paths, besides
    :data:`IDENTITY`, that ``record`` reads of an object too large to read).
    A record's ``error``, when it has one, is logged once per version of the
    object.

    ``sink`` has ``replace_pods(records)``, ``put_pod(key, record)``,
    ``drop_pod(key)`` and ``mark_synced(bool)``; records are keyed
    ``"namespace/name"``; an event whose record equals the one last written
    (a pod's status changed) writes nothing. ``on_restart(reason)`` is
    called each time the list or watch is answered again after a failure
    (``reason``: ``'error'`` or ``'expired'``), ``on_event(type)`` for every
    watch event, ``on_activity()`` for every list and every event,
    ``awaited()`` says whether a request waits for an object this list+watch
    has not delivered (None: none ever does): asked while backing off.
    ``on_limit(limit, message)`` each time the server exceeds a limit (an
    :class:`Overrun`), ``on_limit(None, None)`` once it answers within
    limits again, and ``on_skip(reason)`` for each object skipped (one of
    :data:`SKIPS`). ``on_event`` gets the event's type if kube-apiserver
    sends such (:data:`EVENT_TYPES`), else ``'other'``: it becomes a metric
    label, which must not grow with what a server makes up.
    Exceptions raised by the sink or the callbacks are not caught: without
    its registry the watcher has nothing to do, and its process manager
    restarts it.
    """

    def __init__(self, source, sink, *, watch_timeout=300, request_timeout=(10, 60),
                 backoff_max=30, backoff_initial=0.5, on_restart=None, on_event=None,
                 on_activity=None, on_limit=None, on_skip=None, awaited=None,
                 list_max_bytes=LIST_MAX_BYTES,
                 list_timeout=LIST_TIMEOUT, max_objects=MAX_OBJECTS):
        """``request_timeout`` is (connect, read) seconds for the list; a watch
        may stay silent for ``watch_timeout`` plus that read timeout, and
        lasts that long at most. A list lasts ``list_timeout`` seconds at
        most, and its body is at most ``list_max_bytes`` long.
        """
        if isinstance(request_timeout, (int, float)):
            request_timeout = (request_timeout, request_timeout)
        self.source = source
        self.sink = sink
        self.watch_timeout = max(1, int(watch_timeout))
        self.request_timeout = tuple(request_timeout)
        self.backoff_max = backoff_max
        self.backoff_initial = min(backoff_initial, backoff_max)
        self.on_restart = on_restart
        self.on_event = on_event
        self.on_activity = on_activity
        self.on_limit = on_limit
        self.on_skip = on_skip
        self.awaited = awaited
        self._keep = IDENTITY + tuple(getattr(source, 'keep', ()))
        self.list_max_bytes = list_max_bytes
        self.list_timeout = list_timeout
        self.max_objects = max_objects
        # The records in the sink, as last written: against max_objects, and so that
        # an event changing nothing they hold (a pod's status) writes nothing.
        self._written = {}
        self._overruns = set()        # limits exceeded since the server last kept within them
        self._skips = 0               # objects skipped in the list or watch being read
        self._rv = None               # where the watch resumes; None: relist first
        self._list_rv = '0'           # what the next list asks for ('': the latest, from etcd)
        self._failures = 0            # consecutive failures since the API last answered
        self._unreachable = False     # whether the last failure got no answer at all
        self._expired_in_a_row = 0    # 410s with no event between them
        self._restart_reason = None
        self._early_spacing = EARLY_FIRST   # between early retries, doubling while they fail
        self._early_not_before = 0.0        # time.monotonic() of the next early retry allowed
        self._synced = False
        self._reported = {}           # key -> resourceVersion whose error was logged
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
        LOG.info('Watching %s', self.source.what)
        while not stop_event.is_set():
            try:
                if self._rv is None:
                    self._relist()
                self._watch()
            except _Expired as exc:
                self._recover_from_expiry(exc)
            except Overrun as exc:
                if stop_event.is_set():
                    break
                self._recover_from_overrun(exc)
            except _Unavailable as exc:
                if stop_event.is_set():
                    break
                self._recover_from_failure(exc)
        LOG.info('Stopped watching %s', self.source.what)

    def stop(self):
        """Ask :meth:`run` to return; safe from any thread."""
        self._stop_event.set()

    # Steps -----------------------------------------------------------------------

    def _relist(self):
        query = {'resourceVersion': self._list_rv} if self._list_rv else {}
        response = self._call(query, self.request_timeout)
        records = {}
        self._skips = 0
        late = Overrun('list_time', 'the list of %s took longer than %d s'
                       % (self.source.what, self.list_timeout))
        with self._reading(response, time.monotonic() + self.list_timeout, late):
            listing = _Listing(response, self.list_max_bytes, self.source.what, self._keep)
            for obj in listing.objects():
                try:
                    key, obj_rv = _identify(obj)
                except _BadObject as exc:
                    self._skipped('Skipping one of the %s listed: %s', self.source.what, exc)
                    continue
                record = self._record(key, obj_rv, obj)
                if record is not None:
                    records[key] = record
                    if len(records) > self.max_objects:
                        raise Overrun('object_count', 'the list of %s holds more than %d of '
                                      'them' % (self.source.what, self.max_objects))
        rv = listing.resource_version
        if rv is None:
            raise _Unavailable('malformed list of %s: no metadata.resourceVersion'
                               % self.source.what)
        self.sink.replace_pods(records)
        self._written = dict(records)
        self._reported = {k: v for k, v in self._reported.items() if k in records}
        self._rv = rv
        self._note_within_limits()
        self._note_answered()
        if self.on_activity is not None:
            self.on_activity()
        LOG.info('Listed %d %s at resource version %s%s', len(records), self.source.what, rv,
                 ' (%d skipped)' % self._skips if self._skips else '')

    def _watch(self):
        read_timeout = self.watch_timeout + self.request_timeout[1]
        response = self._call({'watch': True, 'resourceVersion': self._rv,
                               'allowWatchBookmarks': True, 'timeoutSeconds': self.watch_timeout},
                              (self.request_timeout[0], read_timeout))
        self._note_answered()
        self._skips = 0
        # kube-apiserver ends a watch at its timeoutSeconds; one still streaming
        # long after (twice that, or a minute more) is cut, however busy it is.
        grace = min(self.request_timeout[1], self.watch_timeout)
        late = Overrun('watch_time', 'the watch of %s went on %d s past the %d s it asked for'
                       % (self.source.what, grace, self.watch_timeout))
        with self._reading(response, time.monotonic() + self.watch_timeout + grace, late):
            for event in _events(response, self._keep):
                if self._stop_event.is_set():
                    return
                self._handle(event)
        self._expired_in_a_row = 0      # ended at its timeout: our version was still served
        self._note_within_limits()

    def _handle(self, event):
        kind = event.get('type')
        obj = event.get('object')
        if self.on_event is not None:
            # A label value: only the types that exist, or the metric grows without bound.
            self.on_event(kind if kind in EVENT_TYPES else 'other')
        if self.on_activity is not None:
            self.on_activity()
        if not isinstance(obj, dict):
            self._skipped('Ignoring a %s watch event without an object', apiclient.clip(kind))
            return
        if kind == 'ERROR':
            if obj.get('code') == 410:
                raise _Expired(apiclient.clip(obj.get('message')))
            raise _Unavailable('watch error %s: %s' % (obj.get('code'),
                                                       apiclient.clip(obj.get('message'))))
        self._expired_in_a_row = 0
        if kind == 'BOOKMARK':
            with contextlib.suppress(_BadObject):
                self._rv = _resource_version(obj)
            return
        if kind not in ('ADDED', 'MODIFIED', 'DELETED'):
            self._skipped('Ignoring a watch event of unknown type %r', apiclient.clip(kind))
            return
        try:
            key, rv = _identify(obj)
        except _BadObject as exc:
            self._skipped('Skipping a %s event: %s', kind, exc)
            return
        if isinstance(event, _Partial):
            obj = _Partial(obj, event.why)
        record = None if kind == 'DELETED' else self._record(key, rv, obj)
        if record is None:
            self.sink.drop_pod(key)
            self._written.pop(key, None)
            self._reported.pop(key, None)
        elif record != self._written.get(key):
            if key not in self._written and len(self._written) >= self.max_objects:
                raise Overrun('object_count', 'the watch of %s would make them more than %d'
                              % (self.source.what, self.max_objects))
            self.sink.put_pod(key, record)
            self._written[key] = record
        self._rv = rv

    def _skipped(self, message, *args):
        """Log the first object skipped in a list or watch; the rest at debug level.

        A server sending nothing but unusable objects must not flood the log.
        """
        self._skips += 1
        if self.on_skip is not None:
            self.on_skip('unusable')
        if self._skips == 1:
            LOG.warning(message + ' (the next ones of this answer are logged at debug level)',
                        *args)
        else:
            LOG.debug(message, *args)

    def _record(self, key, rv, obj):
        """The source's record of ``obj``; of its identity alone when it is a
        :class:`_Partial` (past the bounds: skipped, counted, logged once)."""
        too_large = getattr(obj, 'why', None)
        if too_large is not None and self.on_skip is not None:
            self.on_skip('too_large')
        record = self.source.record(obj, too_large)
        error = record.get('error') if record is not None else None
        if error is None and too_large is None:
            self._reported.pop(key, None)
        elif self._reported.get(key) != rv:
            # Relists replay the same version: log each bad version once, not once per relist.
            if too_large is not None:
                LOG.warning('Skipping %s (resource version %s), %s: only its identity was '
                            'read%s', key, rv, too_large, ' (%s)' % error if error else '')
            else:
                LOG.warning('Ignoring the VIFs of %s (resource version %s): %s', key, rv, error)
            self._reported[key] = rv
        return record

    # Failure handling ----------------------------------------------------------------

    def _recover_from_expiry(self, exc):
        if self._rv is None:
            LOG.info('The API server cannot list %s at resource version %s (%s); '
                     'listing the latest', self.source.what, self._list_rv, exc)
            self._list_rv = ''
        else:
            LOG.info('Resource version %s of %s expired (%s); relisting', self._rv,
                     self.source.what, exc)
            self._list_rv, self._rv = self._rv, None
        self._expired_in_a_row += 1
        # Once at once: the server answered, the history is simply gone.
        self._note_failure('expired', backoff=self._expired_in_a_row > 1)

    def _recover_from_failure(self, exc):
        if exc.answered and self._unreachable:
            # Back after an outage, though refusing for now (kube-apiserver 1.20
            # answers 403 until its RBAC authorizer has read the roles): the
            # backoff built up while it was unreachable no longer applies.
            self._failures = 0
        self._unreachable = not exc.answered
        self._note_failure('error', backoff=True, early=True,
                           why='Kubernetes API unavailable for the watch of %s (%s)'
                           % (self.source.what, exc))

    def _recover_from_overrun(self, exc):
        if exc.limit not in self._overruns:
            LOG.warning('The Kubernetes API server exceeded a limit of the watcher: %s; backing '
                        'off (logged once, until it answers within its limits)', exc)
        else:
            LOG.debug('The API server exceeded a limit again: %s', exc)
        self._overruns.add(exc.limit)
        if self.on_limit is not None:
            self.on_limit(exc.limit, str(exc))
        self._note_failure('error', backoff=True)

    def _note_within_limits(self):
        """A list, or a watch to its end, kept within every limit."""
        if not self._overruns:
            return
        LOG.info('The API server answers the watch of %s within its limits again',
                 self.source.what)
        self._overruns.clear()
        self._failures = 0
        if self.on_limit is not None:
            self.on_limit(None, None)

    def _call(self, query, timeout):
        """Issue the source's request; return the raw response."""
        try:
            return self.source.request(query, timeout)
        except client.ApiException as exc:
            if exc.status == 410 or _too_large(apiclient.error_status(exc)):
                raise _Expired(apiclient.describe_error(exc)) from None
            raise _Unavailable(apiclient.describe_error(exc), answered=True) from None
        except Exception as exc:
            # Whatever it is (urllib3's ValueError for a header with a newline
            # included), the loop goes on, and the token stays out of the logs.
            raise _Unavailable(apiclient.describe_error(exc)) from None

    def _note_answered(self):
        """The API server answered: back to a clean slate (the backoff too, unless it
        exceeds a limit: that grows the backoff until it answers within limits)."""
        if not self._overruns:
            self._failures = 0
        self._unreachable = False
        self._early_spacing = EARLY_FIRST
        if self._restart_reason is not None:
            LOG.info('Watch of %s re-established after %s', self.source.what,
                     self._restart_reason)
            if self.on_restart is not None:
                self.on_restart(self._restart_reason)
            self._restart_reason = None
        if not self._synced:
            self._synced = True
            self.sink.mark_synced(True)

    def _note_failure(self, reason, backoff, early=False, why=None):
        """Count a failure and back off; ``early``: the backoff may be cut short for an
        awaited object; ``why`` is logged, with the backoff, as a warning."""
        self._restart_reason = reason
        self._failures += 1
        if self._synced:
            # From the first failure: the records may miss what happens meanwhile.
            self._synced = False
            self.sink.mark_synced(False)
        delay = self._backoff_delay() if backoff else 0
        if why is not None:
            LOG.warning('%s; retrying in %.1f s', why, delay)
        if not backoff:
            return
        if early and self.awaited is not None:
            self._back_off_unless_awaited(time.monotonic() + delay)
        else:
            self._stop_event.wait(delay)

    def _back_off_unless_awaited(self, until):
        """Wait until ``until``, or until a request awaits an object not seen yet and an
        early retry is due."""
        while not self._stop_event.is_set():
            now = time.monotonic()
            if now >= until:
                return
            if now >= self._early_not_before and self.awaited():
                LOG.info('A CNI request waits for %s not seen yet: retrying the API server '
                         '%.1f s early', self.source.what, until - now)
                spacing = self._early_spacing
                self._early_not_before = now + random.uniform(spacing, 1.5 * spacing)
                self._early_spacing = min(self.backoff_max, 2 * spacing)
                return
            self._stop_event.wait(min(until - now, EARLY_POLL))

    def _backoff_delay(self):
        exponent = min(self._failures - 1, MAX_BACKOFF_EXPONENT)
        ceiling = min(self.backoff_max, self.backoff_initial * 2 ** exponent)
        # Jitter keeps a fleet of nodes from reconnecting in lockstep after an outage.
        return random.uniform(ceiling / 2, ceiling)

    # Interrupting a blocked read -----------------------------------------------------------

    @contextlib.contextmanager
    def _reading(self, response, deadline, late):
        """Read ``response`` in the block; cut it at ``deadline`` (monotonic) and raise
        ``late`` (an :class:`Overrun`) then, or at :meth:`stop`."""
        with self._lock:
            self._response = response
            stopping = self._stop_event.is_set()
        expired = threading.Event()
        # The read blocks in the socket: only cutting the stream from another thread
        # bounds the whole read rather than each of its pieces.
        timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._cut_at_deadline,
                                (response, expired))
        timer.daemon = True
        timer.start()
        try:
            if stopping:
                raise _Unavailable('stopping')
            try:
                yield
            except _Unavailable:
                if expired.is_set():
                    raise late from None
                raise
            if expired.is_set():
                raise late
        finally:
            timer.cancel()
            timer.join()
            with self._lock:
                self._response = None
            if not response.isclosed():
                # Unread data left on it: the connection must not go back to the pool.
                response.close()
            response.release_conn()

    def _cut_at_deadline(self, response, expired):
        expired.set()
        _cut(response)

    def _cut_on_stop(self):
        self._stop_event.wait()
        with self._lock:
            response = self._response
        if response is not None:
            _cut(response)


def _cut(response):
    """Unblock a read of ``response``; errors mean it already finished with it."""
    with contextlib.suppress(ValueError, RuntimeError, OSError):
        response.shutdown()


class _Body:
    """What the parser reads an answer through, with the bytes it read counted.

    ``value_bytes`` counts since the value being decoded began (the decoder
    zeroes it), ``token_bytes`` since the parser last produced an event (the
    decoder zeroes it at each, except while it is ``building`` a value: then
    it checks ``value_bytes`` itself at each value, and so ``value_bytes``
    past :data:`MAX_EVENT_BYTES` by :data:`MAX_TOKEN_BYTES` means no value
    came meanwhile). Either way, the parser is buffering one string past
    :data:`MAX_TOKEN_BYTES`, which no real API server sends, and the answer
    is cut. ``limit`` (``(max_bytes, Overrun)``) bounds the whole answer.
    """

    __slots__ = ('_read', '_limit', 'total', 'value_bytes', 'token_bytes', 'building',
                 'skipping')

    def __init__(self, read, limit=None):
        self._read = read
        self._limit = limit
        self.total = self.value_bytes = self.token_bytes = 0
        self.building = self.skipping = False

    def read(self, size):
        if size <= 0:
            return b''      # ijson's probe of what read() returns, before it reads
        chunk = self._read(min(size, READ_SIZE))
        self.total += len(chunk)
        self.value_bytes += len(chunk)
        self.token_bytes += len(chunk)
        if self._limit is not None and self.total > self._limit[0]:
            raise self._limit[1]
        if (self.value_bytes > MAX_EVENT_BYTES + MAX_TOKEN_BYTES + 2 * READ_SIZE
                if self.building else self.token_bytes > MAX_TOKEN_BYTES + READ_SIZE):
            raise Overrun('object_size', 'one JSON string is larger than %d bytes'
                          % MAX_TOKEN_BYTES)
        if self.skipping and self.value_bytes > MAX_SKIPPED_BYTES + READ_SIZE:
            raise Overrun('object_size', 'one object is larger than %d bytes'
                          % MAX_SKIPPED_BYTES)
        return chunk


class _Partial(dict):
    """What was read of an object over a bound: its identity alone, and ``why``."""

    def __init__(self, fields, why):
        super().__init__(fields)
        self.why = why


class _Decoder:
    """Builds the JSON values found at one place of a stream of ijson events, each
    within the bounds on one object: at most :data:`MAX_OBJECT_VALUES` values
    (its structure, whatever its strings hold), :data:`MAX_DEPTH` levels and
    :data:`MAX_EVENT_BYTES` bytes.

    A value past a bound is read on without being built: of it, only the
    scalars at the ``keep`` paths (tuples of keys: its identity) are kept and
    yielded as a :class:`_Partial`. ``at`` is where the values are: ``()``
    for the top-level values of a stream, ``('items', ITEM)`` for a list's
    items. Scalars elsewhere whose path is in ``outside`` are stored there.
    """

    def __init__(self, body, at, keep, outside=None):
        self.body = body
        self.at = at
        self.keep = frozenset(keep)
        self.keep_depth = max(map(len, keep), default=0)
        self.outside = outside if outside is not None else {}

    def values(self, events):
        body = self.body
        path = []               # outside the values: the key (or ITEM) of each level
        for event, value in events:
            body.token_bytes = 0
            if event == 'map_key':
                path[-1] = value
            elif event in ('end_map', 'end_array'):
                path.pop()
            elif len(path) == len(self.at) and tuple(path) == self.at:
                if event in ('start_map', 'start_array'):
                    yield self._value(event, events)
                else:
                    yield value
            elif event in ('start_map', 'start_array'):
                if len(path) == MAX_DEPTH:
                    raise _Unavailable('the answer nests deeper than %d levels' % MAX_DEPTH)
                path.append(None if event == 'start_map' else ITEM)
            elif tuple(path) in self.outside:
                self.outside[tuple(path)] = value

    def _value(self, first, events):
        """Build the value ``first`` starts; past a bound, keep its identity only."""
        body = self.body
        body.value_bytes, body.building = 0, True
        root = {} if first == 'start_map' else []
        containers = [root]     # the open ones
        # The key (or ITEM) of each open level, to PATH_LEVELS levels: as deep as a value
        # is built, and deeper than any kept path.
        path = [None if first == 'start_map' else ITEM]
        depth, values, why = 1, 1, None
        # The hot loop: every event of every object goes through it.
        for event, value in events:
            if event == 'map_key':
                path[-1] = value
                continue
            if event == 'end_map' or event == 'end_array':
                path.pop()
                containers.pop()
                depth -= 1
                if depth == 0:
                    body.building = False
                    return root
                continue
            values += 1
            parent = containers[-1]
            if event == 'start_map' or event == 'start_array':
                value = {} if event == 'start_map' else []
                if parent.__class__ is dict:
                    parent[path[-1]] = value
                else:
                    parent.append(value)
                containers.append(value)
                path.append(None if event == 'start_map' else ITEM)
                depth += 1
                if depth > MAX_DEPTH:
                    why = 'nested deeper than %d levels' % MAX_DEPTH
                    break
            elif parent.__class__ is dict:
                parent[path[-1]] = value
            else:
                parent.append(value)
            if values > MAX_OBJECT_VALUES:
                why = 'more than %d JSON values' % MAX_OBJECT_VALUES
                break
            if body.value_bytes > MAX_EVENT_BYTES + READ_SIZE:
                why = 'more than %d bytes' % MAX_EVENT_BYTES
                break
        else:
            return root         # the stream ended inside it: the parser raises
        # Past a bound: read on without building it, keeping its identity.
        body.building, body.skipping, body.token_bytes = False, True, 0
        found = {keys: v for keys in self.keep if (v := _scalar_at(root, keys)) is not None}
        root = containers = None
        for event, value in events:
            body.token_bytes = 0
            if event == 'map_key':
                if depth <= PATH_LEVELS:
                    path[-1] = value
            elif event == 'end_map' or event == 'end_array':
                if depth <= PATH_LEVELS:
                    path.pop()
                depth -= 1
                if depth == 0:
                    break
            elif event == 'start_map' or event == 'start_array':
                depth += 1
                if depth <= PATH_LEVELS:
                    path.append(None if event == 'start_map' else ITEM)
            elif depth <= self.keep_depth and tuple(path) in self.keep:
                found[tuple(path)] = value
        body.skipping = False
        partial = {}
        for keys, scalar in found.items():
            target = partial
            for key in keys[:-1]:
                target = target.setdefault(key, {})
            target[keys[-1]] = scalar
        return _Partial(partial, 'too large to read: ' + why)


ITEM = object()     # the key of an array's members in a decoder's paths
PATH_LEVELS = MAX_DEPTH + 1


def _scalar_at(obj, keys):
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj if isinstance(obj, (str, int, float, bool)) else None


class _Listing:
    """A list answer, decoded as it arrives: its objects one at a time, and its version.

    ijson's C parser reads the body through a :class:`_Body` (at most
    ``max_bytes``) and :class:`_Decoder` builds the objects of ``items`` one
    by one: only the object being built is in memory, held to the bounds on
    one object; one past them is yielded as its identity (a
    :class:`_Partial`). ``metadata.resourceVersion`` is read wherever the
    server writes it: before the items (a typed list) or after them (a
    custom resource list, keys in alphabetical order). A body without
    ``items`` lists nothing, like an empty list: no worse than what any
    server may answer.
    """

    def __init__(self, response, max_bytes, what, keep=IDENTITY):
        self._body = _Body(response.read, (max_bytes, Overrun(
            'list_bytes', 'the list of %s is larger than %d bytes' % (what, max_bytes))))
        self._what = what
        self._keep = keep
        self.resource_version = None

    def objects(self):
        """Yield each object of ``items``; raise _Unavailable when the body is no JSON."""
        version = ('metadata', 'resourceVersion')
        decoder = _Decoder(self._body, ('items', ITEM), self._keep, {version: None})
        try:
            yield from decoder.values(ijson.basic_parse(self._body, buf_size=READ_SIZE,
                                                        use_float=True))
        except ijson.JSONError as exc:
            raise _Unavailable('the list of %s is not JSON: %s'
                               % (self._what, apiclient.clip(' '.join(str(exc).split())))) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _Unavailable('list of %s broken: %s'
                               % (self._what, str(exc) or type(exc).__name__)) from None
        rv = decoder.outside[version]
        self.resource_version = rv if isinstance(rv, str) and rv else None


def _events(response, keep=IDENTITY):
    """Yield the decoded events of a watch stream (JSON objects, one a line), each held
    to the bounds on one object: one past them as its type and identity (a
    :class:`_Partial`)."""
    # amt bounds each read: without it, urllib3 reads a whole HTTP chunk at
    # once, however large the server says it is.
    pieces = response.stream(amt=READ_SIZE)
    body = _Body(lambda size: next(pieces, b''))
    keep = [('type',)] + [('object',) + path for path in keep]
    try:
        for event in _Decoder(body, (), keep).values(
                ijson.basic_parse(body, buf_size=READ_SIZE, use_float=True,
                                  multiple_values=True)):
            if not isinstance(event, dict):
                raise _Unavailable('watch event is not an object: %r'
                                   % apiclient.clip(repr(event)))
            yield event
    except ijson.JSONError as exc:
        raise _Unavailable('undecodable watch event: %s'
                           % apiclient.clip(' '.join(str(exc).split()))) from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise _Unavailable('watch stream broken: %s' % (str(exc) or type(exc).__name__)) from None


def _resource_version(obj):
    meta = obj.get('metadata') if isinstance(obj, dict) else None
    rv = meta.get('resourceVersion') if isinstance(meta, dict) else None
    if not isinstance(rv, str) or not rv:
        raise _BadObject('no metadata.resourceVersion')
    return rv


def _identify(obj):
    """Return ``("namespace/name", resourceVersion)``; raise _BadObject when unusable."""
    meta = obj.get('metadata') if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        raise _BadObject('object without metadata')
    missing = [f for f in ('namespace', 'name', 'uid')
               if not isinstance(meta.get(f), str) or not meta.get(f)]
    if missing:
        raise _BadObject('%s/%s lacks metadata.%s' % (meta.get('namespace'), meta.get('name'),
                                                      ', metadata.'.join(missing)))
    return '%s/%s' % (meta['namespace'], meta['name']), _resource_version(obj)


def _too_large(status):
    """Whether ``status`` refuses a resourceVersion newer than the server's (etcd restored)."""
    details = status.get('details')
    causes = details.get('causes') if isinstance(details, dict) else None
    return isinstance(causes, list) and any(
        isinstance(c, dict) and c.get('reason') == 'ResourceVersionTooLarge' for c in causes)
