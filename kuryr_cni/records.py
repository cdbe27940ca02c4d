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
                                        "interfaces": [{"ifname", "vif", "default_route",
                                                        "adopted"?}],
                                        "result": {...}}}}}}

Formats: 0, kuryr-cni 0.1.0, the same without ``"format"``; 1, with it; 2,
a VIF may carry ``integration_bridge`` (``ovs-hybrid``); 3, a VIF may carry
``network_id`` (the address fence's network); 4, an interface may carry
``adopted``: the devices another CNI daemon made, which this one took over
(:mod:`kuryr_cni.adoption`). Every change of
this shape bumps :data:`FORMAT` (tests/unit/test_records.py pins each
format's keys): a release reading a record it does not fully understand
must know it, never drop or misread what it does not know. A record is
written in the oldest format that holds it (1 unless a VIF has an
integration bridge or a network ID, or an interface was adopted), so the
releases before a format was added still read the records that do not need it.

A file read back is validated whole by :meth:`Binding.from_dict`, which
raises :class:`RecordError` on anything that is not this shape, and
:class:`FutureFormat` for a format newer than :data:`FORMAT`, or for a key
this release does not know at any level (a newer release wrote it, even one
that forgot to bump the format): such a record is left untouched and refused
(code 5), never set aside as damaged. No I/O here.
"""

import dataclasses
import re

from kuryr_cni import errors
from kuryr_cni import vif as vif_model

FORMAT = 4                  # the newest format this release writes; it reads 0 to 4
PLUGGING, READY = 'plugging', 'ready'

_CONTAINER_ID = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z')
_NETWORK = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z')
_NAMESPACE = re.compile(r'^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z')
_NAME = re.compile(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z')


class RecordError(ValueError):
    """A persisted record is not of the declared shape."""


class FutureFormat(RecordError):
    """A record written by a newer release, in a format this one does not know."""


# The keys of each level of a record this release knows (format 4).
BINDING_KEYS = frozenset({'format', 'pod', 'owner', 'uid', 'sandboxes'})
SANDBOX_KEYS = frozenset({'netns', 'uid', 'attachments'})
ATTACHMENT_KEYS = frozenset({'state', 'interfaces', 'added_at', 'result'})
INTERFACE_KEYS = frozenset({'ifname', 'vif', 'default_route', 'adopted'})
ADOPTED_KEYS = frozenset({'from', 'devices', 'ovs_port'})
VIF_KEYS = frozenset(field.name for field in dataclasses.fields(vif_model.VIF))


@dataclasses.dataclass(frozen=True)
class Adopted:
    """Devices another CNI daemon made for an interface, taken over by this one.

    Their names are that daemon's (``tap<port>``, ``qbr/qvb/qvo<port>``), not
    derived from the owner, so the record names them; each carries our owner
    tag since its adoption, which every removal checks.
    """

    source: str             # who made them: 'kuryr-daemon'
    devices: tuple = ()     # host devices, in removal order (the pod end goes with a veth)
    ovs_port: str | None = None    # the OVS port (and Interface row) among them

    def to_dict(self):
        return {'from': self.source, 'devices': list(self.devices), 'ovs_port': self.ovs_port}

    @classmethod
    def from_dict(cls, data):
        _known(_expect(data, dict, 'adopted'), ADOPTED_KEYS, 'adopted')
        devices = tuple(_ifname(name) for name in _expect(data.get('devices'), list, 'devices'))
        ovs_port = data.get('ovs_port')
        return cls(source=_expect(data.get('from'), str, 'from'), devices=devices,
                   ovs_port=None if ovs_port is None else _ifname(ovs_port))


@dataclasses.dataclass
class Interface:
    """One interface plugged into the pod, as its attachment recorded it."""

    ifname: str
    vif: vif_model.VIF
    default_route: bool
    adopted: Adopted | None = None  # made by another daemon, adopted (format 4)

    def to_dict(self):
        data = {'ifname': self.ifname, 'vif': self.vif.to_dict(),
                'default_route': self.default_route}
        if self.adopted is not None:
            data['adopted'] = self.adopted.to_dict()
        return data

    @classmethod
    def from_dict(cls, data):
        _known(_expect(data, dict, 'interface'), INTERFACE_KEYS, 'interface')
        adopted = data.get('adopted')
        return cls(ifname=_ifname(data.get('ifname')), vif=_vif(data.get('vif')),
                   default_route=_expect(data.get('default_route'), bool, 'default_route'),
                   adopted=None if adopted is None else Adopted.from_dict(adopted))


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
        _known(_expect(data, dict, 'attachment %s' % key), ATTACHMENT_KEYS,
               'attachment %s' % key)
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
        _known(_expect(data, dict, 'sandbox %s' % container_id), SANDBOX_KEYS,
               'sandbox %s' % container_id)
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
        return {'format': self.format(), 'pod': self.pod, 'owner': self.owner, 'uid': self.uid,
                'sandboxes': {cid: sandbox.to_dict() for cid, sandbox in self.sandboxes.items()}}

    def format(self):
        """The oldest format that holds this binding."""
        interfaces = [interface for sandbox in self.sandboxes.values()
                      for attachment in sandbox.attachments.values()
                      for interface in attachment.interfaces]
        if any(interface.adopted is not None for interface in interfaces):
            return 4
        vifs = [interface.vif for interface in interfaces]
        if any(vif.network_id is not None for vif in vifs):
            return 3
        return 2 if any(vif.integration_bridge is not None for vif in vifs) else 1

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
        _known(data, BINDING_KEYS, 'binding')
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


def _known(data, keys, what):
    """Raise FutureFormat when ``data`` holds a key not in ``keys``: a newer release's."""
    unknown = sorted(key for key in data if key not in keys)
    if unknown:
        raise FutureFormat('%s has %s unknown to this release, so a newer release wrote it'
                           % (what, ', '.join(repr(key)[:100] for key in unknown[:5])))


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
    if isinstance(data, dict):
        _known(data, VIF_KEYS, 'VIF')
    try:
        return vif_model.from_record(data)
    except errors.InvalidVIF as exc:
        raise RecordError('VIF: %s %s' % (exc.msg, exc.details)) from None
