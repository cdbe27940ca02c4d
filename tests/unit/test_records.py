"""Each binding record format's keys, pinned (issue 31 hole 9).

A release that adds, drops or renames a key of the record without bumping
``records.FORMAT`` makes the previous release misread its records (before
issue 31 it set them aside as damaged): ``integration_bridge`` was added to
the VIF that way. This test fails on any change of the keys until FORMAT is
bumped and the new format's keys are pinned here.
"""

from kuryr_cni import records

FORMAT_1 = {
    'binding': {'format', 'pod', 'owner', 'uid', 'sandboxes'},
    'sandbox': {'netns', 'uid', 'attachments'},
    'attachment': {'state', 'interfaces', 'added_at', 'result'},
    'interface': {'ifname', 'vif', 'default_route'},
    'vif': {'kind', 'port_id', 'mac', 'mtu', 'ips', 'gateways', 'routes', 'active', 'default',
            'bridge', 'parent', 'vlan_id'},
}
PINNED = {
    0: dict(FORMAT_1, binding=FORMAT_1['binding'] - {'format'}),    # kuryr-cni 0.1.0
    1: FORMAT_1,
    2: dict(FORMAT_1, vif=FORMAT_1['vif'] | {'integration_bridge'}),
    3: dict(FORMAT_1, vif=FORMAT_1['vif'] | {'integration_bridge', 'network_id'}),
    # An interface adopted from kuryr-daemon names the devices it took over.
    4: dict(FORMAT_1, vif=FORMAT_1['vif'] | {'integration_bridge', 'network_id'},
            interface=FORMAT_1['interface'] | {'adopted'},
            adopted={'from', 'devices', 'ovs_port'}),
}


def test_the_keys_of_the_format_this_release_writes_are_pinned():
    current = {'binding': records.BINDING_KEYS, 'sandbox': records.SANDBOX_KEYS,
               'attachment': records.ATTACHMENT_KEYS, 'interface': records.INTERFACE_KEYS,
               'vif': records.VIF_KEYS, 'adopted': records.ADOPTED_KEYS}
    assert records.FORMAT in PINNED, 'pin the keys of format %d here' % records.FORMAT
    assert current == PINNED[records.FORMAT], (
        'the record\'s keys changed: bump records.FORMAT and pin the new format here')
    assert max(PINNED) == records.FORMAT


def test_every_format_only_ever_gained_keys():
    """So this release reads each older format whole."""
    for older, newer in zip(sorted(PINNED), sorted(PINNED)[1:]):
        for level, keys in PINNED[older].items():
            assert keys <= PINNED[newer][level], (older, newer, level)
