"""One request to the API server, sent by the official client's REST layer.

The daemon makes three kinds of request: the list+watch of its node's pods,
the same of its KuryrPorts, and the POST of an Event; it reads every answer
raw, as JSON. The client's generated API classes (``CoreV1Api``,
``CustomObjectsApi``) would build the same requests, but resolving them
imports the models of the whole API, ~21 MiB in every process of the daemon
(``benchmark.rst``, "Where the memory goes"), for nothing the daemon reads.
So the URL is built here, and the request is sent by the
``ApiClient``'s own ``RESTClientObject``: its pool, TLS context, retries and
timeouts, with the headers and credentials its configuration holds.
"""

import urllib.parse

from kubernetes.client import exceptions


def send(api, method, path, query=None, headers=None, body=None, timeout=None):
    """Send ``method path?query`` through ``api`` (an ``ApiClient``); the answer, unread.

    ``query``'s None values are left out, booleans sent as the API spells
    them; ``body`` (a dict) goes as JSON. Returns urllib3's response, whose content
    the caller reads and then releases. Raises
    ``kubernetes.client.ApiException`` for an answer that is not 2xx (its
    ``body`` read), and whatever urllib3 raises when there is no answer.
    """
    configuration = api.configuration
    url = configuration.host + path
    query = {k: str(v).lower() if isinstance(v, bool) else v
             for k, v in (query or {}).items() if v is not None}
    if query:
        url += '?' + urllib.parse.urlencode(query)
    sent = dict(api.default_headers)
    sent.update(headers or {})
    if body is not None:
        sent['Content-Type'] = 'application/json'
    # What the client's update_params_for_auth adds: read at each request, so
    # that the configuration's refresh hook can rotate the token.
    for auth in configuration.auth_settings().values():
        if auth['in'] == 'header' and auth['value']:
            sent[auth['key']] = auth['value']
    # kubernetes 37 (setup.cfg's minimum): a RESTResponse around urllib3's response,
    # unread, whatever its status.
    response = api.rest_client.request(method, url, headers=sent, body=body,
                                       _request_timeout=timeout).response
    if not 200 <= response.status <= 299:
        raise exceptions.ApiException(http_resp=response)
    return response
