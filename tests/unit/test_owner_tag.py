"""The owner tag of host-side devices: names and aliases."""

import re
import string

from hypothesis import given
from hypothesis import strategies as st
import pytest

from kuryr_cni.binding import owner_tag
from kuryr_cni import vif as vif_model

container_ids = st.text(alphabet=string.ascii_letters + string.digits + '_.-',
                        min_size=1, max_size=128)
ifnames = st.from_regex(r'\A[A-Za-z0-9][A-Za-z0-9_.-]{0,14}\Z').filter(
    vif_model.valid_ifname)


def test_host_ifname_is_stable_across_releases():
    # Devices made by an older daemon must still be found by name: never change these.
    assert owner_tag.host_ifname('c0ffee', 'eth0') == 'kc57b01fef76448'
    assert owner_tag.host_ifname('c0ffee', 'net1') == 'kc5ec4551bd737f'
    assert owner_tag.host_ifname('a' * 64, 'eth0') == 'kcbc202b0e74b52'


@given(container_ids, ifnames)
def test_host_ifname_is_a_valid_15_char_name(container_id, ifname):
    name = owner_tag.host_ifname(container_id, ifname)
    assert re.fullmatch(r'kc[0-9a-f]{13}', name)
    assert vif_model.valid_ifname(name)
    assert owner_tag.host_ifname(container_id, ifname) == name


@given(st.lists(st.tuples(container_ids, ifnames), min_size=2, max_size=50, unique=True))
def test_host_ifname_differs_per_sandbox_and_interface(owners):
    names = {owner_tag.host_ifname(cid, ifname) for cid, ifname in owners}
    assert len(names) == len(owners)


def test_sandboxes_of_one_pod_get_different_names():
    # The old daemon's bug: one name per pod port, shared by every sandbox.
    assert owner_tag.host_ifname('sandbox-a', 'eth0') != owner_tag.host_ifname('sandbox-b', 'eth0')
    assert owner_tag.host_ifname('sandbox-a', 'eth0') != owner_tag.host_ifname('sandbox-a', 'net1')
    # The separator keeps ('ab', 'c') and ('a', 'bc')-style owners apart.
    assert owner_tag.host_ifname('a.b', 'c') != owner_tag.host_ifname('a', 'b.c')


@given(container_ids, ifnames)
def test_alias_round_trip(container_id, ifname):
    text = owner_tag.alias(container_id, ifname)
    assert text == 'kuryr-cni:%s:%s' % (container_id, ifname)
    assert len(text) < 256                     # IFALIASZ, with its NUL
    assert owner_tag.parse_alias(text) == (container_id, ifname)


@pytest.mark.parametrize('text', [
    None, '', 'kuryr-cni', 'kuryr-cni:', 'kuryr-cni::eth0', 'kuryr-cni:abc:',
    'kuryr-cni:abc', 'kuryr-cni:abc:eth0:extra', 'other:abc:eth0', 'KURYR-CNI:abc:eth0',
    'kuryr-cni:a b:eth0', 'kuryr-cni:abc:eth/0', 'kuryr-cni:abc:sixteen-chars-xx',
    'kuryr-cni:%s:eth0' % ('a' * 129), 'my favourite veth', 42,
])
def test_parse_alias_refuses_what_is_not_ours(text):
    assert owner_tag.parse_alias(text) is None


class FakeIPRoute:
    def __init__(self, links):
        self.links = links

    def link(self, command):
        assert command == 'dump'
        return iter(self.links)


def test_find_host_devices_lists_only_tagged_links():
    ipr = FakeIPRoute([
        {'index': 1, 'ifname': 'lo'},
        {'index': 2, 'ifname': 'kc-br0', 'ifalias': None},
        {'index': 3, 'ifname': 'kcaaaa', 'ifalias': 'kuryr-cni:sandbox-a:eth0'},
        {'index': 4, 'ifname': 'kcbbbb', 'ifalias': 'kuryr-cni:sandbox-b:eth0'},
        {'index': 5, 'ifname': 'kccccc', 'ifalias': 'kuryr-cni:sandbox-a:net1'},
        {'index': 6, 'ifname': 'tap0', 'ifalias': 'someone else'},
    ])

    assert owner_tag.find_host_devices(ipr) == [
        (3, 'kcaaaa', 'sandbox-a', 'eth0'),
        (4, 'kcbbbb', 'sandbox-b', 'eth0'),
        (5, 'kccccc', 'sandbox-a', 'net1'),
    ]
    found = owner_tag.find_host_devices(ipr, container_id='sandbox-a')
    assert [(d.index, d.pod_ifname) for d in found] == [(3, 'eth0'), (5, 'net1')]
    assert owner_tag.find_host_devices(ipr, container_id='sandbox-z') == []
