"""The operator's binding policy: which bridges and parents a VIF may name, and whose
addresses it may not take (the registry's reservations, across a real Manager)."""

import time

import pytest

from kuryr_cni import binding
from kuryr_cni import errors
from kuryr_cni import records
from kuryr_cni import vif as vif_model
from kuryr_cni.binding import policy


def vif(**changes):
    spec = {'kind': 'bridge', 'port_id': 'port-5', 'mac': 'fa:16:3e:00:00:05', 'mtu': 1450,
            'bridge': 'kuryr-br0', 'ips': ['10.10.0.5/24']}
    spec.update(changes)
    return vif_model.parse_vif({k: v for k, v in spec.items() if v is not None})


DEFAULTS = binding.Options()
NESTED = binding.Options(link_iface='ens3', parents=('ens4', 'trunk*'))

ALLOWED = [
    ('the default bridge', vif(), DEFAULTS),
    ('br-int for ovs', vif(kind='ovs', bridge='br-int'), DEFAULTS),
    ('a hybrid port\'s qbr and br-int',
     vif(kind='ovs-hybrid', bridge='qbrport-5', integration_bridge='br-int'), DEFAULTS),
    ('a pattern', vif(bridge='evbr3'), binding.Options(bridges=('evbr?',))),
    ('a nested VIF naming no parent', vif(kind='macvlan', bridge=None), DEFAULTS),
    ('link_iface', vif(kind='vlan', bridge=None, parent='ens3', vlan_id=5), NESTED),
    ('a listed parent', vif(kind='macvlan', bridge=None, parent='ens4'), NESTED),
    ('a parent pattern', vif(kind='macvlan', bridge=None, parent='trunk0'), NESTED),
]

REFUSED = [
    ('an unlisted bridge', vif(bridge='br-mgmt'), DEFAULTS, 'bridge br-mgmt'),
    ('an unlisted ovs bridge', vif(kind='ovs', bridge='br-ex'), DEFAULTS, 'bridge br-ex'),
    ('a hybrid port on an unlisted integration bridge',
     vif(kind='ovs-hybrid', bridge='qbrport-5', integration_bridge='br-ex'), DEFAULTS,
     'bridge br-ex'),
    ('a hybrid port when qbr bridges are not listed',
     vif(kind='ovs-hybrid', bridge='qbrport-5', integration_bridge='br-int'),
     binding.Options(bridges=('br-int',)), 'bridge qbrport-5'),
    ('patterns match case', vif(bridge='KURYR-br0'), DEFAULTS, 'bridge KURYR-br0'),
    ('an empty list', vif(), binding.Options(bridges=()), 'bridge kuryr-br0'),
    ('a parent with no link_iface nor parents',
     vif(kind='macvlan', bridge=None, parent='eth0'), DEFAULTS, 'parent eth0'),
    ('an unlisted parent', vif(kind='vlan', bridge=None, parent='eth0', vlan_id=5), NESTED,
     'parent eth0'),
]


@pytest.mark.parametrize('vif, options', [c[1:] for c in ALLOWED], ids=[c[0] for c in ALLOWED])
def test_allowed(vif, options):
    policy.refuse_unlisted(vif, options)


@pytest.mark.parametrize('vif, options, named', [c[1:] for c in REFUSED],
                         ids=[c[0] for c in REFUSED])
def test_refused_with_code_7_naming_what(vif, options, named):
    with pytest.raises(errors.VIFNotAllowed) as info:
        policy.refuse_unlisted(vif, options)
    assert info.value.code == 7 and named in info.value.msg


def test_options_from_the_configuration():
    from kuryr_cni import conf as config
    conf = config.load(['--config-file', '/dev/null'])
    options = binding.Options.from_conf(conf)
    assert options.bridges == ('kuryr-br0', 'br-int', 'qbr*') == DEFAULTS.bridges
    assert options.parents == ()


# -- addresses held by other pods: the registry's index and reservations -----------

def binding_of(pod, cid, *vifs):
    b = records.Binding(pod, owner=cid)
    sandbox = b.sandboxes[cid] = records.Sandbox(cid, '/run/netns/' + cid)
    sandbox.attachments[('kuryr', 'eth0')] = records.Attachment(
        'kuryr', 'eth0', [records.Interface('eth%d' % n, v, n == 0) for n, v in enumerate(vifs)])
    return b


def later():
    return time.monotonic() + 60


def test_summary_holds_every_mac_ip_and_port_on_its_network():
    summary = binding_of('ns/a', 'cid-a', vif(ips=['10.10.0.5/24', 'fd00::5/64']),
                         vif(mac='fa:16:3e:00:00:06', ips=['10.20.0.6/24'], port_id='port-6',
                             network_id='net-2')).summary()
    assert summary.addresses == {
        (None, 'fa:16:3e:00:00:05'), (None, '10.10.0.5'), (None, 'fd00::5'),
        ('net-2', 'fa:16:3e:00:00:06'), ('net-2', '10.20.0.6'),
        (None, 'port port-5'), (None, 'port port-6')}


def test_addresses_collide_on_one_network_or_where_one_is_not_known(registry):
    registry.bindings.put('ns/a', binding_of('ns/a', 'cid-a', vif(network_id='net-1')).summary())
    assert registry.bindings.reserve_addresses(
        'cid-b', 'ns/b', {('net-2', '10.10.0.5')}, later()) == {}
    assert registry.bindings.reserve_addresses(
        'cid-c', 'ns/c', {('net-1', '10.10.0.5')}, later()) == {'10.10.0.5': 'ns/a'}
    assert registry.bindings.reserve_addresses(
        'cid-c', 'ns/c', {(None, '10.10.0.5')}, later()) == {'10.10.0.5': 'ns/a'}
    # ... and the reservation of an ADD in flight (ns/b's, on net-2) likewise
    assert registry.bindings.reserve_addresses(
        'cid-d', 'ns/d', {('net-2', '10.10.0.5')}, later()) == {'10.10.0.5': 'ns/b'}
    assert registry.bindings.reserve_addresses(
        'cid-e', 'ns/e', {('net-3', '10.10.0.5')}, later()) == {}


def test_an_address_another_pods_binding_holds_is_refused(registry):
    registry.bindings.put('ns/a', binding_of('ns/a', 'cid-a', vif()).summary())
    taken = registry.bindings.reserve_addresses('cid-b', 'ns/b', {'10.10.0.5', 'x'}, later())
    assert taken == {'10.10.0.5': 'ns/a'}
    # ... but the pod's own binding holds nothing against a new sandbox of it
    assert registry.bindings.reserve_addresses('cid-a2', 'ns/a', {'10.10.0.5'}, later()) == {}


def test_an_address_is_free_again_once_its_binding_is_dropped_or_changed(registry):
    registry.bindings.put('ns/a', binding_of('ns/a', 'cid-a', vif()).summary())
    registry.bindings.put('ns/a', binding_of('ns/a', 'cid-a', vif(ips=['10.10.0.9/24'])
                                             ).summary())
    assert registry.bindings.reserve_addresses('cid-b', 'ns/b', {'10.10.0.5'}, later()) == {}
    registry.bindings.add_finished('cid-b')
    registry.bindings.drop('ns/a')
    assert registry.bindings.reserve_addresses('cid-c', 'ns/c', {'10.10.0.9'}, later()) == {}


def test_of_two_adds_racing_for_an_address_one_wins_until_it_ends(registry):
    assert registry.bindings.reserve_addresses('cid-a', 'ns/a', {'10.10.0.5'}, later()) == {}
    assert registry.bindings.reserve_addresses('cid-b', 'ns/b', {'10.10.0.5'}, later()) == \
        {'10.10.0.5': 'ns/a'}
    registry.bindings.add_finished('cid-a')
    assert registry.bindings.reserve_addresses('cid-b', 'ns/b', {'10.10.0.5'}, later()) == {}


def test_a_reservation_of_a_dead_worker_ends_at_its_deadline(registry):
    assert registry.bindings.reserve_addresses(
        'cid-a', 'ns/a', {'10.10.0.5'}, time.monotonic() + 0.05) == {}
    time.sleep(0.1)
    assert registry.bindings.reserve_addresses('cid-b', 'ns/b', {'10.10.0.5'}, later()) == {}


def test_replace_rebuilds_the_address_index(registry):
    registry.bindings.put('ns/old', binding_of('ns/old', 'cid-o', vif()).summary())
    registry.bindings.replace({'ns/a': binding_of('ns/a', 'cid-a', vif(ips=['10.10.0.7/24'])
                                                  ).summary()})
    assert registry.bindings.reserve_addresses('cid-b', 'ns/b', {'10.10.0.5'}, later()) == {}
    assert registry.bindings.reserve_addresses('cid-c', 'ns/c', {'10.10.0.7'}, later()) == \
        {'10.10.0.7': 'ns/a'}
