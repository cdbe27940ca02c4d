"""Kubernetes Events on pods whose ADD timed out waiting for their VIFs.

Operators of this lineage look for them with ``kubectl describe pod``:
reason ``CNITimeoutKuryrPortRegistry`` when no VIF of the pod was published
in time (no annotation, no KuryrPort, or an empty one) and
``CNITimedOutWaitingForActiveVIFs`` when the VIFs were there but not all
active, type ``Warning``, source component ``kuryr-daemon`` on this node.

Best effort and bounded: :meth:`EventPoster.vif_timeout` only queues (a
full queue drops the event and logs it), and one background thread per
process posts them (``POST /api/v1/namespaces/<ns>/events`` through the
official client) with a request timeout. A failed post is logged and
forgotten; nothing here ever raises into the request path or waits for the
API server there.
"""

import datetime
import queue
import threading
import time

from kubernetes import client
from oslo_log import log as logging

from kuryr_cni import apiclient

LOG = apiclient.redacting(logging.getLogger(__name__))

REASON_NO_VIFS = 'CNITimeoutKuryrPortRegistry'
REASON_INACTIVE = 'CNITimedOutWaitingForActiveVIFs'
COMPONENT = 'kuryr-daemon'
QUEUE_SIZE = 64
REQUEST_TIMEOUT = (3, 5)     # (connect, read) seconds of one POST


class EventPoster:
    """Posts Events from a daemon thread started on first use.

    ``make_client`` returns a ``kubernetes.client.ApiClient``; it is called
    in that thread, so a broken API configuration costs only the Events.
    """

    def __init__(self, make_client, node_name, request_timeout=REQUEST_TIMEOUT,
                 queue_size=QUEUE_SIZE):
        self.make_client = make_client
        self.node_name = node_name
        self.request_timeout = request_timeout
        self._queue = queue.Queue(queue_size)
        self._idle = threading.Condition()
        self._pending = 0            # queued or being posted
        self._thread = None
        self._start_lock = threading.Lock()

    def vif_timeout(self, pod, vifs, seconds):
        """Queue the Event for ``pod`` (a :class:`~kuryr_cni.cni.request.PodRef`).

        ``vifs`` is what the registry held when the wait ended (None or
        ``{}``: none published). Never raises, never blocks.
        """
        try:
            if vifs:
                inactive = sorted(name for name, vif in vifs.items() if not vif.get('active'))
                reason = REASON_INACTIVE
                message = ('Timed out after %gs waiting for the ports of %s to become ACTIVE '
                           '(inactive: %s)' % (seconds, pod.key, ', '.join(inactive) or 'none'))
            else:
                reason = REASON_NO_VIFS
                message = ('Timed out after %gs waiting for the ports of %s to be published. '
                           'Check kuryr-controller logs.' % (seconds, pod.key))
            self.post(pod, reason, message)
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
                    api = client.CoreV1Api(self.make_client())
                response = api.create_namespaced_event(
                    body['metadata']['namespace'], body, _preload_content=False,
                    _request_timeout=self.request_timeout)
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
