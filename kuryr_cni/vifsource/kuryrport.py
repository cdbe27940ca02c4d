"""The KuryrPort VIF source (``[cni_daemon] vif_source = kuryrport``).

For clusters whose VIFs are published by kuryr-controller as KuryrPort
custom resources (``kuryrports.openstack.org/v1``, one per pod, named and
namespaced like it, labelled ``kuryr.openstack.org/nodeName=<node>``; the
CRD is ``etc/kubernetes/kuryrport-crd.yaml``). Two list+watches feed it:

- :class:`KuryrPorts`, this node's KuryrPorts: the VIFs;
- :class:`PodPresence`, this node's pods: only whether a pod still exists,
  so an ADD waiting for the VIFs of a pod deleted before its KuryrPort
  appeared fails at once instead of at its timeout.

:class:`PodVIFs` merges the two into the one record per pod the registry
keeps, the same records the annotation source makes. No decision about
attachments is taken here.
"""

import threading
import time

from kuryr_cni import apirequest
from kuryr_cni import errors
from kuryr_cni import osvif
from kuryr_cni import vifsource

GROUP = 'openstack.org'
VERSION = 'v1'
PLURAL = 'kuryrports'
NODE_LABEL = 'kuryr.openstack.org/nodeName'
TOMBSTONE_TTL = 600


class KuryrPorts:
    """This node's KuryrPorts, with their VIFs.

    Reads the KuryrPorts labelled ``kuryr.openstack.org/nodeName=<node>`` (a
    label selector): of each, ``spec.podUid``, ``spec.podStatic``,
    ``status.vifs`` (os-vif primitives, read by :mod:`kuryr_cni.osvif`) and
    ``metadata.deletionTimestamp``.

    Reports ``{uid, vifs, error, deleting}``, like the annotation source. A
    static pod's ``uid`` is None: its mirror pod's UID in the API never
    matches the kubelet's, so the UID fence is skipped for it. A KuryrPort
    without ``spec.podUid`` or with unusable VIFs is an error record; one of
    another node is no record (None), and one too large to read
    (``too_large``) an error record.
    """

    keep = (('metadata', 'labels', NODE_LABEL), ('spec', 'podUid'), ('spec', 'podStatic'))

    def __init__(self, api_client, node_name):
        self.node_name = node_name
        self.what = 'KuryrPorts of node %s' % node_name
        self._api = api_client
        self._selector = '%s=%s' % (NODE_LABEL, node_name)

    def request(self, query, timeout):
        return apirequest.send(self._api, 'GET', '/apis/%s/%s/%s' % (GROUP, VERSION, PLURAL),
                               dict(query, labelSelector=self._selector),
                               {'Accept': 'application/json'}, timeout=timeout)

    def record(self, port, too_large=None):
        labels = port['metadata'].get('labels')
        if not isinstance(labels, dict) or labels.get(NODE_LABEL) != self.node_name:
            return None
        spec = port.get('spec') if isinstance(port.get('spec'), dict) else {}
        status = port.get('status') if isinstance(port.get('status'), dict) else {}
        static = spec.get('podStatic') is True
        uid = spec.get('podUid')
        vifs, error = {}, None
        try:
            if not static and (not isinstance(uid, str) or not uid):
                raise errors.InvalidVIF('KuryrPort has no spec.podUid')
            if too_large is not None:
                raise errors.InvalidVIF('the KuryrPort is %s' % too_large)
            vifs = {ifname: v.to_dict()
                    for ifname, v in osvif.parse_status_vifs(status.get('vifs')).items()}
        except errors.InvalidVIF as exc:
            error = vifsource.error_text(exc)
        return {'uid': None if static else uid, 'vifs': vifs, 'error': error,
                'deleting': bool(port['metadata'].get('deletionTimestamp'))}


class PodPresence(vifsource.NodePods):
    """This node's pods, for their existence alone.

    Reads of each pod ``metadata.uid`` and ``metadata.deletionTimestamp``, and
    reports ``{uid, deleting}``, even of a pod too large to read whole: that
    is its identity. Annotations are not read: with this source they carry
    nothing.
    """

    def pod_record(self, pod, too_large):
        meta = pod['metadata']
        return {'uid': meta['uid'], 'deleting': bool(meta.get('deletionTimestamp'))}


class PodVIFs:
    """Merges the pod feed and the KuryrPort feed into one record per pod.

    ``sink`` is the registry (``replace_pods``, ``put_pod``, ``drop_pod``,
    ``mark_synced``). :attr:`pods` and :attr:`ports` are the sinks to hand
    the two list+watches; each forwards to :meth:`replace`, :meth:`put`,
    :meth:`drop` and :meth:`mark_synced` with its feed's name. Every change
    is written to ``sink`` as the merged record of its pod; the merge is
    synced when both feeds are. Thread-safe: each feed runs in its own thread.

    A pod deleted while no KuryrPort speaks for it leaves a ``gone`` record
    for ``tombstone_ttl`` seconds, or until a pod of that name returns.
    """

    FEEDS = ('pods', 'ports')

    def __init__(self, sink, tombstone_ttl=TOMBSTONE_TTL, clock=time.monotonic):
        self.sink = sink
        self.tombstone_ttl = tombstone_ttl
        self.clock = clock
        self._lock = threading.Lock()
        self._pods = {}       # key -> {"uid", "deleting"}
        self._ports = {}      # key -> KuryrPort record
        self._gone = {}       # key -> (uid, since): deleted with no KuryrPort
        self._synced = dict.fromkeys(self.FEEDS, False)
        self.pods = _Feed(self, 'pods')
        self.ports = _Feed(self, 'ports')

    def record(self, key):
        """The merged record of ``key`` (None: nothing is known of it)."""
        with self._lock:
            return self._merged(key)

    # Feed changes ---------------------------------------------------------------

    def put(self, feed, key, record):
        with self._lock:
            if feed == 'pods':
                self._pods[key] = {'uid': record['uid'], 'deleting': record['deleting']}
                self._gone.pop(key, None)
            else:
                self._ports[key] = record
            self._write(key)

    def drop(self, feed, key):
        with self._lock:
            if feed == 'pods':
                pod = self._pods.pop(key, None)
                if pod is not None and key not in self._ports:
                    self._gone[key] = (pod['uid'], self.clock())
            else:
                self._ports.pop(key, None)
            self._write(key)

    def replace(self, feed, records):
        with self._lock:
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
                record = self._merged(key)
                if record is not None:
                    merged[key] = record
            self.sink.replace_pods(merged)

    def mark_synced(self, feed, synced):
        with self._lock:
            self._synced[feed] = bool(synced)
            self.sink.mark_synced(all(self._synced.values()))

    # The merge (callers hold the lock) ---------------------------------------------

    def _merged(self, key):
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

    def _write(self, key):
        self._expire()
        record = self._merged(key)
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
    """The sink one list+watch writes to: :class:`PodVIFs`' methods, for one feed."""

    def __init__(self, merger, name):
        self._merger = merger
        self._name = name

    def replace_pods(self, records):
        self._merger.replace(self._name, records)

    def put_pod(self, key, record):
        self._merger.put(self._name, key, record)

    def drop_pod(self, key):
        self._merger.drop(self._name, key)

    def mark_synced(self, synced):
        self._merger.mark_synced(self._name, synced)
