"""Builds the official kubernetes ApiClient from the [kubernetes] options.

Only construction lives here: which API server, which credentials, which CA.
Requests, retries and timeouts belong to the callers (the watcher). The bearer
token is never logged.
"""

import os

from kubernetes import client
from kubernetes import config
from oslo_log import log as logging

LOG = logging.getLogger(__name__)


def make_api_client(api_root=None, kubeconfig=None, token_file=None, ca_file=None,
                    verify_ssl=True):
    """Return a ``kubernetes.client.ApiClient``.

    ``api_root`` (with an optional bearer ``token_file`` and ``ca_file``) wins;
    else ``kubeconfig``; else the in-cluster service account. Raises
    ``kubernetes.config.ConfigException`` or ``OSError`` when the chosen source
    is unusable.
    """
    configuration = client.Configuration()
    if api_root:
        configuration.host = api_root.rstrip('/')
        configuration.verify_ssl = verify_ssl
        if ca_file:
            configuration.ssl_ca_cert = ca_file
        if token_file:
            _use_token_file(configuration, token_file)
        source = 'api_root'
    elif kubeconfig:
        # persist_config=False: a daemon must not rewrite the operator's kubeconfig.
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration,
                                persist_config=False)
        source = 'kubeconfig %s' % kubeconfig
    else:
        config.load_incluster_config(client_configuration=configuration)
        source = 'in-cluster service account'
    LOG.info('Kubernetes API at %s (from %s)', configuration.host, source)
    return client.ApiClient(configuration)


def _use_token_file(configuration, path):
    """Send the token in ``path`` and re-read it whenever the file changes.

    Projected service-account tokens are rotated on disk, so reading the file
    once would make the daemon fail an hour or so after start.
    """
    state = {'mtime': None}

    def refresh(cfg):
        mtime = os.stat(path).st_mtime_ns
        if mtime != state['mtime']:
            with open(path) as f:
                cfg.api_key['BearerToken'] = f.read().strip()
            cfg.api_key_prefix['BearerToken'] = 'Bearer'
            state['mtime'] = mtime

    refresh(configuration)     # fail now, not at the first request, when it is unreadable
    configuration.refresh_api_key_hook = refresh
