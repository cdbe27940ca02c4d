"""The batched netlink channel against a scripted peer: one write, answers in order.

A unix datagram socket pair stands in for the kernel's end, so what the
channel sends can be read back as bytes and decoded by pyroute2, and the
answers (acks, errors with an extended-ack text, echoes, silence) are
whatever the test writes. The real kernel's side is in
``tests/functional/test_rtnl.py``.
"""

import errno
import ipaddress
import socket
import struct
import threading

import pytest
from pyroute2.netlink import NLMSG_ERROR, nlmsgerr
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.ifaddrmsg import IFA_F_NODAD, ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import IFF_UP, ifinfmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from kuryr_cni import netns
from kuryr_cni import rtnl


@pytest.fixture
def pair():
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    channel = rtnl.Channel(ours, 0.5, 'the test')
    yield channel, kernel
    channel.close()
    kernel.close()


def sent(kernel):
    """The messages of one write, decoded: ``[(header, message)]``."""
    data = kernel.recv(65536)
    out = []
    offset = 0
    while offset < len(data):
        length, msg_type = struct.unpack_from('=IH', data, offset)
        cls = {16: ifinfmsg, 20: ifaddrmsg, 24: rtmsg}[msg_type]
        msg = cls(data[offset:offset + length])
        msg.decode()
        out.append(msg)
        offset += length
    return out


def ack(request_msg, code=0, text=None):
    msg = nlmsgerr()
    msg['header']['type'] = NLMSG_ERROR
    msg['header']['sequence_number'] = request_msg['header']['sequence_number']
    msg['error'] = -code
    if text:
        msg['attrs'] = [('NLMSGERR_ATTR_MSG', text)]
    msg.encode()
    return msg.data


def test_a_batch_goes_in_one_write_and_each_request_gets_its_answer(pair):
    channel, kernel = pair
    requests = [rtnl.set_link(7, 'bring up eth0', up=True, alias='kuryr-cni:c:eth0'),
                rtnl.add_address(7, '10.0.0.5/24', 'add 10.0.0.5'),
                rtnl.add_address(7, 'fd00::5/64', 'add fd00::5'),
                rtnl.add_route(7, ipaddress.ip_network('0.0.0.0/0'),
                               ipaddress.ip_address('10.0.0.1'), 'add default')]
    answered = threading.Thread(target=channel.send, args=(requests,))
    answered.start()
    link, addr4, addr6, route = sent(kernel)
    assert (link['index'], link['flags'] & IFF_UP, link['change']) == (7, IFF_UP, IFF_UP)
    assert link.get_attr('IFLA_IFALIAS') == 'kuryr-cni:c:eth0'
    assert (addr4['family'], addr4['prefixlen'], addr4.get_attr('IFA_LOCAL'),
            addr4.get_attr('IFA_ADDRESS')) == (socket.AF_INET, 24, '10.0.0.5', '10.0.0.5')
    assert (addr6['flags'], addr6.get_attr('IFA_ADDRESS')) == (IFA_F_NODAD, 'fd00::5')
    assert (route['table'], route['proto'], route['dst_len'], route.get_attr('RTA_OIF'),
            route.get_attr('RTA_GATEWAY')) == (254, 4, 0, 7, '10.0.0.1')
    assert answered.is_alive()      # it waits for every answer
    # Answers in one datagram, the second refused with the kernel's reason.
    kernel.send(ack(link) + ack(addr4, errno.EEXIST, 'Address already assigned')
                + ack(addr6) + ack(route))
    answered.join(5)
    assert [r.error is None for r in requests] == [True, False, True, True]
    assert requests[1].error.code == errno.EEXIST
    with pytest.raises(Exception) as raised:
        netns.check_answers(requests)
    assert raised.value.msg == 'failed to add 10.0.0.5'
    assert 'Address already assigned' in raised.value.details


def test_an_unanswered_batch_times_out_with_code_11(pair):
    channel, kernel = pair
    with pytest.raises(rtnl.NetlinkTimeout) as raised:
        channel.send([rtnl.set_link(7, 'bring up eth0', up=True)])
    assert raised.value.code == 11
    assert 'no answer within 0.5 s' in raised.value.msg


def test_answers_to_an_abandoned_batch_are_not_taken_for_the_next(pair):
    channel, kernel = pair
    first = rtnl.set_link(7, 'first', up=True)
    with pytest.raises(rtnl.NetlinkTimeout):
        channel.send([first])
    late = sent(kernel)[0]
    second = rtnl.set_link(7, 'second', up=True)
    thread = threading.Thread(target=channel.send, args=([second],))
    thread.start()
    now = sent(kernel)[0]
    kernel.send(ack(late, errno.ENODEV) + ack(now))
    thread.join(5)
    assert second.error is None


def test_the_echo_of_a_creation_gives_both_indexes_without_a_full_decode():
    request = rtnl.new_veth('kc1', 1450, 3, 'eth0', 9, 'fa:16:3e:00:00:05', 'create')
    for index, name, peer in ((41, 'eth0', 42), (42, 'kc1', 41)):
        msg = ifinfmsg()
        msg['index'] = index
        msg['attrs'] = [('IFLA_IFNAME', name), ('IFLA_MTU', 1450), ('IFLA_LINK', peer)]
        msg.encode()
        request.echoed.append(bytes(msg.data))
    assert rtnl.created_link(request, 'kc1') == (42, 41)
    assert rtnl.created_link(request, 'kc2') is None


def test_the_creation_request_makes_the_pair_with_its_peer_in_the_pod():
    request = rtnl.new_veth('kc1', 1450, 3, 'eth0', 9, 'fa:16:3e:00:00:05', 'create')
    request.msg.encode()
    wire = ifinfmsg(request.msg.data)
    wire.decode()
    assert (wire.get_attr('IFLA_IFNAME'), wire.get_attr('IFLA_MTU'),
            wire.get_attr('IFLA_MASTER')) == ('kc1', 1450, 3)
    info = wire.get_attr('IFLA_LINKINFO')
    assert info.get_attr('IFLA_INFO_KIND') == 'veth'
    peer = info.get_attr('IFLA_INFO_DATA').get_attr('VETH_INFO_PEER')
    assert (peer.get_attr('IFLA_IFNAME'), peer.get_attr('IFLA_NET_NS_FD'),
            peer.get_attr('IFLA_ADDRESS'), peer.get_attr('IFLA_MTU')) == (
        'eth0', 9, 'fa:16:3e:00:00:05', 1450)


def test_a_refused_write_fails_every_request_of_the_batch(pair):
    channel, kernel = pair
    kernel.close()
    requests = channel.send([rtnl.set_link(7, 'a', up=True), rtnl.set_link(1, 'b', up=True)])
    assert all(isinstance(r.error, OSError) for r in requests)
    assert not isinstance(requests[0].error, NetlinkError)
