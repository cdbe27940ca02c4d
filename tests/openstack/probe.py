"""A traffic probe that starts the instant it is told to: is a new pod's network in force?

Run inside a pod's network namespace (``ip netns exec NAME python probe.py
ROLE ...``), it prepares everything first (sockets open, listener bound), says
``ready``, and acts on the first line it reads from stdin, so the test can
start it the moment an ADD answers:

* ``server`` (the new pod, before its ADD: its namespace exists, its
  interface not yet): listens on TCP :data:`PORT`; told to go, it turns TX
  checksum offload off on ``eth0`` (one ioctl: see tests/openstack/conftest.py
  for why TCP needs it on the userspace datapath), says ``go``, and echoes what
  each connection sends until stdin closes.
* ``client`` (a peer pod): told to go by a line holding the new pod's
  ADDRESS (known once the ADD answered), sends one ICMP echo request to
  ADDRESS every :data:`PING_INTERVAL` for :data:`PING_COUNT` requests,
  starting at once, and meanwhile connects to ADDRESS:PORT, once, with a
  timeout under TCP's first SYN retransmission (1 s): a connection made means
  its first SYN went through. Prints one JSON line: ``sent``, ``received``
  (echo replies), ``first_reply`` (seconds after go), ``connected`` (bool),
  ``connect_error``, ``connect_seconds``.
"""

import ctypes
import fcntl
import json
import os
import select
import socket
import struct
import sys
import threading
import time

PORT = 7788
PING_COUNT = 100
PING_INTERVAL = 0.01
REPLY_GRACE = 1.0           # seconds the last request's reply may take
CONNECT_TIMEOUT = 0.9       # under TCP's initial retransmission timeout (1 s)
SIOCETHTOOL = 0x8946
ETHTOOL_STXCSUM = 0x17


def tx_checksum_off(ifname):
    value = ctypes.create_string_buffer(struct.pack('II', ETHTOOL_STXCSUM, 0))
    request = struct.pack('16sP', ifname.encode(), ctypes.addressof(value))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        fcntl.ioctl(sock.fileno(), SIOCETHTOOL, request.ljust(40, b'\0'))


def serve():
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(('0.0.0.0', PORT))
    listener.listen(16)
    print('ready', flush=True)
    sys.stdin.readline()
    tx_checksum_off('eth0')
    print('go', flush=True)
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [], 60)
        if sys.stdin in readable or not readable:
            return
        conn, _ = listener.accept()
        conn.settimeout(5)
        try:
            conn.sendall(conn.recv(100))
        except OSError:
            pass
        conn.close()


def _checksum(data):
    if len(data) % 2:
        data += b'\0'
    total = sum(struct.unpack('!%dH' % (len(data) // 2), data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def _echo_request(ident, seq):
    header = struct.pack('!BBHHH', 8, 0, 0, ident, seq)
    payload = b'kuryr-cni probe %5d' % seq
    return struct.pack('!BBHHH', 8, 0, _checksum(header + payload), ident, seq) + payload


def client():
    ident = os.getpid() & 0xFFFF
    icmp = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    replies = {}
    outcome = {}
    print('ready', flush=True)
    address = sys.stdin.readline().strip()
    go = time.monotonic()

    def connect():
        started = time.monotonic()
        try:
            with socket.create_connection((address, PORT), timeout=CONNECT_TIMEOUT) as conn:
                conn.sendall(b'probe')
                outcome['echo'] = conn.recv(100).decode()
            outcome['connected'] = True
        except OSError as exc:
            outcome['connected'] = False
            outcome['connect_error'] = str(exc) or type(exc).__name__
        outcome['connect_seconds'] = round(time.monotonic() - started, 4)

    connector = threading.Thread(target=connect)
    connector.start()
    end = go + PING_COUNT * PING_INTERVAL + REPLY_GRACE
    sent = 0
    while True:
        now = time.monotonic()
        if sent < PING_COUNT and now >= go + sent * PING_INTERVAL:
            icmp.sendto(_echo_request(ident, sent), (address, 0))
            sent += 1
            continue
        if now >= end:
            break
        next_send = go + sent * PING_INTERVAL if sent < PING_COUNT else end
        readable, _, _ = select.select([icmp], [], [], max(0.0, min(next_send, end) - now))
        if readable:
            packet, (source, _) = icmp.recvfrom(2048)
            header = (packet[0] & 0x0F) * 4
            kind, _, _, r_ident, seq = struct.unpack('!BBHHH', packet[header:header + 8])
            if kind == 0 and r_ident == ident and source == address:
                replies.setdefault(seq, time.monotonic() - go)
    connector.join(10)
    print(json.dumps(dict(outcome, sent=sent, received=len(replies),
                          lost=sorted(set(range(sent)) - set(replies)),
                          first_reply=min(replies.values()) if replies else None)), flush=True)


if __name__ == '__main__':
    if sys.argv[1] == 'server':
        serve()
    else:
        client()
