"""Batched rtnetlink requests: pyroute2's messages over one bounded, blocking socket.

What plugging asks of the kernel is a short, fixed list of changes (create a
veth pair; tag a link and bring it up; add addresses and routes). pyroute2's
``IPRoute`` runs each request to completion on an asyncio event loop through
its request filters, ~0.3 ms of CPU per request before the kernel does
anything, which made it most of the daemon's CPU per ADD (see
``doc/source/benchmark.rst``). Here the messages are still pyroute2's
(:mod:`pyroute2.netlink.rtnl`'s ``ifinfmsg``, ``ifaddrmsg``, ``rtmsg``, which
encode them), but a :class:`Channel` sends a whole list in one ``send`` and
reads the answers in order: the kernel handles the messages of one send one
after another, and answers each (``NLM_F_ACK``), failing or not. A change the
next one depends on is simply earlier in the list.

A channel belongs to one thread and one namespace (:func:`kuryr_cni.netns.channel`
makes it). Every read waits at most the channel's timeout; a channel that timed
out must be dropped, as its answers may still come.
"""

import errno
import ipaddress
import socket
import struct

from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_ECHO, NLM_F_EXCL, NLM_F_REQUEST
from pyroute2.netlink import NLMSG_ERROR, nlmsgerr
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_NEWADDR, RTM_NEWLINK, RTM_NEWROUTE
from pyroute2.netlink.rtnl.ifaddrmsg import IFA_F_NODAD, ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import IFF_UP, ifinfmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from kuryr_cni import errors

RT_SCOPE_LINK = 253
RT_TABLE_MAIN = 254
RTPROT_STATIC = 4
RTN_UNICAST = 1
_IFLA_IFNAME = 3
_IFLA_LINK = 5
_HEADER = struct.Struct('=IHHII')       # nlmsghdr: length, type, flags, sequence, pid
_IFINFO = struct.Struct('=BxHiII')      # ifinfomsg: family, type, index, flags, change
_ATTR = struct.Struct('=HH')            # rtattr: length, type
_RECV_BYTES = 65536
_CHANGE = NLM_F_REQUEST | NLM_F_ACK
_CREATE = _CHANGE | NLM_F_CREATE | NLM_F_EXCL

# IFLA_AF_SPEC turning IPv6 address generation off (IN6_ADDR_GEN_MODE_NONE):
# set while the device is down, it never gets a link-local address.
NO_IPV6_ADDRESSES = ('IFLA_AF_SPEC', {'attrs': [('AF_INET6', {'attrs': [
    ('IFLA_INET6_ADDR_GEN_MODE', 1)]})]})


class NetlinkTimeout(errors.TryAgainLater):
    """The kernel did not answer a netlink request in time."""


class Request:
    """One encoded message, what it does (for errors), and what the kernel answered."""

    def __init__(self, msg, msg_type, flags, action):
        msg['header']['type'] = msg_type
        msg['header']['flags'] = flags
        self.msg = msg
        self.action = action
        self.echoed = []        # with NLM_F_ECHO: the raw messages the kernel sent back
        self.error = None       # a NetlinkError, or None once acknowledged


class Channel:
    """A netlink route socket of one namespace; requests sent in batches, answered in order."""

    def __init__(self, sock, timeout, where):
        self.sock = sock
        self.sock.settimeout(timeout)
        self.timeout = timeout
        self.where = where
        self._sequence = 0

    def send(self, requests):
        """Send ``requests`` in one write, then read every answer; return ``requests``.

        Each request gets its ``error`` (None: done; a NetlinkError, or the
        OSError of a send the kernel refused) and, if it asked for an echo,
        its ``echoed`` messages. Raises :class:`NetlinkTimeout` when the
        kernel does not answer in time.
        """
        pending = {}
        data = []
        for request in requests:
            self._sequence = self._sequence % 0x7fffffff + 1
            request.msg['header']['sequence_number'] = self._sequence
            request.msg.encode()
            data.append(request.msg.data)
            pending[self._sequence] = request
        try:
            self.sock.send(b''.join(data))
        except OSError as exc:      # e.g. ENOBUFS: nothing was done
            for request in requests:
                request.error = exc
            return requests
        while pending:
            try:
                answer = self.sock.recv(_RECV_BYTES)
            except socket.timeout:
                raise NetlinkTimeout('netlink request in %s got no answer within %g s'
                                     % (self.where, self.timeout)) from None
            except OSError as exc:  # answers lost (ENOBUFS); a late one is not ours
                for request in pending.values():
                    request.error = exc
                return requests
            for msg_type, sequence, raw in _messages(answer):
                request = pending.get(sequence)
                if request is None:
                    continue            # an answer to a batch that gave up on it
                if msg_type != NLMSG_ERROR:
                    request.echoed.append(raw)
                    continue
                del pending[sequence]
                code = -struct.unpack_from('=i', raw, _HEADER.size)[0]
                if code:
                    request.error = _netlink_error(raw, code)
        return requests

    def close(self):
        self.sock.close()


def _messages(data):
    """``(type, sequence, raw message)`` of every netlink message in ``data``."""
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, msg_type, _flags, sequence, _pid = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size:
            break
        yield msg_type, sequence, data[offset:offset + length]
        offset += (length + 3) & ~3


def _netlink_error(raw, code):
    """A NetlinkError with the kernel's extended-ack text, when it gave one."""
    text = None
    try:
        msg = nlmsgerr(raw)
        msg.decode()
        text = msg.get_attr('NLMSGERR_ATTR_MSG')
    except Exception:       # the code alone is still the answer
        pass
    return NetlinkError(code, text) if text else NetlinkError(code)


# Messages ---------------------------------------------------------------------

def new_veth(host_name, mtu, master, peer_name, peer_netns_fd, peer_mac, action):
    """Create a veth pair, the peer directly in namespace ``peer_netns_fd``; echoed.

    ``master``: the bridge index of the host end, or None.
    """
    msg = ifinfmsg()
    peer = {'attrs': [('IFLA_IFNAME', peer_name), ('IFLA_NET_NS_FD', peer_netns_fd),
                      ('IFLA_ADDRESS', peer_mac), ('IFLA_MTU', mtu)]}
    msg['attrs'] = [('IFLA_IFNAME', host_name), ('IFLA_MTU', mtu)]
    if master is not None:
        msg['attrs'].append(('IFLA_MASTER', master))
    msg['attrs'].append(('IFLA_LINKINFO', {'attrs': [
        ('IFLA_INFO_KIND', 'veth'),
        ('IFLA_INFO_DATA', {'attrs': [('VETH_INFO_PEER', peer)]})]}))
    return Request(msg, RTM_NEWLINK, _CREATE | NLM_F_ECHO, action)


def set_link(index, action, up=False, alias=None, no_ipv6=False):
    """Change link ``index``: up, its alias, IPv6 address generation off.

    The kernel applies the flags before ``IFLA_AF_SPEC``: turning address
    generation off must come in an earlier request than bringing a link up
    that has carrier, or it comes too late.
    """
    msg = ifinfmsg()
    msg['index'] = index
    if up:
        msg['flags'] = msg['change'] = IFF_UP
    if alias is not None:
        msg['attrs'].append(('IFLA_IFALIAS', alias))
    if no_ipv6:
        msg['attrs'].append(NO_IPV6_ADDRESSES)
    return Request(msg, RTM_NEWLINK, _CHANGE, action)


def add_address(index, cidr, action):
    """Add ``cidr`` to link ``index``; an IPv6 one without DAD, usable at once."""
    iface = ipaddress.ip_interface(cidr)
    msg = ifaddrmsg()
    msg['index'] = index
    msg['prefixlen'] = iface.network.prefixlen
    address = str(iface.ip)
    if iface.version == 4:
        msg['family'] = socket.AF_INET
        msg['attrs'] = [('IFA_LOCAL', address), ('IFA_ADDRESS', address)]
    else:
        msg['family'] = socket.AF_INET6
        msg['flags'] = IFA_F_NODAD
        msg['attrs'] = [('IFA_ADDRESS', address)]
    return Request(msg, RTM_NEWADDR, _CREATE, action)


def add_route(index, dst, gateway, action):
    """Add the main-table route to network ``dst`` out of link ``index``.

    ``gateway`` None makes it a link-scope route.
    """
    msg = rtmsg()
    msg['family'] = socket.AF_INET if dst.version == 4 else socket.AF_INET6
    msg['dst_len'] = dst.prefixlen
    msg['table'] = RT_TABLE_MAIN
    msg['proto'] = RTPROT_STATIC
    msg['type'] = RTN_UNICAST
    msg['scope'] = RT_SCOPE_LINK if gateway is None else 0
    msg['attrs'] = [('RTA_OIF', index)]
    if dst.prefixlen:
        msg['attrs'].append(('RTA_DST', str(dst.network_address)))
    if gateway is not None:
        msg['attrs'].append(('RTA_GATEWAY', str(gateway)))
    return Request(msg, RTM_NEWROUTE, _CREATE, action)


def created_link(request, ifname):
    """``(index, peer index)`` of link ``ifname`` from a creation's echo, else None.

    Reads two attributes of the echoed ``RTM_NEWLINK`` without decoding the
    rest of the message (a link message carries dozens).
    """
    wanted = ifname.encode()
    for raw in request.echoed:
        _family, _type, index, _flags, _change = _IFINFO.unpack_from(raw, _HEADER.size)
        name = peer = None
        offset = _HEADER.size + _IFINFO.size
        while offset + _ATTR.size <= len(raw):
            length, kind = _ATTR.unpack_from(raw, offset)
            if length < _ATTR.size:
                break
            value = raw[offset + _ATTR.size:offset + length]
            if kind == _IFLA_IFNAME:
                name = value.rstrip(b'\0')
            elif kind == _IFLA_LINK:
                peer = struct.unpack('=I', value[:4])[0]
            offset += (length + 3) & ~3
        if name == wanted and peer:
            return index, peer
    return None


def is_unsupported_family(exc):
    """Whether ``exc`` is a kernel without IPv6 refusing an IPv6 setting."""
    return isinstance(exc, NetlinkError) and exc.code == errno.EAFNOSUPPORT
