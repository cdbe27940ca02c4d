"""Where pods' VIFs come from: one source per ``[cni_daemon] vif_source``.

A source tells :class:`kuryr_cni.listwatch.ListWatch` which objects to list
and watch (``what``, ``request``) and builds the record the registry keeps of
each (``record``): ``{uid, vifs, error, deleting}``, small plain values only.
Sources read and validate; they neither request nor decide anything else.

- :mod:`.annotation`: the pod's ``kuryr.openstack.org/vifs`` annotation;
- :mod:`.kuryrport`: KuryrPort custom resources written by kuryr-controller,
  merged with the pods' presence.
"""

import functools

from kubernetes import client


def error_text(exc):
    """A :class:`kuryr_cni.errors.InvalidVIF` in one line, for a record's ``error``."""
    return '%s: %s' % (exc.msg, exc.details) if exc.details else exc.msg


class NodePods:
    """The pods of one node, as a source: subclasses say what record each one makes.

    The list is by field selector (``spec.nodeName``), so that the API server
    sends no other node's pod (and dispatches their events to no other watch);
    a pod of another node that comes anyway is no record (None).
    """

    def __init__(self, api_client, node_name):
        self.node_name = node_name
        self.what = 'pods of node %s' % node_name
        self.request = functools.partial(
            client.CoreV1Api(api_client).list_pod_for_all_namespaces,
            field_selector='spec.nodeName=%s' % node_name)

    def record(self, pod):
        spec = pod.get('spec')
        if not isinstance(spec, dict) or spec.get('nodeName') != self.node_name:
            return None
        return self.pod_record(pod)

    def pod_record(self, pod):
        raise NotImplementedError
