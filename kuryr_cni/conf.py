"""Every configuration option of the daemon, and its validation.

Options are registered explicitly by :func:`register` (never at import time), and
listed for oslo-config-generator by :func:`list_opts` (the ``oslo.config.opts``
entry point). :func:`load` parses the command line and the files;
:func:`validate` then checks everything oslo.config would only find when a
value is first read, or never: every value, unknown groups and options, and
the paths the daemon needs. Both raise :class:`ConfigError`, whose message is
the one line an operator needs: the file, the option and the problem.
"""

import argparse
import contextlib
import difflib
import glob
import io
import os
import re
import socket
import sys
import typing

from oslo_config import cfg
from oslo_log import log as logging

from kuryr_cni import kuryrconf
from kuryr_cni import version

DEFAULT_WORKERS = 4     # [cni_daemon] worker_count, and the most worker_num is read as

cni_daemon_opts = [
    cfg.StrOpt('node_name', sample_default='<KUBERNETES_NODE_NAME, else the host name>',
               help='Name of this node as Kubernetes knows it; only pods with '
                    'spec.nodeName equal to it are watched. Unset, it is the '
                    'environment\'s KUBERNETES_NODE_NAME (as kuryr-kubernetes\' '
                    'DaemonSet passes it), else the host name in lower case (as '
                    'kubelet names the node).'),
    cfg.StrOpt('socket', default='/run/kuryr-cni/daemon.sock',
               help='Unix socket the CNI shim talks to, the only way into the '
                    'daemon\'s CNI API. Its directory is created 0700 and the '
                    'socket 0600; both must belong to root, and a connection '
                    'from any other uid is closed unanswered.'),
    cfg.IntOpt('worker_count', default=DEFAULT_WORKERS, min=1, max=64,
               deprecated_name='worker_num',
               help='Number of pre-forked CNI worker processes, each resident and '
                    'serving worker_concurrency requests at once. Read from '
                    'kuryr-kubernetes\' worker_num (the most processes it forked '
                    'at once, one per request) up to %d.' % DEFAULT_WORKERS),
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
               deprecated_name='vif_annotation_timeout',
               help='Seconds an ADD waits for its pod and every VIF of it to be '
                    'present and active before failing with CNI code 11. The plug '
                    'between the two waits does not count.'),
    cfg.StrOpt('ready_signal', default='first', choices=[
        ('first', 'for each VIF, whichever comes first: active from the VIF source, or '
                  '(ovs VIFs) ovn-installed on its Open vSwitch Interface'),
        ('ovn-installed', 'ovs VIFs: ovn-installed alone (for VIF sources that never mark '
                          'them active; only on OVN nodes); other VIFs: active'),
        ('active', 'active from the VIF source alone, as kuryr-daemon does')],
               help='When an ADD answers, once its VIFs are plugged. ovn-controller sets '
                    'external_ids:ovn-installed=true on a pod\'s OVS Interface once every '
                    'flow of the port, its security groups\' included, is installed: the '
                    'pod\'s network then works, seconds before Neutron\'s ACTIVE reaches '
                    'the KuryrPort through kuryr-controller. Either signal is waited for '
                    'within vif_timeout.'),
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
    cfg.StrOpt('unprivileged_user', default='nobody',
               help='User the watcher and ops processes run as once their sockets '
                    'and files are open: they parse what the API server and the '
                    'network send, so they drop root and every capability. A user '
                    'name (with its primary group) or a number (uid and gid alike); '
                    'never root. A dedicated user is better than the shared '
                    'nobody. The API token file must stay readable by it (it is '
                    're-read when rotated); see the security guide.'),
    cfg.StrOpt('vif_source', default='kuryrport', choices=[
        ('kuryrport', 'KuryrPort custom resources, as kuryr-controller writes them'),
        ('annotation', 'the kuryr.openstack.org/vifs pod annotation, for clusters '
                       'without kuryr-controller: whoever may edit a pod\'s annotations '
                       'chooses its network (see the security guide)')],
               help='Where pod VIFs come from.'),
]

kubernetes_opts = [
    cfg.StrOpt('api_root', default=None,
               help='Kubernetes API URL, e.g. https://10.0.0.1:6443. When neither '
                    'this nor kubeconfig is set, in-cluster configuration is used.'),
    cfg.StrOpt('kubeconfig', default=None, help='Path of a kubeconfig file.'),
    cfg.StrOpt('token_file', default=None,
               help='File holding the bearer token sent to api_root. Unset, it is '
                    'the service account\'s token file, as in kuryr-kubernetes, '
                    'when it exists (and no client_cert_file is set); an HTTPS '
                    'api_root without any credential is refused at start. Empty '
                    '(token_file = "") sends no token.'),
    cfg.StrOpt('ca_file', default=None, deprecated_name='ssl_ca_crt_file',
               help='CA bundle to verify the API server at api_root. Unset, it '
                    'is the service account\'s ca.crt, as in kuryr-kubernetes, '
                    'when it exists, else the system\'s CA certificates.'),
    cfg.BoolOpt('verify_server_cert', default=True, deprecated_name='ssl_verify_server_crt',
                help='Verify the certificate of the API server at api_root. '
                     'kuryr-kubernetes\' ssl_verify_server_crt defaults to false; '
                     'this does not.'),
    cfg.StrOpt('client_cert_file', default=None, deprecated_name='ssl_client_crt_file',
               help='Client certificate presented to the API server at api_root.'),
    cfg.StrOpt('client_key_file', default=None, deprecated_name='ssl_client_key_file',
               help='Key of client_cert_file.'),
    cfg.IntOpt('watch_timeout', default=300, min=10, max=3600,
               help='Seconds after which the API server ends a watch, which is '
                    'then resumed from the last resourceVersion.'),
    cfg.IntOpt('list_max_bytes', default=64 * 1024 * 1024, min=1024 * 1024,
               help='Largest list answer (bytes) the watcher reads: a node\'s pods, or '
                    'its KuryrPorts. The default holds 250 pods of 256 KiB each. A '
                    'larger answer is refused and retried after a backoff, and /ready '
                    'fails meanwhile.'),
    cfg.BoolOpt('use_events', default=True,
                help='Post Kubernetes Events on pods whose ADD waits for their VIFs '
                     'or times out (CNIWaitingForActiveVIFs and the like), as '
                     'kuryr-kubernetes\' option of this name does. Each is an object '
                     'etcd keeps for an hour.'),
    cfg.IntOpt('list_timeout', default=120, min=10, max=3600,
               help='Seconds a whole list answer may take, however its bytes trickle '
                    'in; a slower one is cut, and retried after a backoff.'),
]

binding_opts = [
    cfg.StrOpt('ovsdb_connection', default='unix:/run/openvswitch/db.sock',
               deprecated_opts=[cfg.DeprecatedOpt('ovsdb_connection', group='os_vif_ovs')],
               help='OVSDB server connection used by the ovs binding.'),
    cfg.StrOpt('link_iface', default=None,
               help='Parent interface of vlan and macvlan VIFs that name none. '
                    'Unset, it is found as kuryr-kubernetes finds it: the interface '
                    'holding the address kubelet listens on (port 10250), else the '
                    'first interface that is not a loopback.'),
    cfg.ListOpt('bridges', default=['kuryr-br0', 'br-int', 'qbr*'],
                help='The bridges a VIF may name, as names or shell patterns '
                     '(fnmatch, case-sensitive). A bridge or ovs VIF naming a bridge '
                     'that matches none, or an ovs-hybrid VIF whose per-port qbr '
                     'bridge or integration bridge matches none, is refused (CNI '
                     'code 7) before anything is changed. The daemon never creates '
                     'these bridges (only the per-port qbr bridge of an ovs-hybrid '
                     'VIF, created and removed with its port); they must exist.'),
    cfg.ListOpt('required_bridges', default=[],
                deprecated_opts=[cfg.DeprecatedOpt('ovs_bridge', group='neutron_defaults')],
                help='Bridges that must exist in the daemon\'s network namespace for it '
                     'to be ready: /ready fails naming each one missing (e.g. br-int on '
                     'Open vSwitch nodes, whose ADDs would all fail without it). Read from '
                     'kuryr-kubernetes\' [neutron_defaults] ovs_bridge, which kuryr-daemon '
                     'checked before each plug.'),
    cfg.IntOpt('network_device_mtu', default=0, min=0, max=65535,
               deprecated_opts=[cfg.DeprecatedOpt('network_device_mtu',
                                                  group='neutron_defaults')],
               help='Largest MTU of a pod interface (and of its host end): a VIF whose '
                    'network has a larger one gets this one. 0: the VIF\'s own. '
                    'kuryr-kubernetes\' [neutron_defaults] network_device_mtu, with its '
                    'meaning.'),
    cfg.BoolOpt('adopt', default=True,
                help='Take over the pods kuryr-daemon plugged on this node: devices '
                     'proven a pod\'s VIF (its OVS row with the VIF\'s iface-id and '
                     'attached-mac, its pod end with the VIF\'s MAC) are recorded as '
                     'their sandbox\'s binding, so its DEL removes them and a new '
                     'sandbox evicts them. Off, they are left as they are, and are '
                     'leftovers to remove by hand once their pods are gone.'),
    cfg.ListOpt('parents', default=[],
                help='Parent interfaces a vlan or macvlan VIF may name besides '
                     'link_iface, as names or shell patterns. A VIF naming any '
                     'other parent is refused (CNI code 7) before anything is '
                     'changed; a VIF naming none uses link_iface (or the interface '
                     'found in its place).'),
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

_ANY_HOST = ('The default, ::, serves IPv6 and IPv4 alike; where IPv6 is off '
             'it falls back to 0.0.0.0.')

health_opts = [
    cfg.HostAddressOpt('host', default='::', help='Address of /alive and /ready. ' + _ANY_HOST),
    cfg.PortOpt('port', default=8090,
                deprecated_opts=[cfg.DeprecatedOpt('port', group='cni_health_server')],
                help='Port of /alive and /ready.'),
    cfg.IntOpt('heartbeat_timeout', default=30, min=2, max=600,
               help='Seconds without a heartbeat from a CNI worker\'s accept loop or '
                    'from the watcher process after which it counts as stuck: with '
                    'no CNI worker serving, or the watcher stuck, /alive answers 503 '
                    'and the systemd watchdog pings stop.'),
]

prometheus_opts = [
    cfg.HostAddressOpt('host', default='::', help='Address of /metrics. ' + _ANY_HOST),
    cfg.PortOpt('port', default=9655,
                deprecated_opts=[cfg.DeprecatedOpt('cni_exporter_port',
                                                   group='prometheus_exporter')],
                help='Port of /metrics.'),
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
    # Read at registration, not at import: the environment is the process's.
    conf.set_default('node_name', default_node_name(), group='cni_daemon')
    return conf


def default_node_name():
    """KUBERNETES_NODE_NAME, as kuryr-kubernetes' image reads it, else the lowercased host name."""
    return os.environ.get('KUBERNETES_NODE_NAME') or socket.gethostname().lower()


class ConfigError(Exception):
    """The configuration cannot be used; the message names the file, option and problem."""


def _unset_or_file(path):
    # kuryr-kubernetes' DevStack plugin writes `token_file = ""` to mean "none".
    return path == '' or os.path.isfile(path)


# What oslo.config's types cannot express: (group, option) -> (check, problem).
_SEMANTICS = {
    ('cni_daemon', 'node_name'): (bool, 'must not be empty'),
    ('cni_daemon', 'socket'): (os.path.isabs, 'must be an absolute path'),
    ('cni_daemon', 'state_dir'): (os.path.isabs, 'must be an absolute path'),
    ('kubernetes', 'kubeconfig'): (_unset_or_file, 'no such file'),
    ('kubernetes', 'token_file'): (_unset_or_file, 'no such file'),
    ('kubernetes', 'ca_file'): (_unset_or_file, 'no such file'),
    ('kubernetes', 'client_cert_file'): (_unset_or_file, 'no such file'),
    ('kubernetes', 'client_key_file'): (_unset_or_file, 'no such file'),
}


def load(argv, conf=None, prog='kuryr-cni-daemon'):
    """Parse ``argv`` (without the program name) into a fresh ConfigOpts.

    ``--version`` prints ``prog`` and the version and exits. Raises
    :class:`ConfigError` for a config file that is missing or unreadable,
    or cannot be parsed.
    """
    conf = register(conf or cfg.ConfigOpts())
    try:
        _parse(conf, argv, prog)
    except cfg.ConfigFilesNotFoundError as exc:
        raise ConfigError('%s: no such file, or not readable'
                          % ', '.join(exc.config_files)) from None
    except cfg.ConfigFileParseError as exc:
        raise ConfigError('%s: %s' % (exc.config_file, exc.msg)) from None
    except cfg.Error as exc:
        raise ConfigError(str(exc)) from None
    return conf


def _parse(conf, argv, prog):
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            conf(argv, project='kuryr-cni', prog=prog, version='%(prog)s ' + version.VERSION)
    except SystemExit as exc:
        # oslo.config checks the file values of the options the command line
        # also takes (oslo.log's) at once, and exits 1 after a line of its own.
        bad_value = re.fullmatch(r'argument --(\S+): (Invalid .*)\n', stderr.getvalue())
        if exc.code == 1 and bad_value:
            raise ConfigError('%s: [DEFAULT] %s: %s' % (
                _files_named_in(argv), *bad_value.groups())) from None
        sys.stderr.write(stderr.getvalue())
        raise
    sys.stderr.write(stderr.getvalue())


def _files_named_in(argv):
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument('--config-file', action='append', default=[])
    known, _ = parser.parse_known_args(argv)
    return ', '.join(known.config_file) or 'the configuration file'


class Note(typing.NamedTuple):
    """Something the operator should read once logging is set up: level and message."""

    level: int
    message: str


def validate(conf):
    """Raise :class:`ConfigError` for the first problem of a loaded configuration.

    Unknown groups and options in the files (a typo would otherwise leave an
    option silently at its default), values their option refuses, and the
    checks of ``_SEMANTICS``; nothing is created or changed. Returns the
    :class:`Note` list of what was read under kuryr-kubernetes' names or
    ignored as theirs (:mod:`kuryr_cni.kuryrconf`), for the caller to log.
    """
    where, notes, spelled_upstream = _check_names(conf)
    # oslo.config would report each deprecated name once, before logging is set up.
    with _quiet_deprecations():
        for group, name in _every_option(conf):
            try:
                value = conf[name] if group == 'DEFAULT' else conf[group][name]
            except cfg.ConfigSourceValueError as exc:
                problem = str(exc).rpartition(' is not valid: ')[2]
                raise ConfigError(_line(where, group, name, problem)) from None
            check, problem = _SEMANTICS.get((group, name), (None, None))
            if check and value is not None and not check(value):
                raise ConfigError(_line(where, group, name, '%r %s' % (value, problem)))
        if conf.kubernetes.api_root:
            notes += _api_credentials_notes(conf.kubernetes, where)
        notes += _upstream_meanings(conf, where, spelled_upstream)
    return notes


# kuryr-kubernetes' defaults of [kubernetes] token_file and ssl_ca_crt_file: the
# service account's files, whether or not the daemon ran in a pod.
SERVICE_ACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount'


def api_credentials(k8s):
    """(token file, CA file) of requests to ``[kubernetes] api_root``; None for none.

    Each as set; unset (None), the service account's, as kuryr-kubernetes
    read them, where it exists (the token only without a client certificate).
    An empty string, upstream's way of saying none, stays none.
    """
    token, ca = k8s.token_file, k8s.ca_file
    if token is None and not k8s.client_cert_file:
        token = _service_account_file('token')
    if ca is None:
        ca = _service_account_file('ca.crt')
    return token or None, ca or None


def _service_account_file(name):
    path = os.path.join(SERVICE_ACCOUNT_DIR, name)
    return path if os.path.isfile(path) else None


def _api_credentials_notes(k8s, where):
    """What an api_root is reached with, where kuryr-kubernetes' defaults decide it.

    Raises :class:`ConfigError` for an HTTPS api_root that would get requests
    without any credential: the file was written for a daemon that sent the
    service account's token by default.
    """
    notes = []
    token, ca = api_credentials(k8s)
    https = k8s.api_root.startswith('https://')
    if k8s.token_file is None and token:
        notes.append(Note(logging.INFO, '[kubernetes] token_file is not set: requests to '
                          '%s carry the service account\'s token %s, as kuryr-kubernetes\' '
                          'did' % (k8s.api_root, token)))
    elif not token and not k8s.client_cert_file:
        default_token = os.path.join(SERVICE_ACCOUNT_DIR, 'token')
        why = ('no token_file (it is empty)' if k8s.token_file == '' else
               'neither token_file nor client_cert_file, and no service account token %s '
               '(kuryr-kubernetes\' default token_file)' % default_token)
        if https and k8s.token_file is None:
            raise ConfigError(_line(where, 'kubernetes', 'api_root', 'is set with %s: its '
                                    'requests would be unauthenticated; set token_file '
                                    '(token_file = "" sends none)' % why))
        notes.append(Note(logging.WARNING, 'Requests to %s carry no credentials: %s%s' % (
            k8s.api_root, why, '' if https else ' (plain HTTP: a proxy must add them)')))
    if https and k8s.verify_server_cert and k8s.ca_file is None:
        notes.append(Note(logging.INFO, 'The API server\'s certificate is verified against '
                          + ('the service account\'s CA %s, as kuryr-kubernetes\' default '
                             'ssl_ca_crt_file' % ca if ca else
                             'the system\'s CA certificates ([kubernetes] ca_file is not '
                             'set, and there is no service account CA)')))
    if not k8s.verify_server_cert:
        notes.append(Note(logging.WARNING, 'The API server\'s certificate is not '
                          'verified ([kubernetes] verify_server_cert is false)'))
    return notes


def _upstream_meanings(conf, where, spelled_upstream):
    """Map options read under kuryr-kubernetes' names whose meaning differs here.

    ``spelled_upstream``: {(group, option): the upstream (group, name) its
    value was read from}. May override an option (the one change validation
    makes); returns one :class:`Note` for each such option, saying what it
    now means.
    """
    notes = []
    opts = conf.cni_daemon
    if spelled_upstream.get(('cni_daemon', 'worker_count')) == ('cni_daemon', 'worker_num'):
        # Upstream forked a process per request, up to worker_num at once (30 by
        # default); a resident worker here serves worker_concurrency requests at
        # once, and thirty of them would hold thirty Python heaps for good.
        asked = opts.worker_count
        workers = min(asked, DEFAULT_WORKERS)
        conf.set_override('worker_count', workers, group='cni_daemon')
        notes.append(Note(logging.WARNING if workers < asked else logging.INFO,
                          '%s = %d, kuryr-daemon\'s most processes forked at once (one per '
                          'request), is read as %d resident CNI workers serving up to %d '
                          'requests at once each ([cni_daemon] worker_count, at most %d '
                          'from worker_num)' % (_spelled(where, 'cni_daemon', 'worker_count'),
                                                asked, workers,
                                                opts.worker_concurrency, DEFAULT_WORKERS)))
    if (spelled_upstream.get(('binding', 'required_bridges')) == ('neutron_defaults', 'ovs_bridge')
            and conf.binding.link_iface):
        # kuryr-daemon checked ovs_bridge only in its Open vSwitch driver, which a
        # nested node (pods on VLANs of link_iface) never loads: a VM node has no br-int.
        conf.set_override('required_bridges', [], group='binding')
        notes.append(Note(logging.INFO, '%s is not required on this nested node ([binding] '
                          'link_iface = %s): kuryr-daemon checked it only for Open vSwitch '
                          'VIFs' % (_spelled(where, 'binding', 'required_bridges'),
                                    conf.binding.link_iface)))
    if opts.vif_timeout >= opts.request_timeout:
        notes.append(Note(logging.WARNING, '%s = %d is not shorter than [cni_daemon] '
                          'request_timeout (%d s): an ADD whose VIFs are late fails after '
                          'request_timeout, and kubelet retries it' % (
                              _spelled(where, 'cni_daemon', 'vif_timeout'),
                              opts.vif_timeout, opts.request_timeout)))
    return notes


@contextlib.contextmanager
def _quiet_deprecations():
    """Hold back oslo.config's own report of each deprecated name read.

    It would reach stderr before logging is set up; the notes of
    :func:`_check_names` say the same in the daemon's log.
    """
    oslo_config_log = cfg.LOG
    oslo_config_log.addFilter(_drop)
    try:
        yield
    finally:
        oslo_config_log.removeFilter(_drop)


def _drop(record):
    return False


def _every_option(conf):
    for key in conf:
        if isinstance(conf[key], cfg.ConfigOpts.GroupAttr):
            yield from ((key, name) for name in conf[key])
        else:
            yield 'DEFAULT', key


def _known_names(conf):
    """{group: option names}: ours, and the deprecated names they are read under."""
    known = {}
    for group, name in _every_option(conf):
        known.setdefault(group, set()).add(name)
    for group, opts in _GROUPS:
        for opt in opts:
            for old in opt.deprecated_opts:
                known.setdefault(old.group or group, set()).add(old.name or opt.name)
    return known


def _check_names(conf):
    """Refuse unknown groups and options.

    Returns ``({(group, option): "file: [group] name" that set it}, notes,
    {(group, option): (group, name) of kuryr-kubernetes' it was last read from})``,
    the notes saying which of kuryr-kubernetes' names were read as ours and which
    ignored (those whose meaning differs are left to :func:`_upstream_meanings`).
    """
    known = _known_names(conf)
    renamed = _renamed()
    where, notes, controller, spelled_upstream = {}, [], {}, {}
    for path in _config_files(conf):
        sections = {}
        cfg.ConfigParser(path, sections).parse()
        for section, options in sections.items():
            group = 'DEFAULT' if section.upper() == 'DEFAULT' else section
            if group in kuryrconf.CONTROLLER_GROUPS:
                # Named as a whole in the INFO line, but for the few options
                # kuryr-daemon read from it too (read under our names).
                controller.setdefault(section, [])
                options = [name for name in options if name in known.get(group, ())]
            if group not in known and not kuryrconf.is_upstream_group(group):
                raise ConfigError('%s: [%s]: unknown group%s' % (
                    path, section, _did_you_mean(section, known)))
            for name in options:
                if name in known.get(group, ()):
                    spelled = '%s: [%s] %s' % (path, section, name)
                    ours = renamed.get((group, name), (group, name))
                    if (group, name) in renamed:
                        read_as = 'read as [%s] %s' % ours
                        if (group, name) not in _MEANING_DIFFERS:
                            notes.append(Note(logging.INFO, '%s is %s' % (spelled, read_as)))
                        if where.get(ours) == '%s: [%s] %s' % (path, ours[0], ours[1]):
                            continue    # our name in the same file wins, as oslo.config reads it
                        spelled += ' (%s)' % read_as
                        spelled_upstream[ours] = (group, name)
                    else:
                        spelled_upstream.pop(ours, None)
                    where[ours] = spelled
                    continue
                ignored = kuryrconf.judge(group, name)
                if ignored is None:
                    raise ConfigError('%s: [%s] %s: unknown option%s' % (
                        path, section, name, _did_you_mean(name, known[group])))
                if ignored.controller:
                    controller.setdefault(section, []).append(name)
                else:
                    notes.append(Note(logging.WARNING, '%s: [%s] %s is ignored: %s' % (
                        path, section, name, ignored.why)))
    if controller:
        notes.append(Note(logging.INFO, 'Ignored as kuryr-controller\'s: %s' % '; '.join(
            ('[%s] %s' % (section, ', '.join(names))).strip()
            for section, names in controller.items())))
    return where, notes, spelled_upstream


# kuryr-kubernetes' names read as ours with a meaning of their own (_upstream_meanings).
_MEANING_DIFFERS = {('cni_daemon', 'worker_num')}


def _renamed():
    """{(old group, old name): (group, name)} of every deprecated name of ours."""
    return {(old.group or group, old.name or opt.name): (group, opt.name)
            for group, opts in _GROUPS for opt in opts for old in opt.deprecated_opts}


def _config_files(conf):
    files = list(conf.config_file or [])
    for directory in conf.config_dir or []:
        files += sorted(glob.glob(os.path.join(directory, '*.conf')))
    return files


def _did_you_mean(word, choices):
    close = difflib.get_close_matches(word, sorted(choices), n=1)
    return ' (did you mean %s?)' % close[0] if close else ''


def _spelled(where, group, name):
    """``[group] name`` as the operator wrote it: "file: [group] spelling", else ours."""
    return where.get((group, name), '[%s] %s' % (group, name)).split(' (read as ')[0]


def _line(where, group, name, problem):
    return '%s: %s' % (where.get((group, name), 'default: [%s] %s' % (group, name)), problem)
