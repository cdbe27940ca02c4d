"""The pod-annotation VIF source (``[cni_daemon] vif_source = annotation``, the default)."""

from kuryr_cni import errors
from kuryr_cni import vif as vifmod
from kuryr_cni import vifsource


class PodAnnotations:
    """This node's pods, with the VIFs of their annotation.

    Reads the pods with ``spec.nodeName`` equal to ``node_name`` (a field
    selector, so the API server sends no other node's pod): of each, its
    ``metadata.uid``, ``metadata.deletionTimestamp`` and the
    ``kuryr.openstack.org/vifs`` annotation.

    Reports ``{uid, vifs, error, deleting}``: ``vifs`` the parsed annotation
    (``{ifname: VIF dict}``, empty while there is none), ``error`` why an
    annotation is unusable (then ``vifs`` is empty), ``deleting`` whether the
    pod is being deleted. A pod of another node is no record (None).
    """

    def __init__(self, api_client, node_name):
        self.node_name = node_name
        self.what = 'pods of node %s' % node_name
        self.request = vifsource.list_node_pods(api_client, node_name)

    def record(self, pod):
        if not vifsource.on_node(pod, self.node_name):
            return None
        meta = pod['metadata']
        annotations = meta.get('annotations')
        text = annotations.get(vifmod.ANNOTATION) if isinstance(annotations, dict) else None
        vifs, error = {}, None
        if text is not None:
            try:
                vifs = {ifname: v.to_dict()
                        for ifname, v in vifmod.parse_annotation(text).items()}
            except errors.InvalidVIF as exc:
                error = vifsource.error_text(exc)
        return {'uid': meta['uid'], 'vifs': vifs, 'error': error,
                'deleting': bool(meta.get('deletionTimestamp'))}
