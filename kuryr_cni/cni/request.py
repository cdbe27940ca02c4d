"""Parse and validate one CNI request body, as forwarded by the shim.

The body is ``{CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_ARGS,
CNI_PATH, config}``. Everything is checked here, before any state or kernel is
touched; a bad value raises the CNI error with the code the spec gives it.
Whether CNI_NETNS really is a network namespace is checked by the handler
(it needs the filesystem), right after this.
"""

import dataclasses
import json
import re

from kuryr_cni import cni
from kuryr_cni import errors
from kuryr_cni import vif as vif_model

MAX_BODY_BYTES = 1024 * 1024

_CONTAINER_ID = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z')
_NETWORK_NAME = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z')
_K8S_NAMESPACE = re.compile(r'^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z')
_K8S_NAME = re.compile(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z')
_K8S_UID = re.compile(r'^[A-Za-z0-9][A-Za-z0-9-]{0,127}\Z')
_ENV_KEYS = ('CNI_COMMAND', 'CNI_CONTAINERID', 'CNI_NETNS', 'CNI_IFNAME', 'CNI_ARGS', 'CNI_PATH')


@dataclasses.dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str | None = None

    @property
    def key(self):
        return '%s/%s' % (self.namespace, self.name)


@dataclasses.dataclass(frozen=True)
class Request:
    command: str
    cni_version: str
    network: str
    container_id: str | None
    netns: str | None
    ifname: str | None
    pod: PodRef | None
    config: dict

    @property
    def prev_result(self):
        return self.config.get('prevResult')


def error_version(body):
    """The cniVersion to answer errors in: the request's when it is one we speak."""
    config = body.get('config') if isinstance(body, dict) else None
    version = config.get('cniVersion') if isinstance(config, dict) else None
    return version if version in cni.SUPPORTED_VERSIONS else cni.SUPPORTED_VERSIONS[-1]


def decode(raw):
    """Decode the raw HTTP body into a JSON object (CNI code 6 when it is not one)."""
    if len(raw) > MAX_BODY_BYTES:
        raise errors.BodyTooLarge('request body larger than %d bytes' % MAX_BODY_BYTES)
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:   # too deeply nested
        raise errors.DecodeFailure('request body is not JSON', str(exc)) from None
    if not isinstance(body, dict):
        raise errors.DecodeFailure('request body is not a JSON object')
    return body


def parse(body, expected_command=None):
    """Validate a decoded body into a :class:`Request`."""
    env = _environment(body)
    config = _config(body.get('config'))
    command = env['CNI_COMMAND']
    if command not in cni.COMMANDS:
        raise errors.InvalidEnvironment('CNI_COMMAND %r is not one of %s'
                                        % (command, ', '.join(cni.COMMANDS)))
    if expected_command and command != expected_command:
        raise errors.InvalidEnvironment('CNI_COMMAND %s sent to the %s endpoint'
                                        % (command, expected_command))
    version = config['cniVersion']
    _check_command_version(command, version)
    needs_sandbox = command in ('ADD', 'DEL', 'CHECK')
    return Request(
        command=command,
        cni_version=version,
        network=config['name'],
        container_id=_container_id(env['CNI_CONTAINERID'], needs_sandbox),
        netns=_netns(env['CNI_NETNS'], command in ('ADD', 'CHECK')),
        ifname=_ifname(env['CNI_IFNAME'], needs_sandbox),
        pod=_pod(parse_args(env['CNI_ARGS']), command),
        config=config,
    )


def parse_args(text):
    """Parse CNI_ARGS ``K=V;K=V``; unknown keys are kept and ignored by callers."""
    args = {}
    if not text:
        return args
    if len(text) > 4096:
        raise errors.InvalidEnvironment('CNI_ARGS longer than 4096 characters')
    for item in text.split(';'):
        key, sep, value = item.partition('=')
        if not sep or not key or '=' in value:
            raise errors.InvalidEnvironment('CNI_ARGS item %r is not KEY=VALUE' % item)
        args[key] = value
    return args


def _environment(body):
    env = {}
    for key in _ENV_KEYS:
        value = body.get(key, '')
        if value is None:
            value = ''
        if not isinstance(value, str) or '\0' in value or len(value) > 4096:
            raise errors.InvalidEnvironment('%s must be a string' % key)
        env[key] = value
    return env


def _config(config):
    if not isinstance(config, dict):
        raise errors.InvalidConfig('the network configuration is missing or not a JSON object')
    version = config.get('cniVersion')
    if not isinstance(version, str) or version not in cni.SUPPORTED_VERSIONS:
        raise errors.IncompatibleVersion(
            'cniVersion %r is not supported' % (version,),
            'supported: %s' % ', '.join(cni.SUPPORTED_VERSIONS))
    name = config.get('name')
    if not isinstance(name, str) or not _NETWORK_NAME.match(name):
        raise errors.InvalidConfig('network "name" %r is missing or invalid' % (name,))
    prev = config.get('prevResult')
    if prev is not None and not isinstance(prev, dict):
        raise errors.InvalidConfig('prevResult must be a JSON object')
    # The ADD result is built on these (kuryr_cni.cni.result), after plugging.
    for key, kind in (('interfaces', list), ('ips', list), ('routes', list), ('dns', dict)):
        if (prev or {}).get(key) is not None and not isinstance(prev[key], kind):
            raise errors.InvalidConfig('prevResult "%s" must be a JSON %s'
                                       % (key, 'array' if kind is list else 'object'))
    return config


def _check_command_version(command, version):
    required = {'CHECK': '0.4.0', 'GC': '1.1.0', 'STATUS': '1.1.0'}.get(command)
    if required and cni.version_tuple(version) < cni.version_tuple(required):
        raise errors.IncompatibleVersion('%s needs cniVersion %s or later, not %s'
                                         % (command, required, version))


def _container_id(value, required):
    if not value:
        if required:
            raise errors.InvalidEnvironment('CNI_CONTAINERID is required')
        return None
    if not _CONTAINER_ID.match(value):
        raise errors.InvalidEnvironment('CNI_CONTAINERID %r is invalid' % value[:140])
    return value


def _netns(value, required):
    if not value:
        if required:
            raise errors.InvalidEnvironment('CNI_NETNS is required')
        return None
    if not value.startswith('/'):
        raise errors.InvalidEnvironment('CNI_NETNS %r is not an absolute path' % value)
    return value


def _ifname(value, required):
    if not value:
        if required:
            raise errors.InvalidEnvironment('CNI_IFNAME is required')
        return None
    if not vif_model.valid_ifname(value):
        raise errors.InvalidEnvironment('CNI_IFNAME %r is not a valid interface name' % value)
    return value


def _pod(args, command):
    name = args.get('K8S_POD_NAME', '')
    if not name:
        if command == 'ADD':
            raise errors.InvalidEnvironment('CNI_ARGS has no K8S_POD_NAME')
        return None
    namespace = args.get('K8S_POD_NAMESPACE') or 'default'
    uid = args.get('K8S_POD_UID') or None
    if not _K8S_NAMESPACE.match(namespace):
        raise errors.InvalidEnvironment('K8S_POD_NAMESPACE %r is invalid' % namespace)
    if len(name) > 253 or not _K8S_NAME.match(name):
        raise errors.InvalidEnvironment('K8S_POD_NAME %r is invalid' % name[:260])
    if uid is not None and not _K8S_UID.match(uid):
        raise errors.InvalidEnvironment('K8S_POD_UID %r is invalid' % uid[:140])
    return PodRef(namespace, name, uid)
