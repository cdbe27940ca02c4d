"""Issue 32, item 2, the slower variant: the same state machine with the real kernel port.

:class:`tests.model.real_protocol.Protocol` with :class:`kuryr_cni.kernel.Kernel`
and the bridge driver instead of the recording stand-in: every sandbox is a
real network namespace, every plug a real veth pair whose host end joins a
real bridge, in a throw-away namespace standing for the node (as
tests/functional does; nothing is made in the machine's own namespace). What
the invariants call a device is what carries our owner tag there: host ends
(``ifalias``) in the node namespace and pod ends in each sandbox's. Fewer,
shorter examples than the recording variant: each step makes and reads
namespaces. Needs root and iproute2.
"""

import os
import subprocess
import time
import uuid

import pytest
from hypothesis import HealthCheck
from hypothesis import settings

from kuryr_cni import binding
from kuryr_cni import kernel as kernel_port
from kuryr_cni import netns
from kuryr_cni.binding import owner_tag
from tests.functional.conftest import BRIDGE
from tests.functional.conftest import CAN_RUN
from tests.functional.conftest import GATEWAY4
from tests.functional.conftest import IP
from tests.functional.conftest import SESSION_PREFIX
from tests.functional.conftest import SKIP_REASON
from tests.functional.conftest import root_netns_untouched  # noqa: F401 - the leak check
from tests.model import real_protocol

pytestmark = pytest.mark.skipif(not CAN_RUN, reason=SKIP_REASON)

NETNS_GONE_TIMEOUT = 10     # seconds the kernel may take to destroy a deleted namespace


def ip(*args):
    subprocess.run([IP, *args], check=True, capture_output=True, timeout=30)


class KernelNode:
    """A node namespace with bridge kc-br0 holding the gateway, and real pod namespaces."""

    bridge = BRIDGE

    def __init__(self):
        self.prefix = '%s-m%s' % (SESSION_PREFIX, uuid.uuid4().hex[:6])
        self.made = []
        self.host = self._netns('node')
        name = os.path.basename(self.host)
        ip('-n', name, 'link', 'set', 'lo', 'up')
        ip('-n', name, 'link', 'add', BRIDGE, 'type', 'bridge')
        ip('-n', name, 'addr', 'add', GATEWAY4 + '/24', 'dev', BRIDGE)
        ip('-n', name, 'link', 'set', BRIDGE, 'up')
        self.kernel = kernel_port.Kernel(host_netns=self.host,
                                         binding_options=binding.Options(bridges=(BRIDGE,)))

    def _netns(self, suffix):
        name = '%s-%s' % (self.prefix, suffix)
        ip('netns', 'add', name)
        self.made.append(name)
        return '/run/netns/' + name

    def port(self):
        return self.kernel

    def make_netns(self, cid):
        return self._netns(cid)

    def remove_netns(self, path):
        """Delete the namespace, and wait until the veths whose pod end it held are gone
        from the node: the kernel destroys a namespace's devices in a work queue after
        the last reference goes, so the host ends would otherwise vanish during the next
        worker's slice, which the invariants would then blame (a shim's DEL, say).
        There is no event for it to wait on; a bounded poll."""
        inside = {(cid, ifname) for cid, ifname, where in self.devices() if where == path}
        ip('netns', 'delete', os.path.basename(path))
        deadline = time.monotonic() + NETNS_GONE_TIMEOUT
        while inside & set(binding.tagged_host_devices(self.host)):
            assert time.monotonic() < deadline, (
                'the host ends of %s outlived their namespace %s for %d s'
                % (sorted(inside), path, NETNS_GONE_TIMEOUT))
            time.sleep(0.02)

    def netns_exists(self, path):
        return netns.exists(path)

    def devices(self):
        found = {(cid, ifname, 'host')
                 for cid, ifname in binding.tagged_host_devices(self.host)}
        for name in self.made[1:]:
            path = '/run/netns/' + name
            if not netns.exists(path):
                continue
            with netns.open_netns(path) as fd, netns.iproute(fd) as ipr:
                for link in ipr.get_links():
                    tag = owner_tag.parse_alias(link.get_attr('IFLA_IFALIAS'))
                    if tag:
                        found.add((tag[0], tag[1], path))
        return found

    def close(self):
        for name in self.made:
            subprocess.run([IP, 'netns', 'delete', name], capture_output=True, timeout=30)


class KernelProtocol(real_protocol.Protocol):
    node_class = KernelNode


settings.register_profile(
    'model-kernel-ci', derandomize=True, database=None, max_examples=20, stateful_step_count=25,
    deadline=None, suppress_health_check=list(HealthCheck))
settings.register_profile(
    'model-kernel-long', max_examples=200, stateful_step_count=40, deadline=None,
    suppress_health_check=list(HealthCheck))

TestRealProtocolKernel = KernelProtocol.TestCase
TestRealProtocolKernel.settings = settings.get_profile(
    'model-kernel-' + ('long' if os.environ.get('KURYR_CNI_MODEL_LONG') == '1' else 'ci'))
