"""A stand-in Neutron (and kuryr-controller's activation of ports) for the test bed.

Real Neutron (ML2/OVS and ML2/OVN alike) reports a port ACTIVE only once it
sees the port's host side, and kuryr-controller then writes ``active: true``
into the pod's KuryrPort. This stand-in keeps that causality, and nothing
else of Neutron: for every pod it is asked to serve, it looks (every
``interval`` seconds, from a thread) for each inactive VIF's host side and,
once it exists, marks that VIF active in the object the VIF came from (the
pod's KuryrPort, or its ``kuryr.openstack.org/vifs`` annotation) through the
API stand-in. It never marks a VIF active before.

What counts as a port's host side:

- any kind, with a private Open vSwitch given: an OVS Interface whose
  ``external_ids:iface-id`` is the port's id (what ovn-controller and the OVS
  agent look for: ``ovs`` VIFs, and the ``qvo`` end of hybrid-plugged ones);
- ``bridge``: a link with the VIF's MAC in one of the node's pod namespaces,
  whose veth peer is enslaved to the VIF's bridge on the host;
- ``vlan`` and ``macvlan``: a link with the VIF's MAC in one of the node's
  pod namespaces.

:attr:`activations` records when each port turned active (monotonic time),
so tests can say it happened after the plug and not before.

With ``ovn_installed``, it also plays ovn-controller's part on the private
Open vSwitch: once a served ``ovs`` VIF's Interface exists (the plug made
it), it sets ``external_ids:ovn-installed=true`` on it, never before
(:attr:`installations`: when, per port). With ``activate=False`` it never
marks anything active: a control plane whose ACTIVE is late or lost.
"""

import json
import threading
import time

from kuryr_cni import netns
from kuryr_cni import osvif
from kuryr_cni import vif as vif_model


class StandInNeutron:
    """Activates served pods' ports once their host side exists on ``node``.

    ``node`` is a :class:`tools.testbed.host.Host` (its API stand-in, host
    namespace and pod namespaces); ``ovs`` a :class:`tools.testbed.ovs.PrivateOVS`
    or None.
    """

    def __init__(self, node, ovs=None, interval=0.02, ovn_installed=False, activate=True):
        self.node = node
        self.ovs = ovs
        self.interval = interval
        self.ovn_installed = ovn_installed
        self.activate = activate
        self.activations = {}        # port id -> time.monotonic() when marked active
        self.installations = {}      # port id -> time.monotonic() as ovn-installed was set
        self._installed = set()      # names of the Interfaces it was set on
        self._served = {}            # (namespace, name) -> 'kuryrport' | 'annotation'
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name='stand-in-neutron')
        self._thread.start()

    def serve_kuryrport(self, namespace, name):
        """Activate the ports of the KuryrPort ``namespace/name`` once plugged."""
        with self._lock:
            self._served[(namespace, name)] = 'kuryrport'

    def serve_annotation(self, namespace, name):
        """Activate the VIFs of the pod's annotation once plugged."""
        with self._lock:
            self._served[(namespace, name)] = 'annotation'

    def close(self):
        self._stop.set()
        self._thread.join(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # The loop ------------------------------------------------------------------------

    def _run(self):
        while not self._stop.wait(self.interval):
            with self._lock:
                served = list(self._served.items())
            for (namespace, name), source in served:
                try:
                    self._activate_plugged(namespace, name, source)
                except Exception:     # an object deleted or changed meanwhile: next turn
                    continue

    def _activate_plugged(self, namespace, name, source):
        if source == 'kuryrport':
            port = self.node.api.get(namespace, name, plural='kuryrports')
            entries = ((port or {}).get('status') or {}).get('vifs') or {}
            vifs = osvif.parse_status_vifs(entries)
        else:
            pod = self.node.api.get(namespace, name)
            text = ((pod or {}).get('metadata', {}).get('annotations') or {}).get(
                vif_model.ANNOTATION)
            entries = json.loads(text) if text else {}
            vifs = vif_model.parse_annotation(text) if text else {}
        if self.ovn_installed:
            self._install(vifs.values())
        if not self.activate:
            return
        plugged = [ifname for ifname, vif in vifs.items()
                   if not vif.active and self._host_side_exists(vif)]
        if not plugged:
            return
        now = time.monotonic()
        for ifname in plugged:
            self.activations.setdefault(vifs[ifname].port_id, now)
            if source == 'kuryrport':
                entries[ifname]['vif']['versioned_object.data']['active'] = True
            else:
                entries[ifname]['active'] = True
        if source == 'kuryrport':
            self.node.api.update_kuryrport(namespace, name, status=dict(port['status'],
                                                                        vifs=entries))
        else:
            self.node.api.set_vifs(namespace, name, entries)

    def _install(self, vifs):
        """Set ovn-installed on each new Interface of the served ``ovs`` VIFs' ports."""
        for vif in vifs:
            if vif.kind != 'ovs':
                continue
            for name in self._ovs_interface(vif.port_id).split():
                if name not in self._installed:
                    # Stamped before the write: the daemon may see the key and answer
                    # before vsctl returns here.
                    at = time.monotonic()
                    self.ovs.vsctl('set', 'Interface', name, 'external_ids:ovn-installed=true')
                    self._installed.add(name)
                    self.installations.setdefault(vif.port_id, at)

    # What Neutron would see ----------------------------------------------------------

    def _host_side_exists(self, vif):
        if self.ovs is not None and self._ovs_interface(vif.port_id):
            return True
        if vif.kind in ('ovs', 'ovs-hybrid'):    # seen on the integration bridge or not at all
            return False
        for pod_ns in list(self.node.pod_namespaces):
            try:
                with netns.iproute('/run/netns/' + pod_ns) as ipr:
                    links = [link for link in ipr.get_links()
                             if link.get('address') == vif.mac]
            except OSError:      # removed meanwhile
                continue
            for link in links:
                if vif.kind != 'bridge' or self._peer_enslaved(link.get('link'), vif.bridge):
                    return True
        return False

    def _ovs_interface(self, port_id):
        return self.ovs.vsctl('--bare', '--columns=name', 'find', 'Interface',
                              'external_ids:iface-id=%s' % port_id).strip()

    def _peer_enslaved(self, index, bridge):
        if not index:
            return False
        with netns.iproute(self.node.path) as ipr:
            masters = ipr.link_lookup(ifname=bridge)
            try:
                [peer] = ipr.link('get', index=index)
            except Exception:
                return False
        return bool(masters) and peer.get('master') == masters[0]
