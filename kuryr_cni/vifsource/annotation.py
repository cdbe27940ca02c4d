"""The pod-annotation VIF source (``[cni_daemon] vif_source = annotation``, the default)."""

from kuryr_cni import errors
from kuryr_cni import vif as vifmod
from kuryr_cni import vifsource


class PodAnnotations(vifsource.NodePods):
    """This node's pods, with the VIFs of their annotation.

    Reads of each pod its ``metadata.uid``, ``metadata.deletionTimestamp`` and
    the ``kuryr.openstack.org/vifs`` annotation, and reports ``{uid, vifs,
    error, deleting}``: ``vifs`` the parsed annotation (``{ifname: VIF
    dict}``, empty while there is none), ``error`` why an annotation is
    unusable (then ``vifs`` is empty), ``deleting`` whether the pod is being
    deleted. A pod too large to read (``too_large``) has that ``error``.
    """

    def pod_record(self, pod, too_large):
        meta = pod['metadata']
        if too_large is not None:
            return {'uid': meta['uid'], 'vifs': {}, 'error': 'the pod is %s' % too_large,
                    'deleting': bool(meta.get('deletionTimestamp'))}
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
