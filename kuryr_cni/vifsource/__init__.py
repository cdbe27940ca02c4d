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


def list_node_pods(api_client, node_name):
    """The list call of the pods of ``node_name``: a field selector, so that the API
    server sends no other node's pod (and dispatches their events to no other watch)."""
    return functools.partial(client.CoreV1Api(api_client).list_pod_for_all_namespaces,
                             field_selector='spec.nodeName=%s' % node_name)


def on_node(pod, node_name):
    spec = pod.get('spec')
    return isinstance(spec, dict) and spec.get('nodeName') == node_name
