"""Open vSwitch binding: a veth pair from the pod into an OVS bridge.

::

    host namespace                               pod namespace
    OVS bridge vif.bridge
      Port/Interface kc<hash> -- kc<hash> ====== <plug.ifname>  MAC, MTU, IPs, routes
      external_ids:                alias kuryr-cni:<container>:<ifname>
        iface-id=<port_id> attached-mac=<mac> iface-status=active
        container-id=<container> kuryr-cni-owner=kuryr-cni:<container>:<ifname>

The veth pair is made as the ``bridge`` driver makes it (the pod end created
directly in the pod namespace, the host end tagged with the owner alias and
without IPv6 addresses),
but the host end gets no kernel master: it is added to the OVS bridge
through OVSDB (:mod:`kuryr_cni.binding.ovsdb`, ``[binding]
ovsdb_connection``) in one transaction that also replaces a row this plug
left before. The networking agent (OVN, the ML2 agent) finds the port by
``iface-id``; ``kuryr-cni-owner`` is the ownership proof checked before a row
is removed, like the alias on the device. The bridge must exist (the agent
manages it); the VIF's MTU is not compared with the bridge's own interface
(see :meth:`OvsDriver._ensure_bridge_exists`).

Per connect: three OVSDB transactions (bridge lookup; leftover
lookup; port insertion) and the wait until ovs-vswitchd has applied the
insertion (``cur_cfg`` reaching the ``next_cfg`` the insertion raised, as
``ovs-vsctl`` waits), plus the ``bridge`` driver's netlink batches.
"""

import time

from oslo_log import log as logging

from kuryr_cni import errors
from kuryr_cni.binding import base
from kuryr_cni.binding import bridge
from kuryr_cni.binding import ovsdb
from kuryr_cni.binding import owner_tag
from kuryr_cni.binding import podside

LOG = logging.getLogger(__name__)

OWNER_KEY = 'kuryr-cni-owner'
OVN_INSTALLED = 'ovn-installed'     # set by ovn-controller once the port's flows are in
_POLL_FIRST = 0.002
_POLL_MAX = 0.05
# Appended to a transaction: ask ovs-vswitchd to report when it has applied it.
_BUMP_CFG = [
    {'op': 'mutate', 'table': 'Open_vSwitch', 'where': [],
     'mutations': [['next_cfg', '+=', 1]]},
    {'op': 'select', 'table': 'Open_vSwitch', 'where': [], 'columns': ['next_cfg']},
]


class OvsDriver(bridge.BridgeDriver):
    """Connects ``ovs`` VIFs: veth whose host end is a port of OVS bridge ``vif.bridge``."""

    kind = 'ovs'
    host_side = True
    installed_signal = True

    def __init__(self, host_netns=None, options=None):
        super().__init__(host_netns, options)
        self._client = None

    @property
    def ovsdb(self):
        # Built on first use, so a bad ovsdb_connection fails OVS work only.
        if self._client is None:
            self._client = ovsdb.Client(self.options.ovsdb_connection,
                                        self.options.ovsdb_timeout, self.host_netns)
        return self._client

    def connect(self, vif, plug):
        """Create the veth pair, add its host end to the OVS bridge, configure the pod end.

        Failure after the pair exists removes the pair and the port row.
        """
        host_name = owner_tag.host_ifname(plug.container_id, plug.ifname)
        owner = owner_tag.alias(plug.container_id, plug.ifname)
        self._ensure_bridge_exists(vif.bridge)
        with self._namespaces(plug) as (host, pod_fd):
            try:
                self._plug_veth(host, pod_fd, None, vif, plug, attach=lambda name:
                                self._add_port(name, owner, vif, plug, vif.bridge))
            except BaseException:
                self._forget_port(host_name, owner)
                raise

    def disconnect(self, plug):
        """Remove the port row if it names this plug, then the veth as ``bridge`` does.

        OVSDB being unreachable fails the call (code 11) before any device
        is touched, so a retry finds both.
        """
        host_name = owner_tag.host_ifname(plug.container_id, plug.ifname)
        self._remove_port(host_name, owner_tag.alias(plug.container_id, plug.ifname))
        super().disconnect(plug)

    def remove_host_side(self, container_id, ifname):
        """As :meth:`disconnect`, but a node without a reachable OVSDB only loses the device."""
        host_name = owner_tag.host_ifname(container_id, ifname)
        try:
            self._remove_port(host_name, owner_tag.alias(container_id, ifname))
        except (ovsdb.Unavailable, errors.InvalidConfig) as exc:
            LOG.debug('No OVS port removed for %s: %s', host_name, exc.msg)
        super().disconnect(base.Plug(container_id, '', ifname, False))

    # -- OVSDB steps ---------------------------------------------------------------

    def _ensure_bridge_exists(self, name):
        """Raise BindingFailed unless OVS has a bridge ``name``.

        Its own interface's MTU is no bound on the VIF's: Open vSwitch lowers
        that local port to its smallest port's MTU, and forwards between
        ports whatever it is; os-vif never compared them. Refusing a VIF
        larger than it refused every pod of a jumbo network.
        """
        found, = self.ovsdb.transact(_select('Bridge', name, ['name']))
        if not found['rows']:
            raise errors.BindingFailed('Open vSwitch bridge %s does not exist' % name)

    def _add_port(self, host_name, owner, vif, plug, bridge_name):
        """Insert Port and Interface ``host_name`` into OVS bridge ``bridge_name``,
        in one transaction.

        A row of the same name is this plug's leftover (the name is derived
        from the owner); it is replaced in the same transaction, unless its
        owner key names someone else.
        """
        stale = self._port_of(host_name)
        if stale is not None and stale['owner'] not in (owner, None):
            raise errors.BindingFailed('OVS port %s exists and belongs to another owner'
                                       % host_name, 'expected %s=%s' % (OWNER_KEY, owner))
        external_ids = {'iface-id': vif.port_id, 'attached-mac': vif.mac,
                        'iface-status': 'active', 'container-id': plug.container_id,
                        OWNER_KEY: owner}
        operations = [{'op': 'wait', 'table': 'Bridge', 'timeout': 0,
                       'where': [['name', '==', bridge_name]], 'columns': ['name'],
                       'until': '==', 'rows': [{'name': bridge_name}]}]
        if stale is not None:
            operations.append(_detach(stale['port']))
        operations += [
            {'op': 'insert', 'table': 'Interface', 'uuid-name': 'iface',
             'row': {'name': host_name, 'type': '', 'external_ids': _ovs_map(external_ids)}},
            {'op': 'insert', 'table': 'Port', 'uuid-name': 'port',
             'row': {'name': host_name, 'interfaces': ['named-uuid', 'iface']}},
            {'op': 'mutate', 'table': 'Bridge', 'where': [['name', '==', bridge_name]],
             'mutations': [['ports', 'insert', ['set', [['named-uuid', 'port']]]]]},
        ] + _BUMP_CFG
        self._wait_applied(self.ovsdb.transact(*operations)[-1])

    def _wait_applied(self, selected):
        """Wait until ovs-vswitchd has applied the configuration we committed.

        As ``ovs-vsctl`` does without ``--no-wait``: the transaction raised
        ``next_cfg``; ovs-vswitchd copies it to ``cur_cfg`` once the port is
        really attached, so the pod has traffic when ADD answers. Bounded by
        the OVSDB timeout (ovs-vswitchd down: :class:`ovsdb.Unavailable`).
        """
        target = selected['rows'][0]['next_cfg']
        deadline = time.monotonic() + self.options.ovsdb_timeout
        delay = _POLL_FIRST
        while True:
            row = self.ovsdb.transact({'op': 'select', 'table': 'Open_vSwitch', 'where': [],
                                       'columns': ['cur_cfg']})[0]['rows'][0]
            if row['cur_cfg'] >= target:
                return
            if time.monotonic() + delay > deadline:
                raise ovsdb.Unavailable('ovs-vswitchd did not apply the new port within %g s '
                                        '(is it running?)' % self.options.ovsdb_timeout)
            time.sleep(delay)
            delay = min(delay * 2, _POLL_MAX)

    def _remove_port(self, host_name, owner, unowned_ours=True):
        """Remove port ``host_name`` from every bridge if ``owner`` owns it.

        A row without owner key is ours too when ``unowned_ours`` (its name is
        derived from the owner; a hybrid port's qvo is named after the port,
        so not). Returns podside's DELETED, ABSENT or FOREIGN.
        """
        port = self._port_of(host_name)
        if port is None:
            return podside.ABSENT
        if port['owner'] != owner and (port['owner'] is not None or not unowned_ours):
            LOG.warning('Not removing OVS port %s: it names owner %s, not %s',
                        host_name, port['owner'], owner)
            return podside.FOREIGN
        # An unreferenced Port (and its Interface) is garbage-collected by OVSDB.
        # Not waiting for ovs-vswitchd here: the device goes next either way.
        self.ovsdb.transact(_detach(port['port']))
        return podside.DELETED

    def _forget_port(self, host_name, owner, unowned_ours=True):
        """Best-effort :meth:`_remove_port` for an undo; never raises."""
        try:
            self._remove_port(host_name, owner, unowned_ours)
        except Exception:   # the original error matters more
            LOG.exception('Could not remove the OVS port of half-made %s', host_name)

    def _port_of(self, name):
        """``{"port": uuid, "interface": row or None, "owner": ...}`` of port ``name``, or None."""
        ports, interfaces = self.ovsdb.transact(
            _select('Port', name, ['_uuid']),
            _select('Interface', name, ['_uuid', 'external_ids', 'error', 'ofport']))
        if not ports['rows']:
            return None
        interface = interfaces['rows'][0] if interfaces['rows'] else None
        ids = _py_map(interface['external_ids']) if interface else {}
        return {'port': ports['rows'][0]['_uuid'], 'interface': interface,
                'external_ids': ids, 'owner': ids.get(OWNER_KEY)}

    # -- readiness -------------------------------------------------------------

    def wait_installed(self, plug, timeout, on_connect=None):
        """Return once ovn-controller has installed every flow of the plug's port.

        ovn-controller sets ``external_ids:ovn-installed=true`` on the
        Interface once all of the port's flows, its ACLs (security groups)
        included, are in ovs-vswitchd: the moment the pod's network works as
        Neutron says it should. Raises :class:`ovsdb.Unavailable` when that
        does not happen within ``timeout`` seconds (no OVN on this node, or
        none bound the port) or OVSDB cannot be reached.
        """
        host_name = owner_tag.host_ifname(plug.container_id, plug.ifname)
        self.ovsdb.wait_for_row('Interface', [
            ['name', '==', host_name],
            ['external_ids', 'includes', _ovs_map({OVN_INSTALLED: 'true'})]],
            timeout, on_connect)

    # -- check -----------------------------------------------------------------

    def _check_enslaved(self, host, link, vif, plug):
        """Instead of a kernel master: the port row, in the bridge, with its external_ids."""
        return self._check_port(link.get('ifname'), vif.bridge, vif, plug)

    def _check_port(self, host_name, bridge_name, vif, plug):
        """Problems of OVS port ``host_name``: in ``bridge_name``, with the plug's external_ids."""
        port = self._port_of(host_name)
        if port is None:
            return ['OVS port %s is missing' % host_name]
        problems = []
        found = self.ovsdb.transact(_select('Bridge', bridge_name, ['ports']))[0]['rows']
        members = _py_set(found[0]['ports']) if found else []
        if port['port'] not in members:
            problems.append('OVS port %s is not in bridge %s' % (host_name, bridge_name))
        expected = {'iface-id': vif.port_id, 'attached-mac': vif.mac, 'iface-status': 'active',
                    'container-id': plug.container_id,
                    OWNER_KEY: owner_tag.alias(plug.container_id, plug.ifname)}
        for key, value in sorted(expected.items()):
            if port['external_ids'].get(key) != value:
                problems.append('OVS interface %s has external_ids:%s=%r, not %r'
                                % (host_name, key, port['external_ids'].get(key), value))
        error = port['interface'] and _py_set(port['interface']['error'])
        if error:
            problems.append('OVS reports for %s: %s' % (host_name, error[0]))
        return problems


# -- OVSDB's JSON encoding (RFC 7047 §5.1) -----------------------------------------

def _select(table, name, columns):
    return {'op': 'select', 'table': table, 'where': [['name', '==', name]], 'columns': columns}


def _detach(port_uuid):
    return {'op': 'mutate', 'table': 'Bridge', 'where': [],
            'mutations': [['ports', 'delete', ['set', [port_uuid]]]]}


def _ovs_map(mapping):
    return ['map', [[k, v] for k, v in sorted(mapping.items())]]


def _py_map(value):
    if isinstance(value, list) and len(value) == 2 and value[0] == 'map':
        return {k: v for k, v in value[1]}
    return {}


def _py_set(value):
    """A column value that may be a set: a list of atoms (a uuid stays ['uuid', ...])."""
    if isinstance(value, list) and len(value) == 2 and value[0] == 'set':
        return value[1]
    return [value]
