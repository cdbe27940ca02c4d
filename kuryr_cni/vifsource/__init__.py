"""Where pods' VIFs come from: one source per ``[cni_daemon] vif_source``.

A source tells :class:`kuryr_cni.listwatch.ListWatch` which objects to list
and watch (``what``, ``request``) and builds the record the registry keeps of
each (``record``): ``{uid, vifs, error, deleting}``, small plain values only.
Sources read and validate; they neither request nor decide anything else.

- :mod:`.annotation`: the pod's ``kuryr.openstack.org/vifs`` annotation;
- :mod:`.kuryrport`: KuryrPort custom resources written by kuryr-controller,
  merged with the pods' presence.
"""

from kuryr_cni import apirequest


def error_text(exc):
    """A :class:`kuryr_cni.errors.InvalidVIF` in one line, for a record's ``error``."""
    return '%s: %s' % (exc.msg, exc.details) if exc.details else exc.msg


# What is asked of pods: their metadata alone (PartialObjectMetadata, which
# kube-apiserver serves since 1.15), so that the bounds of the watch are about
# what is read, never about a container's env or command line; and only those
# of the node not yet terminated (Succeeded and Failed pods keep their node
# until the pod GC deletes them, 12,500 of them cluster-wide by default).
METADATA_LIST = 'application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1'
METADATA_WATCH = 'application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1'
NOT_TERMINATED = 'status.phase!=Succeeded,status.phase!=Failed'


class NodePods:
    """The pods of one node, as a source: subclasses say what record each one makes.

    The list is by field selector (``spec.nodeName``, and not terminated), so
    that the API server sends no other node's pod (and dispatches their
    events to no other watch), nor the node's finished ones, whose network is
    gone; a pod leaving the selection (finishing) is a deletion to the
    watch. Only their metadata is asked for: a full pod that comes anyway
    (a server ignoring the request) and whose spec names another node is no
    record (None); a metadata-only one is vouched for by the field selector.
    """

    keep = (('spec', 'nodeName'),)      # of a pod past the watch's bounds, besides its identity

    def __init__(self, api_client, node_name):
        self.node_name = node_name
        self.what = 'pods of node %s' % node_name
        self._api = api_client
        self._selector = 'spec.nodeName=%s,%s' % (node_name, NOT_TERMINATED)

    def request(self, query, timeout):
        # The JSON of the whole pod last: what kube-apiserver falls back to if it must.
        accept = METADATA_WATCH if query.get('watch') else METADATA_LIST
        return apirequest.send(self._api, 'GET', '/api/v1/pods',
                               dict(query, fieldSelector=self._selector),
                               {'Accept': accept + ',application/json'}, timeout=timeout)

    def record(self, pod, too_large=None):
        """The record of ``pod``; ``too_large`` (why) when only its identity was read."""
        if 'spec' in pod:
            spec = pod['spec']
            if not isinstance(spec, dict) or spec.get('nodeName') != self.node_name:
                return None
        return self.pod_record(pod, too_large)

    def pod_record(self, pod, too_large):
        raise NotImplementedError
