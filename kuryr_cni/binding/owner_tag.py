"""The owner tag every host-side device carries.

A host-side device is owned by one interface of one sandbox: the pair
(container ID, interface name inside the pod). The owner is written on the
device twice, so that a DEL can be judged from the kernel alone, with every
record of the daemon lost:

- in its name, :func:`host_ifname`: ``kc`` + 13 hex digits of a hash of the
  owner. Deterministic (a retried ADD or a DEL finds the device without any
  record) and unique per sandbox *and* interface. (The daemon this one
  replaces named devices after the pod's port, which every sandbox of the pod
  shares, so the DEL of a dead sandbox removed the live one's device.)
- in its ``IFLA_IFALIAS``, :func:`alias`: ``kuryr-cni:<container_id>:<ifname>``,
  readable, and the proof of ownership checked before any deletion.

Container IDs are at most 128 characters of ``[A-Za-z0-9_.-]`` (validated
where requests enter the daemon); interface names follow
:func:`kuryr_cni.vif.valid_ifname`. Neither contains ``:``. No I/O here except
:func:`find_host_devices`, which only reads.
"""

import collections
import hashlib
import re

from kuryr_cni import vif as vif_model

PREFIX = 'kc'
ALIAS_PREFIX = 'kuryr-cni'
_HASH_CHARS = 13                   # 'kc' + 13 = 15 characters, the kernel's limit
_CONTAINER_ID = re.compile(r'^[A-Za-z0-9_.-]{1,128}\Z')

HostDevice = collections.namedtuple('HostDevice', 'index ifname container_id pod_ifname')


def host_ifname(container_id, ifname):
    """The name of the host-side device of ``ifname`` in sandbox ``container_id``."""
    owner = ('%s/%s' % (container_id, ifname)).encode()
    return PREFIX + hashlib.blake2b(owner, digest_size=8).hexdigest()[:_HASH_CHARS]


def alias(container_id, ifname):
    """The ``IFLA_IFALIAS`` text naming the owner."""
    return '%s:%s:%s' % (ALIAS_PREFIX, container_id, ifname)


def parse_alias(text):
    """Return ``(container_id, ifname)`` from an alias of ours, else None."""
    if not isinstance(text, str):
        return None
    parts = text.split(':')
    if len(parts) != 3 or parts[0] != ALIAS_PREFIX:
        return None
    _, container_id, ifname = parts
    if not _CONTAINER_ID.match(container_id) or not vif_model.valid_ifname(ifname):
        return None
    return container_id, ifname


def find_host_devices(ipr, container_id=None):
    """List the links of ``ipr``'s namespace that carry our alias.

    Returns :data:`HostDevice` tuples ``(index, ifname, container_id,
    pod_ifname)``: all of ours, or only those of ``container_id``. One dump of
    the links; nothing is changed.
    """
    found = []
    for link in ipr.link('dump'):
        owner = parse_alias(link.get('ifalias'))
        if owner is None or (container_id is not None and owner[0] != container_id):
            continue
        found.append(HostDevice(link['index'], link.get('ifname'), *owner))
    return found
