"""Sandbox eviction for vlan VIFs through the real ownership rules, on any kernel.

The ownership rules (real registry Manager, binding store, pod locks, real
pod namespaces for the ``CNI_NETNS`` checks) run in-process; only the vlan
driver's netlink is answered by :mod:`tests.unit.fake_kernel`, because the
kernel here has no 802.1Q support (the real-kernel version of this is
tests/functional/test_vif_kinds.py, which skips for vlan where the module is
missing). The stand-in enforces what makes eviction necessary: a VLAN ID is
unique per parent, wherever the interface lives.
"""

import time

import pytest

from kuryr_cni import binding
from kuryr_cni import kernel as kernel_port
from kuryr_cni import metrics
from kuryr_cni import ownership
from kuryr_cni import podlock
from kuryr_cni import registry as registry_mod
from kuryr_cni import state
from kuryr_cni import vif as vif_model
from kuryr_cni.binding import nested
from kuryr_cni.cni import request as cni_request
from tests.functional.conftest import CAN_RUN
from tests.functional.conftest import SKIP_REASON
from tests.unit import fake_kernel

pytestmark = pytest.mark.skipif(not CAN_RUN, reason=SKIP_REASON)

POD = 'default/web-0'
UID = 'uid-web-0'


@pytest.fixture
def world(netns_factory, tmp_path, monkeypatch):
    host = netns_factory()
    kernel = fake_kernel.FakeKernel()
    kernel.add_namespace(host.path)
    kernel.add_link(host.path, 'trunk0', {'mtu': 1500})
    monkeypatch.setattr(nested, 'netns', kernel.netns_module())
    evictions = []
    monkeypatch.setattr(metrics, 'sandbox_evicted', lambda: evictions.append(1))
    manager, registry = registry_mod.Registry.start('kuryr-cni-test: registry')
    try:
        vif = vif_model.parse_vif({
            'kind': 'vlan', 'port_id': 'port-5', 'mac': 'fa:16:3e:00:00:05', 'mtu': 1450,
            'parent': 'trunk0', 'vlan_id': 100, 'ips': ['10.99.0.5/24', 'fd99::5/64'],
            'gateway': ['10.99.0.1', 'fd99::1'], 'active': True})
        registry.pods.put(POD, {'uid': UID, 'vifs': {'eth0': vif.to_dict()}, 'error': None,
                                'deleting': False})
        rules = ownership.Ownership(
            registry=registry, store=state.BindingStore(str(tmp_path / 'state')),
            locks=podlock.PodLocks(state.ensure_dir(str(tmp_path / 'state' / 'locks'))),
            kernel=kernel_port.Kernel(host_netns=host.path,
                                      binding_options=binding.Options(link_iface='trunk0')),
            vif_timeout=2)
        yield rules, kernel, netns_factory, evictions
    finally:
        manager.shutdown()


def _request(command, container_id, netns):
    return cni_request.Request(
        command=command, cni_version='1.1.0', network='kuryr', container_id=container_id,
        netns=netns, ifname='eth0', pod=cni_request.PodRef('default', 'web-0', UID),
        config={'cniVersion': '1.1.0', 'name': 'kuryr', 'type': 'kuryr-cni'})


def _sandbox(kernel, netns_factory):
    ns = netns_factory()
    kernel.add_namespace(ns.path)
    return ns.path


def test_add_of_a_new_sandbox_evicts_the_old_vlan_interface(world):
    rules, kernel, netns_factory, evictions = world
    old, new = _sandbox(kernel, netns_factory), _sandbox(kernel, netns_factory)
    rules.add(_request('ADD', 'sandbox-a', old), time.monotonic() + 10)
    assert kernel.links(old)['eth0']['ifalias'] == 'kuryr-cni:sandbox-a:eth0'
    kernel.requests.clear()

    result = rules.add(_request('ADD', 'sandbox-b', new), time.monotonic() + 10)

    assert result['interfaces'][0]['sandbox'] == new
    assert 'eth0' not in kernel.links(old)
    assert kernel.links(new)['eth0']['ifalias'] == 'kuryr-cni:sandbox-b:eth0'
    # The old interface was found through A's record and A's owner tag, before plugging B.
    in_old = [(m, c) for ns, m, c, kw in kernel.requests if ns == old]
    assert in_old == [('link', 'get'), ('link', 'del')]
    first_add = next(i for i, r in enumerate(kernel.requests) if r[2] == 'add')
    last_old = max(i for i, r in enumerate(kernel.requests) if r[0] == old)
    assert last_old < first_add
    assert evictions == [1]
    binding = rules.store.load(POD)
    assert binding.owner == 'sandbox-b' and list(binding.sandboxes) == ['sandbox-b']


def test_late_del_of_the_old_sandbox_touches_nothing_of_the_new(world):
    rules, kernel, netns_factory, evictions = world
    old, new = _sandbox(kernel, netns_factory), _sandbox(kernel, netns_factory)
    rules.add(_request('ADD', 'sandbox-a', old), time.monotonic() + 10)
    rules.add(_request('ADD', 'sandbox-b', new), time.monotonic() + 10)
    kernel.requests.clear()

    assert rules.delete(_request('DEL', 'sandbox-a', old), time.monotonic() + 10) == 'stale'

    assert not [r for r in kernel.requests if r[0] == new]
    assert kernel.links(new)['eth0']['ifalias'] == 'kuryr-cni:sandbox-b:eth0'
