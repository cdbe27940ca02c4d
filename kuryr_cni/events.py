"""Kubernetes Events on pods whose ADD waits for, or timed out waiting for, their VIFs.

Operators of this lineage look for them with ``kubectl describe pod``; the
reasons are upstream kuryr-daemon's, source component ``kuryr-daemon`` on
this node:

- ``CNIWaitingForActiveVIFs`` (Normal): the pod's VIFs are plugged and the ADD
  now waits for them to turn active (Neutron ACTIVE, under KuryrPorts);
- ``CNITimedOutWaitingForActiveVIFs`` (Warning): they did not in time;
- ``CNITimeoutKuryrPortRegistry`` (Warning, KuryrPort source) or
  ``CNITimedOutWaitingForVIFAnnotation`` (Warning, annotation source): no VIF
  of the pod was published in time.

Messages speak of the VIF source in use: Neutron ports and kuryr-controller
under KuryrPorts, the ``kuryr.openstack.org/vifs`` annotation otherwise.

Best effort and bounded: posting only queues (a full queue drops the event
and logs it), and one background thread per process posts them (``POST
/api/v1/namespaces/<ns>/events`` through the official client's REST layer,
:mod:`kuryr_cni.apirequest`) with a request timeout. A failed post is
logged and forgotten; nothing here ever raises into the request path or
waits for the API server there.
"""

import datetime
import queue
import threading
import time
import urllib.parse

from oslo_log import log as logging

from kuryr_cni import apiclient
from kuryr_cni import apirequest
from kuryr_cni import vif as vif_model

LOG = apiclient.redacting(logging.getLogger(__name__))

REASON_WAITING = 'CNIWaitingForActiveVIFs'
REASON_INACTIVE = 'CNITimedOutWaitingForActiveVIFs'
REASON_NO_VIFS = {'kuryrport': 'CNITimeoutKuryrPortRegistry',
                  'annotation': 'CNITimedOutWaitingForVIFAnnotation'}
# What the VIFs are, and where their absence is explained, per VIF source.
_PORTS = {'kuryrport': 'the Neutron ports of %s', 'annotation': 'the VIFs of %s'}
_ACTIVE = {'kuryrport': 'to become ACTIVE after binding',
           'annotation': 'to be marked active in its kuryr.openstack.org/vifs annotation'}
_NOT_PUBLISHED = {'kuryrport': 'to be published in its KuryrPort. Check kuryr-controller logs',
                  'annotation': 'to be published in its kuryr.openstack.org/vifs annotation'}
COMPONENT = 'kuryr-daemon'
QUEUE_SIZE = 64
REQUEST_TIMEOUT = (3, 5)     # (connect, read) seconds of one POST


class EventPoster:
    """Posts Events from a daemon thread started on first use.

    ``make_client`` returns a ``kubernetes.client.ApiClient``; it is called
    in that thread, so a broken API configuration costs only the Events.
    """

    def __init__(self, make_client, node_name, source='kuryrport',
                 request_timeout=REQUEST_TIMEOUT, queue_size=QUEUE_SIZE):
        self.make_client = make_client
        self.node_name = node_name
        self.source = source         # [cni_daemon] vif_source: what the messages speak of
        self.request_timeout = request_timeout
        self._queue = queue.Queue(queue_size)
        self._idle = threading.Condition()
        self._pending = 0            # queued or being posted
        self._thread = None
        self._start_lock = threading.Lock()

    def waiting_for_active(self, pod, vifs):
        """Queue the Event saying ``pod``'s plugged ``vifs`` wait to be active.

        ``vifs``: ``{ifname: VIF dict}``. Never raises, never blocks.
        """
        self._queue_event(pod, REASON_WAITING, 'Normal',
                          lambda: 'Waiting for %s.' % self._activation(pod, vifs))

    def vif_timeout(self, pod, vifs, seconds):
        """Queue the Event for ``pod`` (a :class:`~kuryr_cni.cni.request.PodRef`).

        ``vifs`` is what the registry held when the wait ended (None or
        ``{}``: none published). Never raises, never blocks.
        """
        def message():
            what = (self._activation(pod, vifs) if vifs else
                    '%s %s' % (_PORTS[self.source] % pod.key, _NOT_PUBLISHED[self.source]))
            return 'Timed out after %gs waiting for %s.' % (seconds, what)
        reason = REASON_INACTIVE if vifs else REASON_NO_VIFS[self.source]
        self._queue_event(pod, reason, 'Warning', message)

    def _activation(self, pod, vifs):
        return '%s %s%s' % (_PORTS[self.source] % pod.key, _ACTIVE[self.source],
                            vif_model.inactive_note(vifs))

    def _queue_event(self, pod, reason, event_type, message):
        try:
            self.post(pod, reason, message(), event_type)
        except Exception:    # an Event is never worth failing (or slowing) a request
            LOG.exception('Could not queue an Event for pod %s', pod.key)

    def post(self, pod, reason, message, event_type='Warning'):
        self._ensure_thread()
        with self._idle:
            self._pending += 1
        try:
            self._queue.put_nowait(event_body(pod, reason, message, event_type,
                                              self.node_name))
        except queue.Full:
            self._done()
            LOG.warning('Dropped the %s Event for pod %s: %d Events already wait to be posted',
                        reason, pod.key, self._queue.maxsize)

    def drain(self, timeout):
        """Wait (bounded) until every queued Event was posted or given up; for tests."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def _done(self):
        with self._idle:
            self._pending -= 1
            self._idle.notify_all()

    def _ensure_thread(self):
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name='kuryr-cni-events')
                self._thread.start()

    def _run(self):
        api = None
        while True:
            body = self._queue.get()
            try:
                if api is None:
                    api = self.make_client()
                response = apirequest.send(
                    api, 'POST', '/api/v1/namespaces/%s/events'
                    % urllib.parse.quote(body['metadata']['namespace'], safe=''),
                    body=body, headers={'Accept': 'application/json'},
                    timeout=self.request_timeout)
                # Read the answer off the connection before it goes back to the pool:
                # the next request on it would read this body as its status line.
                response.drain_conn()
                response.release_conn()
                LOG.debug('Posted Event %s for pod %s/%s', body['reason'],
                          body['metadata']['namespace'], body['involvedObject']['name'])
            except Exception as exc:
                LOG.warning('Could not post the %s Event for pod %s/%s: %s', body['reason'],
                            body['metadata']['namespace'], body['involvedObject']['name'],
                            apiclient.describe_error(exc))
            finally:
                self._done()


def event_body(pod, reason, message, event_type, node_name):
    """A core/v1 Event about ``pod``, as kubelet-style (legacy) events are written."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')
    involved = {'apiVersion': 'v1', 'kind': 'Pod', 'namespace': pod.namespace, 'name': pod.name}
    if pod.uid:
        involved['uid'] = pod.uid
    return {
        'apiVersion': 'v1', 'kind': 'Event',
        # Unique per event, like client-go's recorder: "<object>.<hex timestamp>".
        'metadata': {'name': '%s.%x' % (pod.name, time.time_ns()), 'namespace': pod.namespace},
        'involvedObject': involved,
        'reason': reason, 'message': message, 'type': event_type,
        'source': {'component': COMPONENT, 'host': node_name},
        'firstTimestamp': now, 'lastTimestamp': now, 'count': 1,
    }
