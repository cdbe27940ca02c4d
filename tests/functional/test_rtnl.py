"""The batched netlink channel against a real kernel, in a throwaway namespace.

What plugging relies on: the kernel handles the messages of one write in
order, answers each, and goes on after a refusal; a creation's echo gives
both ends' indexes, where the kernel echoes one: 6.1 (the vm tier's guest)
sends no echo of an ``RTM_NEWLINK``, 6.18 does, and the bridge driver then
reads the indexes back by name (``BridgeDriver._indexes``).
"""

import errno
import ipaddress

import pytest

from kuryr_cni import netns
from kuryr_cni import rtnl
from tests.functional.conftest import CAN_RUN
from tests.functional.conftest import SKIP_REASON

pytestmark = pytest.mark.skipif(not CAN_RUN, reason=SKIP_REASON)


def test_a_batch_is_applied_in_order_past_a_refusal(pod_ns):
    host, pod = pod_ns(), pod_ns()
    with netns.open_netns(host.path) as host_fd, netns.open_netns(pod.path) as pod_fd, \
            netns.channel(host_fd) as channel:
        created, = channel.send([rtnl.new_veth('kc-test', 1400, None, 'eth0', pod_fd,
                                               'fa:16:3e:00:00:05', 'create')])
        assert created.error is None
        echoed = rtnl.created_link(created, 'kc-test')
        host_index, pod_index = host.links()['kc-test']['ifindex'], pod.links()['eth0']['ifindex']
        assert echoed in ((host_index, pod_index), None)
        if echoed is None:
            assert created.echoed == [], 'an echo created_link could not read'
        with netns.channel(pod_fd) as pod_channel:
            requests = pod_channel.send([
                rtnl.set_link(pod_index, 'tag', alias='kuryr-cni:c:eth0', no_ipv6=True),
                rtnl.set_link(pod_index, 'up', up=True),
                rtnl.add_address(pod_index, '10.1.0.5/24', 'address'),
                # Unreachable gateway: refused, and the kernel goes on.
                rtnl.add_route(pod_index, ipaddress.ip_network('172.16.0.0/12'),
                               ipaddress.ip_address('10.9.9.9'), 'route'),
                rtnl.add_route(pod_index, ipaddress.ip_network('0.0.0.0/0'),
                               ipaddress.ip_address('10.1.0.1'), 'default'),
            ])
    assert [r.error is None for r in requests] == [True, True, True, False, True]
    assert requests[3].error.code == errno.ENETUNREACH
    eth0 = pod.links()['eth0']
    assert (eth0['ifindex'], eth0['ifalias'], eth0['address'], eth0['mtu']) == (
        pod_index, 'kuryr-cni:c:eth0', 'fa:16:3e:00:00:05', 1400)
    assert 'UP' in eth0['flags']
    assert pod.addresses('eth0', scope=None) == {'10.1.0.5/24'}    # no link-local address
    assert ('default', '10.1.0.1', 'eth0') in pod.routes()
    assert not any(dst.startswith('172.16') for dst, _gw, _dev in pod.routes())
