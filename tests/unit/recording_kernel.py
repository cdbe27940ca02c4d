"""A stand-in for the ownership rules' kernel port (:class:`kuryr_cni.kernel.Kernel`).

Why a stand-in: the real port needs root and network namespaces; the rule
matrix must run in the unit tier, everywhere. This one models exactly what
the rules can observe of the kernel and records every effect they cause:

- pod namespaces are paths holding interfaces, each with the owner tag its
  creator gave it (``(container_id, ifname)``, or None for a foreign one);
- host devices exist for the ``bridge`` and ``ovs`` kinds, tagged with their
  owner, as the real drivers make them;
- ``connect`` replaces what the same plug left and refuses a name tagged for
  anyone else; ``disconnect`` removes only what is tagged for the plug
  (:mod:`kuryr_cni.binding.podside`'s rule); ``remove_tagged`` only host
  devices of that tag.

:attr:`effects` lists what changed, in order: ``('create'|'remove', 'pod',
netns, ifname, container_id)`` and ``('create'|'remove', 'host', container_id,
ifname)``. Tests assert on it exactly.
"""

import ipaddress

from kuryr_cni import errors
from kuryr_cni.binding import podside

HOST_SIDE_KINDS = ('bridge', 'ovs', 'ovs-hybrid')


class RecordingKernel:
    def __init__(self):
        self.namespaces = {}    # path -> {ifname: (container_id, ifname) or None}
        self.host = {}          # (container_id, ifname) -> kind
        self.plugged = {}       # (netns, ifname) -> (VIF, Plug), for observe()
        self.effects = []
        self.fail_connect = None    # an exception the next connect raises (after creating)
        self.refused_bridges = set()    # bridges admit() refuses, as [binding] bridges would

    # Building the world -------------------------------------------------------------

    def add_netns(self, path, foreign=()):
        """A pod namespace; ``foreign`` names interfaces of someone else already in it."""
        self.namespaces[path] = {'lo': None, **{name: None for name in foreign}}
        return path

    def delete_netns(self, path):
        """The runtime removed the namespace: its interfaces go, and their veth peers."""
        for ifname, owner in self.namespaces.pop(path).items():
            if owner is not None and self.host.pop(owner, None):
                self.effects.append(('remove', 'host', *owner))

    def take_effects(self):
        effects, self.effects = self.effects, []
        return effects

    # The port --------------------------------------------------------------------------

    def check_netns(self, path):
        if path not in self.namespaces:
            raise errors.InvalidEnvironment('CNI_NETNS %s is not a network namespace' % path)

    def netns_exists(self, path):
        return path in self.namespaces

    def netns_vanished(self, path):
        return path not in self.namespaces

    def link_names(self, path):
        self.check_netns(path)
        return set(self.namespaces[path])

    def link_owner(self, path, ifname):
        self.check_netns(path)
        return self.namespaces[path].get(ifname)

    def observe(self, path):
        """What CHECK sees: each interface's MAC and addresses, the routes plugged."""
        self.check_netns(path)
        links, routes = {}, set()
        for ifname in self.namespaces[path]:
            vif, plug = self.plugged.get((path, ifname), (None, None))
            links[ifname] = {'mac': vif.mac if vif else None,
                             'addresses': {ipaddress.ip_interface(a) for a in vif.ips}
                             if vif else set()}
            if vif is not None:
                routes.update(podside.wanted_routes(vif, plug))
        return {'links': links, 'routes': routes}

    def admit(self, vif):
        refused = self.refused_bridges & set(vif.bridges)
        if refused:
            raise errors.VIFNotAllowed('bridge %s is not allowed' % ', '.join(sorted(refused)))

    def connect(self, vif, plug):
        self.check_netns(plug.netns)
        owner = (plug.container_id, plug.ifname)
        pod = self.namespaces[plug.netns]
        if plug.ifname in pod and pod[plug.ifname] != owner:
            raise errors.BindingFailed('%s exists in %s and belongs to another owner'
                                       % (plug.ifname, plug.netns))
        self.disconnect(vif.kind, plug)          # what this plug left before
        pod[plug.ifname] = owner
        self.plugged[(plug.netns, plug.ifname)] = (vif, plug)
        self.effects.append(('create', 'pod', plug.netns, plug.ifname, plug.container_id))
        if vif.kind in HOST_SIDE_KINDS:
            self.host[owner] = vif.kind
            self.effects.append(('create', 'host', *owner))
        if self.fail_connect is not None:
            exc, self.fail_connect = self.fail_connect, None
            raise exc

    def disconnect(self, kind, plug):
        owner = (plug.container_id, plug.ifname)
        if self._remove_host_device(owner):
            return
        pod = self.namespaces.get(plug.netns) if plug.netns else None
        if pod is not None and pod.get(plug.ifname) == owner:
            del pod[plug.ifname]
            self.effects.append(('remove', 'pod', plug.netns, plug.ifname, plug.container_id))

    def check(self, vif, plug):
        owner = (plug.container_id, plug.ifname)
        if self.namespaces.get(plug.netns, {}).get(plug.ifname) != owner:
            raise errors.CheckFailed('interface %s of container %s differs from its VIF'
                                     % (plug.ifname, plug.container_id),
                                     '%s is missing in %s' % (plug.ifname, plug.netns))

    def tagged_host_devices(self):
        return sorted(self.host)

    def remove_tagged(self, container_id, ifname):
        self._remove_host_device((container_id, ifname))

    def _remove_host_device(self, owner):
        """Remove a host device and the veth peer it takes along; whether there was one."""
        if not self.host.pop(owner, None):
            return False
        self.effects.append(('remove', 'host', *owner))
        for path, links in self.namespaces.items():
            if links.get(owner[1]) == owner:
                del links[owner[1]]
                self.effects.append(('remove', 'pod', path, owner[1], owner[0]))
        return True
