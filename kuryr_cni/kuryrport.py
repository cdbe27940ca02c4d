"""The KuryrPort VIF source (``[cni_daemon] vif_source = kuryrport``).

For clusters whose VIFs are published by kuryr-controller as KuryrPort
custom resources (``kuryrports.openstack.org/v1``, one per pod, named and
namespaced like it, labelled ``kuryr.openstack.org/nodeName=<node>``). Two
feeds fill the registry's pod table with the same records the annotation
source makes (``"ns/name" -> {uid, vifs, error, deleting}``):

- :class:`KuryrPortWatcher` lists and watches this node's KuryrPorts (the
  list/watch machinery of :class:`kuryr_cni.watcher.PodWatcher`) and reads
  ``spec.podUid``, ``spec.podStatic`` and ``status.vifs`` (os-vif primitives,
  read by :mod:`kuryr_cni.osvif`). A static pod's record has uid None: its
  mirror pod's UID in the API never matches the kubelet's, so the UID fence
  is skipped for it.
- a :class:`kuryr_cni.watcher.PodWatcher` of this node's pods, only for their
  presence: a pod deleted before its KuryrPort appeared leaves a ``gone``
  record (for ``tombstone_ttl`` seconds, or until a pod of that name
  returns), so an ADD waiting for its VIFs fails at once instead of at its
  timeout.

:class:`PodVIFs` merges the two and writes every change to the sink as one
record; it is synced when both feeds are. No decision about attachments is
taken here.
"""

import threading
import time

from kubernetes import client
from oslo_log import log as logging

from kuryr_cni import errors
from kuryr_cni import osvif
from kuryr_cni import watcher

LOG = logging.getLogger(__name__)

GROUP = 'openstack.org'
VERSION = 'v1'
PLURAL = 'kuryrports'
NODE_LABEL = 'kuryr.openstack.org/nodeName'
TOMBSTONE_TTL = 600


class KuryrPortWatcher(watcher.PodWatcher):
    """Feeds ``sink`` from a list+watch of the KuryrPorts labelled with ``node_name``."""

    what = 'KuryrPorts'

    def __init__(self, api_client, node_name, sink, **kwargs):
        super().__init__(api_client, node_name, sink, **kwargs)
        self._custom = client.CustomObjectsApi(api_client)
        self._selector = '%s=%s' % (NODE_LABEL, node_name)

    def _list(self, **kwargs):
        return self._call(self._custom.list_cluster_custom_object, group=GROUP,
                          version=VERSION, plural=PLURAL, label_selector=self._selector,
                          **kwargs)

    def _is_ours(self, port):
        labels = (port.get('metadata') or {}).get('labels')
        return isinstance(labels, dict) and labels.get(NODE_LABEL) == self.node_name

    def _record(self, key, rv, port):
        """The registry record of a KuryrPort; a malformed one becomes an error record."""
        meta = port['metadata']
        spec = port.get('spec') if isinstance(port.get('spec'), dict) else {}
        status = port.get('status') if isinstance(port.get('status'), dict) else {}
        static = spec.get('podStatic') is True
        uid = spec.get('podUid')
        vifs, error = {}, None
        try:
            if not static and (not isinstance(uid, str) or not uid):
                raise errors.InvalidVIF('KuryrPort has no spec.podUid')
            vifs = {ifname: v.to_dict()
                    for ifname, v in osvif.parse_status_vifs(status.get('vifs')).items()}
        except errors.InvalidVIF as exc:
            error = '%s: %s' % (exc.msg, exc.details) if exc.details else exc.msg
            self._report_bad_annotation(key, rv, error)
        if error is None:
            self._reported.pop(key, None)
        return {'uid': None if static else uid, 'vifs': vifs, 'error': error,
                'deleting': bool(meta.get('deletionTimestamp'))}

    def _report_bad_annotation(self, key, rv, error):
        if self._reported.get(key) != rv:
            LOG.warning('KuryrPort %s (resource version %s) is unusable: %s', key, rv, error)
            self._reported[key] = rv


class PodVIFs:
    """Merges the pod feed and the KuryrPort feed into one record per pod.

    ``sink`` is the registry (``replace_pods``, ``put_pod``, ``drop_pod``,
    ``mark_synced``); :attr:`pods` and :attr:`ports` are the sinks to hand
    the two watchers. Thread-safe: each watcher runs in its own thread.
    """

    def __init__(self, sink, tombstone_ttl=TOMBSTONE_TTL, clock=time.monotonic):
        self.sink = sink
        self.tombstone_ttl = tombstone_ttl
        self.clock = clock
        self._lock = threading.Lock()
        self._pods = {}       # key -> {"uid", "deleting"}
        self._ports = {}      # key -> KuryrPort record
        self._gone = {}       # key -> (uid, since): deleted with no KuryrPort
        self._synced = {'pods': False, 'ports': False}
        self.pods = _Feed(self, 'pods')
        self.ports = _Feed(self, 'ports')

    def record(self, key):
        """The merged record of ``key`` (None: nothing is known of it)."""
        port = self._ports.get(key)
        pod = self._pods.get(key)
        if port is not None:
            merged = dict(port)
            merged['deleting'] = port['deleting'] or bool(pod and pod['deleting'])
            return merged
        if pod is not None:
            return {'uid': pod['uid'], 'vifs': {}, 'error': None, 'deleting': pod['deleting']}
        gone = self._gone.get(key)
        if gone is not None and self.clock() - gone[1] < self.tombstone_ttl:
            return {'uid': gone[0], 'vifs': {}, 'error': None, 'deleting': False, 'gone': True}
        return None

    # Feed changes (called by _Feed under the lock) ------------------------------

    def _put(self, feed, key, record):
        if feed == 'pods':
            self._pods[key] = {'uid': record['uid'], 'deleting': record['deleting']}
            self._gone.pop(key, None)
        else:
            self._ports[key] = record
        self._write(key)

    def _drop(self, feed, key):
        if feed == 'pods':
            pod = self._pods.pop(key, None)
            if pod is not None and key not in self._ports:
                self._gone[key] = (pod['uid'], self.clock())
        else:
            self._ports.pop(key, None)
        self._write(key)

    def _replace(self, feed, records):
        if feed == 'pods':
            for key in set(self._pods) - set(records) - set(self._ports):
                self._gone[key] = (self._pods[key]['uid'], self.clock())
            self._pods = {k: {'uid': r['uid'], 'deleting': r['deleting']}
                          for k, r in records.items()}
            for key in records:
                self._gone.pop(key, None)
        else:
            self._ports = dict(records)
        self._expire()
        merged = {}
        for key in set(self._pods) | set(self._ports) | set(self._gone):
            record = self.record(key)
            if record is not None:
                merged[key] = record
        self.sink.replace_pods(merged)

    def _mark_synced(self, feed, synced):
        self._synced[feed] = bool(synced)
        self.sink.mark_synced(all(self._synced.values()))

    def _write(self, key):
        self._expire()
        record = self.record(key)
        if record is None:
            self.sink.drop_pod(key)
        else:
            self.sink.put_pod(key, record)

    def _expire(self):
        now = self.clock()
        for key, (_, since) in list(self._gone.items()):
            if now - since >= self.tombstone_ttl:
                del self._gone[key]
                if key not in self._pods and key not in self._ports:
                    self.sink.drop_pod(key)


class _Feed:
    """The sink one watcher writes to; forwards to :class:`PodVIFs` under its lock."""

    def __init__(self, merger, name):
        self._merger = merger
        self._name = name

    def replace_pods(self, records):
        with self._merger._lock:
            self._merger._replace(self._name, records)

    def put_pod(self, key, record):
        with self._merger._lock:
            self._merger._put(self._name, key, record)

    def drop_pod(self, key):
        with self._merger._lock:
            self._merger._drop(self._name, key)

    def mark_synced(self, synced):
        with self._merger._lock:
            self._merger._mark_synced(self._name, synced)
