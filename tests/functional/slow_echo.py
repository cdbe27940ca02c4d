"""Answers each ICMP echo request ``DELAY`` seconds late: ``python slow_echo.py DELAY``.

Run it in a namespace whose kernel does not answer (``net.ipv4.icmp_echo_ignore_all
= 1`` there), so that a pinger always has requests in flight. It prints ``ready``
once its socket is open, and runs until killed.
"""

import socket
import struct
import sys
import threading


def main(delay):
    sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    print('ready', flush=True)
    while True:
        packet, (source, _) = sock.recvfrom(65535)
        icmp = packet[(packet[0] & 0x0F) * 4:]
        if icmp[0] != 8:
            continue
        # The reply differs only in its type (8 -> 0): adjust the checksum (RFC 1624).
        checksum = struct.unpack('!H', icmp[2:4])[0] + 0x0800
        checksum = (checksum & 0xFFFF) + (checksum >> 16)
        reply = b'\0\0' + struct.pack('!H', checksum) + icmp[4:]
        threading.Timer(delay, sock.sendto, (reply, (source, 0))).start()


if __name__ == '__main__':
    main(float(sys.argv[1]))
