"""A TCP echo between two pods: what a userspace datapath's checksums let through.

Each pod is reached by a command prefix that runs a command in its network
namespace (``ip netns exec NAME``, ``nsenter --target PID --net --``); the
server and the client are this Python, so a pod's image needs nothing.
"""

import subprocess
import sys

PORT = 7777
SERVER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', %d))
s.listen(1)
print('listening', flush=True)
s.settimeout(30)
c, _ = s.accept()
c.settimeout(30)
c.sendall(c.recv(100))
c.close()
""" % PORT

CLIENT = """
import socket, sys
c = socket.create_connection((sys.argv[1], %d), timeout=15)
c.sendall(b'through OVN')
sys.stdout.write(c.recv(100).decode())
""" % PORT


def echo(in_server, in_client, address):
    """What a TCP echo server run by ``in_server`` sends back to a client run by
    ``in_client`` that sent ``b'through OVN'`` to ``address``."""
    server = subprocess.Popen([*in_server, sys.executable, '-c', SERVER],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert server.stdout.readline() == b'listening\n', server.stderr.read(2000)
        client = subprocess.run([*in_client, sys.executable, '-c', CLIENT, address],
                                capture_output=True, timeout=30)
        assert client.returncode == 0, client.stderr
        return client.stdout
    finally:
        server.kill()
        server.wait(10)
