"""What a kuryr-kubernetes ``kuryr.conf`` holds that kuryr-cni does not read as its own.

A kuryr-kubernetes deployment keeps one ``kuryr.conf`` (its ``kuryr-config``
ConfigMap) for kuryr-controller and kuryr-daemon alike. The options of it that
mean the same here are oslo.config deprecated names of ours
(:mod:`kuryr_cni.conf`); this module knows the rest of kuryr-kubernetes' (and
kuryr-lib's, os-vif's) names, so that :func:`kuryr_cni.conf.validate` can
ignore them, saying why, and still refuse a name nobody defines: a typo.

:func:`judge` is the one question: is this name upstream's, and what does it
mean for kuryr-cni? Names are those of kuryr-kubernetes up to its last
release, the options its DevStack plugin writes included.
"""

import typing


class Ignored(typing.NamedTuple):
    """An upstream option read by nobody here: the controller's, or the old daemon's."""

    controller: bool        # kuryr-controller's alone (an INFO), else the old daemon's (a WARNING)
    why: str = ''


_CONTROLLER = Ignored(True)

# Why the old daemon's options mean nothing here.
_PRIVSEP = ('the daemon runs privileged and plugs with pyroute2 and OVSDB itself; '
            'os-vif\'s privsep helper is not used')
_WATCH = 'the watch is ended by the API server every [kubernetes] watch_timeout s and resumed'
_BY_KIND = 'each VIF is plugged by the driver of its kind, as kuryr-controller wrote it'
_NETNS = 'network namespaces are found by the path the runtime gives (CNI_NETNS)'
_BOUNDED = 'netlink and OVSDB calls are bounded by [cni_daemon] request_timeout'
_LOCKS = 'per-pod locks live in [cni_daemon] state_dir'
_MEMORY = 'limit the memory of the container or the systemd unit (MemoryMax=) instead'
_BRIDGE = 'ports are plugged into the bridge the VIF names'

# Groups only kuryr-controller reads.
CONTROLLER_GROUPS = frozenset({
    'neutron', 'neutron_defaults', 'octavia_defaults', 'cache_defaults', 'subnet_caching',
    'nodes_caching', 'node_driver_caching', 'pool_manager', 'health_server',
    'namespace_subnet', 'vif_pool', 'pod_vif_nested', 'keystone_authtoken',
    'kuryr-kubernetes', 'sriov', 'ingress',
})

# Groups of the old daemon's (kuryr-daemon, os-vif) with no meaning here.
_DAEMON_GROUPS = {
    'vhostuser': 'vhost-user ports are not supported',
    'nested_dpdk': 'DPDK ports are not supported',
    'vif_plug_ovs_privileged': _PRIVSEP,
    'vif_plug_linux_bridge_privileged': _PRIVSEP,
    'oslo_concurrency': _LOCKS,
}

_KUBERNETES_CONTROLLER = (
    'pod_project_driver', 'service_project_driver', 'namespace_project_driver',
    'network_policy_project_driver', 'pod_subnets_driver', 'service_subnets_driver',
    'pod_security_groups_driver', 'service_security_groups_driver', 'pod_vif_driver',
    'endpoints_lbaas_driver', 'endpoints_driver_octavia_provider', 'vif_pool_driver',
    'nodes_subnets_driver', 'port_debug', 'service_public_ip_driver', 'enable_manager',
    'enabled_handlers', 'controller_ha', 'controller_ha_elector_port',
    # Written by kuryr-kubernetes' DevStack plugin, though no option has that name.
    'controller_ha_port',
    'network_policy_driver', 'multi_vif_drivers', 'additional_ifname_prefix',
)

# (group, option) -> why it means nothing here, for the old daemon's options
# in groups kuryr-cni also has (or reads a deprecated name from).
_DAEMON_OPTIONS = {
    ('DEFAULT', 'bindir'): 'there are no binding executables',
    ('DEFAULT', 'lock_path'): _LOCKS,
    ('cni_daemon', 'daemon_enabled'): 'kuryr-cni is always a daemon',
    ('cni_daemon', 'bind_address'):
        'the shim reaches the daemon over the unix socket [cni_daemon] socket, never TCP',
    ('cni_daemon', 'docker_mode'): _NETNS,
    ('cni_daemon', 'netns_proc_dir'): _NETNS,
    ('cni_daemon', 'pyroute2_timeout'): _BOUNDED,
    ('cni_daemon', 'cni_failures_count'):
        'a failing request makes no process unhealthy; /alive and /ready judge the workers '
        'and the watcher themselves',
    ('kubernetes', 'watch_retry_timeout'):
        'the watch is retried for as long as the daemon runs, with backoff',
    ('kubernetes', 'watch_connection_timeout'): _WATCH,
    ('kubernetes', 'watch_read_timeout'): _WATCH,
    ('kubernetes', 'watch_reconcile_period'): _WATCH,
    ('binding', 'default_driver'): _BY_KIND,
    ('binding', 'driver'): _BY_KIND,
    ('binding', 'enabled_drivers'): _BY_KIND,
    ('binding', 'veth_dst_prefix'): 'the pod side is named by the runtime (CNI_IFNAME)',
    ('cni_health_server', 'max_memory_usage'): _MEMORY,
    ('cni_health_server', 'cg_path'): _MEMORY,
    ('os_vif_ovs', 'ovs_vsctl_timeout'): _BOUNDED,
    ('os_vif_ovs', 'timeout'): _BOUNDED,
    ('os_vif_ovs', 'ovsdb_interface'): 'OVSDB is always spoken natively',
    ('os_vif_ovs', 'per_port_bridge'): _BRIDGE,
    ('os_vif_ovs', 'isolate_vif'): _BRIDGE,
    ('os_vif_ovs', 'default_qos_type'): 'QoS is not set on ports',
}

# kuryr-controller's options in groups kuryr-cni also has.
_CONTROLLER_OPTIONS = {
    ('DEFAULT', 'pybasedir'), ('DEFAULT', 'subnetpool_name_prefix'),
    ('DEFAULT', 'deployment_type'), ('prometheus_exporter', 'controller_exporter_port'),
} | {('kubernetes', name) for name in _KUBERNETES_CONTROLLER}


def judge(group, option):
    """:class:`Ignored` for an upstream ``[group] option`` kuryr-cni does not read, else None.

    None for a name upstream does not define either: the caller refuses it.
    """
    if group in CONTROLLER_GROUPS or (group, option) in _CONTROLLER_OPTIONS:
        return _CONTROLLER
    why = _DAEMON_GROUPS.get(group) or _DAEMON_OPTIONS.get((group, option))
    return Ignored(False, why) if why else None


def is_upstream_group(group):
    """Whether ``group`` is one of upstream's that kuryr-cni neither has nor reads from."""
    return group in CONTROLLER_GROUPS or group in _DAEMON_GROUPS
