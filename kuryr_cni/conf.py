"""Every configuration option of the daemon, and nothing else.

Options are registered explicitly by :func:`register` (never at import time), and
listed for oslo-config-generator by :func:`list_opts` (the ``oslo.config.opts``
entry point).
"""

import socket

from oslo_config import cfg
from oslo_log import log as logging

cni_daemon_opts = [
    cfg.StrOpt('node_name', default=socket.gethostname(), sample_default='<hostname>',
               help='Name of this node as Kubernetes knows it; only pods with '
                    'spec.nodeName equal to it are watched.'),
    cfg.StrOpt('socket', default='/run/kuryr-cni/daemon.sock',
               help='Unix socket the CNI shim talks to, the only way into the '
                    'daemon\'s CNI API. Its directory is created 0700 and the '
                    'socket 0600; both must belong to root, and a connection '
                    'from any other uid is closed unanswered.'),
    cfg.IntOpt('worker_count', default=4, min=1, max=64,
               help='Number of pre-forked CNI worker processes.'),
    cfg.IntOpt('worker_concurrency', default=32, min=1, max=1024,
               help='Requests one worker serves at once (its request threads). '
                    'A worker accepts connections only while one of them is '
                    'free; further connections wait in the listen backlog for '
                    'a free worker.'),
    cfg.IntOpt('worker_connections', default=128, min=2, max=4096,
               help='Connections one worker reads requests from (or writes '
                    'answers to) at once, besides the requests it serves. At '
                    'the cap, the connection accepted longest ago whose request '
                    'is still incomplete is dropped to make room for a new one. '
                    'While every worker is at its cap the daemon is not ready '
                    '("CNI socket saturated"). Each connection takes a file '
                    'descriptor of the worker.'),
    cfg.IntOpt('vif_timeout', default=60, min=1, max=600,
               help='Seconds an ADD waits for its pod and every VIF of it to be '
                    'present and active before failing with CNI code 11.'),
    cfg.IntOpt('request_timeout', default=100, min=5, max=3600,
               help='Deadline of one CNI request inside the daemon, in seconds. '
                    'Keep it under the shim\'s "timeout" (110) and kubelet\'s 120.'),
    cfg.IntOpt('client_head_timeout', default=2, min=1, max=60,
               help='Seconds a client of the CNI socket has, once accepted, to '
                    'send its request line and headers (the shim sends its '
                    'whole request at once). A client that sends nothing, or '
                    'trickles, is dropped after it.'),
    cfg.IntOpt('client_timeout', default=15, min=1, max=300,
               help='Seconds a client of the CNI socket has, once accepted, to '
                    'send its whole request, body included (at least '
                    'client_head_timeout).'),
    cfg.StrOpt('state_dir', default='/var/lib/kuryr-cni',
               help='Where pod bindings, per-pod lock files and the shim\'s DEL '
                    'queue live. Must match the CNI config\'s "state_dir".'),
    cfg.StrOpt('vif_source', default='annotation', choices=['annotation', 'kuryrport'],
               help='Where pod VIFs come from: the kuryr.openstack.org/vifs pod '
                    'annotation, or KuryrPort custom resources.'),
]

kubernetes_opts = [
    cfg.StrOpt('api_root', default=None,
               help='Kubernetes API URL, e.g. https://10.0.0.1:6443. When neither '
                    'this nor kubeconfig is set, in-cluster configuration is used.'),
    cfg.StrOpt('kubeconfig', default=None, help='Path of a kubeconfig file.'),
    cfg.StrOpt('token_file', default=None, help='File holding the bearer token.'),
    cfg.StrOpt('ca_file', default=None, help='CA bundle to verify the API server.'),
    cfg.IntOpt('watch_timeout', default=300, min=10, max=3600,
               help='Seconds after which the API server ends a watch, which is '
                    'then resumed from the last resourceVersion.'),
]

binding_opts = [
    cfg.StrOpt('ovsdb_connection', default='unix:/run/openvswitch/db.sock',
               help='OVSDB server connection used by the ovs binding.'),
    cfg.StrOpt('link_iface', default=None,
               help='Default parent interface of vlan and macvlan VIFs that name none.'),
    cfg.StrOpt('ipv6_link_local', default='with-ipv6', choices=[
        ('with-ipv6', 'only pod interfaces whose VIF has an IPv6 address get one'),
        ('always', 'every pod interface gets one, as the kernel would')],
        help='Which pod interfaces get the kernel\'s IPv6 link-local address. '
             'With it come duplicate address detection, multicast listener '
             'reports and router solicitations that repeat for the life of the '
             'pod, and a bridge floods each of them to every other pod: on an '
             'IPv4-only network, CPU spent on every pod for each pod started, '
             'for an address only IPv6 link-local traffic between pods uses.'),
]

health_opts = [
    cfg.HostAddressOpt('host', default='0.0.0.0', help='Address of /alive and /ready.'),
    cfg.PortOpt('port', default=8090, help='Port of /alive and /ready.'),
    cfg.IntOpt('heartbeat_timeout', default=30, min=2, max=600,
               help='Seconds without a heartbeat from a CNI worker\'s accept loop or '
                    'from the watcher process after which it counts as stuck: with '
                    'no CNI worker serving, or the watcher stuck, /alive answers 503 '
                    'and the systemd watchdog pings stop.'),
]

prometheus_opts = [
    cfg.HostAddressOpt('host', default='0.0.0.0', help='Address of /metrics.'),
    cfg.PortOpt('port', default=9655, help='Port of /metrics.'),
]

_GROUPS = (
    ('cni_daemon', cni_daemon_opts),
    ('kubernetes', kubernetes_opts),
    ('binding', binding_opts),
    ('health', health_opts),
    ('prometheus', prometheus_opts),
)


def list_opts():
    return [(group, list(opts)) for group, opts in _GROUPS]


def register(conf):
    """Register every option on ``conf`` (logging's included)."""
    logging.register_options(conf)
    for group, opts in _GROUPS:
        conf.register_opts(opts, group=group)
    return conf


def load(argv, conf=None):
    """Parse ``argv`` (without the program name) into a fresh ConfigOpts."""
    conf = register(conf or cfg.ConfigOpts())
    conf(argv, project='kuryr-cni', prog='kuryr-cni-daemon')
    return conf
