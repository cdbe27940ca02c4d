"""Builds the official kubernetes ApiClient from the [kubernetes] options.

Only construction lives here: which API server, which credentials, which CA;
and :func:`describe_error`, how its callers put a failed request into words.
Requests, retries and timeouts belong to the callers (the list+watch, the
Events). The bearer token is never logged (:func:`clip` blanks it out of
whatever a server answers, for the callers' logs), and is stripped of surrounding
whitespace however it was read: a token file ending in a newline (as most
editors and ``echo`` write them) would otherwise put the newline into the
header, which urllib3 refuses with an error quoting the header's value.
"""

import json
import os
import traceback

from kubernetes import client
from kubernetes import config
from kubernetes.config import incluster_config
from oslo_log import log as logging
import urllib3

from kuryr_cni import conf as daemon_conf

LOG = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 500             # of an API error's message, in the logs


def from_options(k8s):
    """:func:`make_api_client` from the ``[kubernetes]`` option group ``k8s``.

    An api_root's token and CA files default to the service account's, as
    kuryr-kubernetes' did (:func:`kuryr_cni.conf.api_credentials`).
    """
    token_file, ca_file = daemon_conf.api_credentials(k8s)
    return make_api_client(api_root=k8s.api_root, kubeconfig=k8s.kubeconfig,
                           token_file=token_file, ca_file=ca_file,
                           verify_ssl=k8s.verify_server_cert, cert_file=k8s.client_cert_file,
                           key_file=k8s.client_key_file)


def make_api_client(api_root=None, kubeconfig=None, token_file=None, ca_file=None,
                    verify_ssl=True, cert_file=None, key_file=None):
    """Return a ``kubernetes.client.ApiClient``.

    ``api_root`` (with an optional bearer ``token_file``, ``ca_file`` and
    client certificate) wins; else ``kubeconfig``; else the in-cluster service
    account. Empty strings count as unset, as in kuryr-kubernetes' files.
    Raises ``kubernetes.config.ConfigException`` or ``OSError`` when the
    chosen source is unusable.
    """
    configuration = _Configuration()
    if api_root:
        configuration.host = api_root.rstrip('/')
        configuration.verify_ssl = verify_ssl
        if ca_file:
            configuration.ssl_ca_cert = ca_file
        if cert_file:
            configuration.cert_file = cert_file
            configuration.key_file = key_file or None
        if token_file:
            _use_token_file(configuration, token_file)
        source = 'api_root'
    elif kubeconfig:
        # persist_config=False: a daemon must not rewrite the operator's kubeconfig.
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration,
                                persist_config=False)
        source = 'kubeconfig %s' % kubeconfig
    else:
        # The token is read here, not by the client's loader: it refreshes it
        # by the clock rather than when the file changes, and keeps the newline.
        config.load_incluster_config(client_configuration=configuration,
                                     try_refresh_token=False)
        _use_token_file(configuration, incluster_config.SERVICE_TOKEN_FILENAME)
        source = 'in-cluster service account'
    # One retry inside urllib3 rescues a pooled connection the server has closed;
    # its default of three, without delay, would multiply every node's requests
    # while an API server restarts. The callers back off with jitter themselves.
    configuration.retries = 1
    LOG.info('Kubernetes API at %s (from %s)', configuration.host, source)
    api = client.ApiClient(configuration)
    if configuration.host.startswith('https://'):
        _load_tls_files_now(api.rest_client.pool_manager)
    return api


# What urllib3 would read from files at every new connection.
_TLS_FILES = ('ca_certs', 'ca_cert_data', 'cert_file', 'key_file')


def _load_tls_files_now(pool_manager):
    """Read the CA and the client certificate and key into one SSL context, now.

    urllib3 reads them from their files at every new connection; the watcher
    makes its client before it drops root (:mod:`kuryr_cni.daemon.privileges`)
    and reconnects long after, when those files (0600, or the temporary files
    of a kubeconfig's embedded data) are root's alone. The context also spares
    every reconnection the parsing of the CA bundle.
    """
    options = pool_manager.connection_pool_kw
    tls = {name: options.pop(name, None) for name in _TLS_FILES}
    context = urllib3.util.ssl_.create_urllib3_context(cert_reqs=options.get('cert_reqs'))
    if tls['ca_certs'] or tls['ca_cert_data']:
        context.load_verify_locations(cafile=tls['ca_certs'], cadata=tls['ca_cert_data'])
    else:
        context.load_default_certs()
    if tls['cert_file']:
        context.load_cert_chain(tls['cert_file'], keyfile=tls['key_file'])
    options['ssl_context'] = context


class _Configuration(client.Configuration):
    """The client's configuration, whose bearer token never carries whitespace.

    Every token passes through here on its way into a request header, whichever
    loader (kubeconfig ``token`` or ``tokenFile``, in-cluster, ``token_file``)
    read it and however it refreshes it.
    """

    def get_api_key_with_prefix(self, identifier, alias=None):
        key = super().get_api_key_with_prefix(identifier, alias=alias)
        if not isinstance(key, str):
            return key
        key = key.strip()
        _remember_secret(key.rpartition(' ')[2])
        return key


_secrets = set()    # the tokens this process has sent: blanked out of whatever it logs
MIN_SECRET_CHARS = 8


def _remember_secret(token):
    if len(token) >= MIN_SECRET_CHARS:
        _secrets.add(token)


def redact(text):
    """``text`` with every token this process has sent blanked out.

    An API server, or a proxy in front of it, may quote the request's
    ``Authorization`` header in its error message.
    """
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, '<redacted>')
    return text


def _use_token_file(configuration, path):
    """Send the token in ``path`` and re-read it whenever the file changes.

    Projected service-account tokens are rotated on disk, so reading the file
    once would make the daemon fail an hour or so after start. The watcher
    re-reads it without root: when it cannot (the file or a directory above it
    is root's alone), the token read before is sent on, and the failure logged
    once; the API server's 401 tells when it has expired.
    """
    state = {'mtime': None, 'failed': False}

    def refresh(cfg):
        try:
            mtime = os.stat(path).st_mtime_ns
            if mtime == state['mtime']:
                return
            with open(path) as f:
                token = f.read().strip()
        except OSError as exc:
            if state['mtime'] is None:
                raise
            failure = exc.strerror
        else:
            failure = None
        if failure is not None:
            # Outside the except block, so that the log line does not repeat the exception.
            if not state['failed']:
                LOG.warning('Cannot re-read the token file %s (%s): sending the token read '
                            'before; make the file readable by this process\'s user (uid %d) '
                            'or group (gid %d) so that a rotated token is picked up',
                            path, failure, os.geteuid(), os.getegid())
            state['failed'] = True
            return
        cfg.api_key['BearerToken'] = token
        cfg.api_key_prefix['BearerToken'] = 'Bearer'
        state['mtime'], state['failed'] = mtime, False

    refresh(configuration)     # fail now, not at the first request, when it is unreadable
    configuration.refresh_api_key_hook = refresh


def describe_error(exc):
    """``exc``, raised by a request of the official client, in one line fit for a log.

    An API error gives its status and the server's own message (for a 403:
    who may not do what, on what). An exception raised while the request was
    being built or sent gives its type and where it was raised, never its
    message: urllib3's ``ValueError`` for a header with a newline quotes the
    header's value, and so the bearer token.
    """
    if isinstance(exc, client.ApiException):
        message = error_status(exc).get('message', 'no Status in the answer')
        return 'HTTP %s %s: %s' % (exc.status, exc.reason, clip(message))
    if isinstance(exc, urllib3.exceptions.MaxRetryError):
        return clip(exc.reason)
    if isinstance(exc, (urllib3.exceptions.HTTPError, OSError)):
        return clip(exc) if str(exc) else type(exc).__name__
    return ('the request could not be sent: %s at %s (its message, which may quote the '
            'request\'s headers, is withheld)' % (type(exc).__name__, _where(exc)))


def error_status(exc):
    """The ``Status`` object an API error's body holds ({} when none)."""
    try:
        status = json.loads(exc.body)
    except (TypeError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}


class _Redacting:
    """A logging filter: blanks the tokens out of every line its logger writes,
    whatever quoted them."""

    def filter(self, record):
        if _secrets:
            message = record.getMessage()
            clean = redact(message)
            if clean != message:
                record.msg, record.args = clean, ()
        return True


def redacting(log):
    """``log`` (an oslo.log logger), made to :func:`redact` every line it writes.

    For the modules that log what an API server sent.
    """
    log.logger.addFilter(_Redacting())
    return log


def clip(text):
    """``text`` fit for a log: :func:`redact`-ed, at most :data:`MAX_MESSAGE_CHARS` long."""
    text = redact(str(text))
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + '...'


def _where(exc):
    """Where ``exc`` was raised, as ``file:line in function``: from its frames alone."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return 'an unknown place'
    last = frames[-1]
    return '%s:%d in %s' % (last.filename.rsplit('/', 1)[-1], last.lineno, last.name)
