"""kuryr_cni.apiclient: what the client reads from disk, and when.

The watcher builds its client as root and then drops root
(kuryr_cni.daemon.privileges): every later connection must work from what
was read at construction.
"""

import http.server
import logging
import os
import shutil
import ssl
import subprocess
import threading

import pytest
from kubernetes import client

from kuryr_cni import apiclient
from tests import api_versions


@pytest.fixture
def https_server(tmp_path):
    """An HTTPS server on 127.0.0.1 with a self-signed certificate; yields (url, cert path)."""
    if not shutil.which('openssl'):
        pytest.skip('openssl not installed')
    cert, key = tmp_path / 'server.crt', tmp_path / 'server.key'
    subprocess.run(['openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1',
                    '-subj', '/CN=127.0.0.1', '-addext', 'subjectAltName=IP:127.0.0.1',
                    '-keyout', str(key), '-out', str(cert)],
                   check=True, capture_output=True, timeout=60)
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), api_versions.APIVersions)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield 'https://127.0.0.1:%d' % server.server_port, cert
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_new_connections_read_no_file_once_the_client_is_made(https_server, tmp_path):
    """Before: urllib3 read ca_file at each new connection; gone, the next one failed."""
    url, cert = https_server
    ca_file = tmp_path / 'ca.crt'
    shutil.copy(cert, ca_file)
    api = apiclient.make_api_client(api_root=url, ca_file=str(ca_file))
    versions = client.CoreApi(api)
    assert versions.get_api_versions().versions == ['v1']
    os.unlink(ca_file)      # as unreadable as a root-only file is to the dropped watcher
    for _ in range(2):      # each a new connection (HTTP/1.0)
        assert versions.get_api_versions(_request_timeout=10).versions == ['v1']


def test_the_server_is_still_verified(https_server, tmp_path):
    url, _ = https_server
    other = tmp_path / 'other.crt'
    subprocess.run(['openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1',
                    '-subj', '/CN=other', '-keyout', str(tmp_path / 'other.key'),
                    '-out', str(other)], check=True, capture_output=True, timeout=60)
    api = apiclient.make_api_client(api_root=url, ca_file=str(other))
    api.configuration.retries = 0
    api.rest_client.pool_manager.connection_pool_kw['retries'] = 0
    with pytest.raises(Exception) as failure:
        client.CoreApi(api).get_api_versions(_request_timeout=10)
    assert 'CERTIFICATE_VERIFY_FAILED' in str(failure.value)


def test_a_token_file_that_cannot_be_re_read_keeps_the_token_read_before(tmp_path, caplog):
    token = tmp_path / 'token'
    token.write_text('first-token\n')
    api = apiclient.make_api_client(api_root='http://127.0.0.1:1', token_file=str(token))
    configuration = api.configuration
    assert configuration.get_api_key_with_prefix('BearerToken') == 'Bearer first-token'
    os.unlink(token)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            configuration.refresh_api_key_hook(configuration)
    assert configuration.get_api_key_with_prefix('BearerToken') == 'Bearer first-token'
    warnings = [r for r in caplog.records if 'Cannot re-read the token file' in r.getMessage()]
    assert len(warnings) == 1       # once, not at every request
    token.write_text('rotated-token\n')
    configuration.refresh_api_key_hook(configuration)
    assert configuration.get_api_key_with_prefix('BearerToken') == 'Bearer rotated-token'
