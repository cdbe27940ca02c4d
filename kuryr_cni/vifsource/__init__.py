"""Where pods' VIFs come from: one source per ``[cni_daemon] vif_source``.

A source tells :class:`kuryr_cni.listwatch.ListWatch` which objects to list
and watch (``what``, ``request``) and builds the record the registry keeps of
each (``record``): ``{uid, vifs, error, deleting}``, small plain values only.
Sources read and validate; they neither request nor decide anything else.

- :mod:`.annotation`: the pod's ``kuryr.openstack.org/vifs`` annotation;
- :mod:`.kuryrport`: KuryrPort custom resources written by kuryr-controller,
  merged with the pods' presence.
"""


def error_text(exc):
    """A :class:`kuryr_cni.errors.InvalidVIF` in one line, for a record's ``error``."""
    return '%s: %s' % (exc.msg, exc.details) if exc.details else exc.msg
