"""The pod binding record: its typed parts and its persisted JSON form.

One definition, used by the ownership rules, the state store, the registry's
mirror, the operator's views and the tests::

    Binding    a pod ("namespace/name"), the owner container ID, the owner's pod UID,
     └ Sandbox     one per container ID that touched the pod: its netns, its pod UID,
        └ Attachment   one per (network, CNI_IFNAME): plugging or ready, its result,
           └ Interface     one per pod interface plugged: name, VIF, default route.

On disk (``state_dir/bindings``) a binding is one JSON object::

    {"format": 1, "pod": "ns/name", "owner": <container ID or null>, "uid": ...,
     "sandboxes": {<container ID>: {"netns": path, "uid": ...,
                                    "attachments": {"<network>/<ifname>": {
                                        "state": "plugging" | "ready", "added_at": <time>,
                                        "interfaces": [{"ifname", "vif", "default_route"}],
                                        "result": {...}}}}}}

Format 0 is the same without ``"format"`` (kuryr-cni 0.1.0). A file read back
is validated whole by :meth:`Binding.from_dict`, which raises
:class:`RecordError` on anything that is not this shape, and
:class:`FutureFormat` for a format newer than :data:`FORMAT`. No I/O here.
"""

import dataclasses
import re

from kuryr_cni import errors
from kuryr_cni import vif as vif_model

FORMAT = 1                  # the format this release writes; it reads 0 and 1
PLUGGING, READY = 'plugging', 'ready'

_CONTAINER_ID = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z')
_NETWORK = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z')
_NAMESPACE = re.compile(r'^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z')
_NAME = re.compile(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z')


class RecordError(ValueError):
    """A persisted record is not of the declared shape."""


class FutureFormat(RecordError):
    """A record written by a newer release, in a format this one does not know."""


@dataclasses.dataclass
class Interface:
    """One interface plugged into the pod, as its attachment recorded it."""

    ifname: str
    vif: vif_model.VIF
    default_route: bool

    def to_dict(self):
        return {'ifname': self.ifname, 'vif': self.vif.to_dict(),
                'default_route': self.default_route}

    @classmethod
    def from_dict(cls, data):
        _expect(data, dict, 'interface')
        return cls(ifname=_ifname(data.get('ifname')), vif=_vif(data.get('vif')),
                   default_route=_expect(data.get('default_route'), bool, 'default_route'))


@dataclasses.dataclass
class Attachment:
    """One (network, CNI_IFNAME) of a sandbox: its interfaces, state and result."""

    network: str
    ifname: str
    interfaces: list
    state: str = PLUGGING
    added_at: float = 0.0        # time.time() of the ADD that made it (a GC spares newer ones)
    result: dict | None = None   # the CNI result answered to that ADD, once ready

    @property
    def key(self):
        return (self.network, self.ifname)

    def to_dict(self):
        data = {'state': self.state, 'interfaces': [i.to_dict() for i in self.interfaces],
                'added_at': self.added_at}
        if self.result is not None:
            data['result'] = self.result
        return data

    @classmethod
    def from_dict(cls, key, data):
        network, sep, ifname = _expect(key, str, 'attachment key').partition('/')
        if not sep or not _NETWORK.match(network):
            raise RecordError('attachment key %r is not "<network>/<ifname>"' % key[:200])
        _expect(data, dict, 'attachment %s' % key)
        state = data.get('state')
        if state not in (PLUGGING, READY):
            raise RecordError('attachment %s has state %r' % (key, state))
        added_at = data.get('added_at', 0.0)
        if isinstance(added_at, bool) or not isinstance(added_at, (int, float)):
            raise RecordError('attachment %s has added_at %r' % (key, added_at))
        result = data.get('result')
        if result is not None:
            _expect(result, dict, 'result of attachment %s' % key)
        interfaces = [Interface.from_dict(i)
                      for i in _expect(data.get('interfaces'), list, 'interfaces')]
        return cls(network=network, ifname=_ifname(ifname), interfaces=interfaces,
                   state=state, added_at=float(added_at), result=result)


@dataclasses.dataclass
class Sandbox:
    """One container ID that touched the pod: where its netns is, what it attached."""

    container_id: str
    netns: str
    uid: str | None = None
    attachments: dict = dataclasses.field(default_factory=dict)  # Attachment.key -> Attachment

    def to_dict(self):
        return {'netns': self.netns, 'uid': self.uid,
                'attachments': {'%s/%s' % key: attachment.to_dict()
                                for key, attachment in self.attachments.items()}}

    @classmethod
    def from_dict(cls, container_id, data):
        _expect(data, dict, 'sandbox %s' % container_id)
        attachments = {}
        for key, item in _expect(data.get('attachments'), dict, 'attachments').items():
            attachment = Attachment.from_dict(key, item)
            attachments[attachment.key] = attachment
        return cls(container_id=_container_id(container_id),
                   netns=_expect(data.get('netns'), str, 'netns'),
                   uid=_optional_str(data.get('uid'), 'uid'), attachments=attachments)


@dataclasses.dataclass
class Binding:
    """A pod's binding: which sandbox owns it and every sandbox's attachments."""

    pod: str                     # "namespace/name"
    owner: str | None = None     # the container ID holding the pod's port; None: nobody
    uid: str | None = None       # the owner's pod UID (None: not told, e.g. podman)
    sandboxes: dict = dataclasses.field(default_factory=dict)    # container ID -> Sandbox

    @property
    def owner_sandbox(self):
        return self.sandboxes.get(self.owner) if self.owner else None

    def summary(self):
        return Summary(self.pod, self.owner, tuple(
            (cid, len(sandbox.attachments)) for cid, sandbox in self.sandboxes.items()),
            self.addresses())

    def addresses(self):
        """The MACs and IPs (without prefix length) of every interface any sandbox
        of the pod has plugged or is plugging: what no other pod may be given."""
        return frozenset(address for sandbox in self.sandboxes.values()
                         for attachment in sandbox.attachments.values()
                         for interface in attachment.interfaces
                         for address in vif_addresses(interface.vif))

    def to_dict(self):
        return {'format': FORMAT, 'pod': self.pod, 'owner': self.owner, 'uid': self.uid,
                'sandboxes': {cid: sandbox.to_dict() for cid, sandbox in self.sandboxes.items()}}

    @classmethod
    def from_dict(cls, data):
        """Validate a decoded binding file; raise RecordError or FutureFormat."""
        _expect(data, dict, 'binding')
        version = data.get('format', 0)
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise RecordError('format %r is not a format number' % (version,))
        if version > FORMAT:
            raise FutureFormat('format %d is newer than this release reads (%d)'
                               % (version, FORMAT))
        sandboxes = {cid: Sandbox.from_dict(cid, item) for cid, item
                     in _expect(data.get('sandboxes'), dict, 'sandboxes').items()}
        owner = data.get('owner')
        if owner is not None and owner not in sandboxes:
            raise RecordError('owner %r has no sandbox record' % (owner,))
        return cls(pod=pod_key(data.get('pod')), owner=owner,
                   uid=_optional_str(data.get('uid'), 'uid'), sandboxes=sandboxes)


@dataclasses.dataclass(frozen=True)
class Summary:
    """What the registry keeps of a binding: small, for look-ups by container ID and counts.

    The whole record stays in its file; the registry's values stay small.
    """

    pod: str
    owner: str | None
    sandboxes: tuple = ()       # ((container ID, number of attachments), ...)
    addresses: frozenset = frozenset()     # what its interfaces hold (vif_addresses)

    def attachment_count(self):
        return sum(count for _cid, count in self.sandboxes)


def vif_addresses(vif):
    """What no two pods of the node may hold at once, as ``(network, address)``: the MAC
    and the IPs (without prefix length) a VIF gives its interface, on its Neutron
    network (None when the VIF does not say: then on every network), and its port,
    node-wide (one port is one OVS ``iface-id``), as ``(None, 'port <port_id>')``."""
    network = vif.network_id
    return ((network, vif.mac), *((network, ip.partition('/')[0]) for ip in vif.ips),
            (None, 'port ' + vif.port_id))


def pod_key(value):
    """Validate ``"namespace/name"`` as Kubernetes names them; raise RecordError."""
    namespace, sep, name = _expect(value, str, 'pod').partition('/')
    if not (sep and _NAMESPACE.match(namespace) and len(name) <= 253 and _NAME.match(name)):
        raise RecordError('pod %r is not "<namespace>/<name>"' % value[:400])
    return value


def _expect(value, kind, what):
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise RecordError('%s is %s, not %s' % (what, type(value).__name__, kind.__name__))
    return value


def _optional_str(value, what):
    return None if value is None else _expect(value, str, what)


def _container_id(value):
    if not isinstance(value, str) or not _CONTAINER_ID.match(value):
        raise RecordError('container ID %r is invalid' % (value,))
    return value


def _ifname(value):
    if not vif_model.valid_ifname(value):
        raise RecordError('interface name %r is invalid' % (value,))
    return value


def _vif(data):
    try:
        return vif_model.from_record(data)
    except errors.InvalidVIF as exc:
        raise RecordError('VIF: %s %s' % (exc.msg, exc.details)) from None
