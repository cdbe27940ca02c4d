"""What the node tier observes: the daemon's request counts, and a pod's connectivity."""

from kuryr_cni.binding import owner_tag
from tests.functional import helpers
from tools.testbed import host as testhost


def requests(node):
    """``{(command, result): count}`` of the daemon's CNI requests so far."""
    samples = helpers.scrape(node)
    return {(dict(labels)['command'], dict(labels)['result']): value
            for (name, labels), value in samples.items()
            if name == 'kuryr_cni_requests_total'}


def delta(before, after):
    return {key: after[key] - before.get(key, 0) for key in after
            if after[key] != before.get(key, 0)}


def host_sandboxes(node):
    """The sandboxes (container IDs) that have a host device on the node."""
    return {tag[0] for tag in (owner_tag.parse_alias(link.get('ifalias') or '')
                               for link in node.links().values()) if tag}


def assert_connected(node, controller, pod, *peers):
    """``pod`` has its port's address, and reaches the gateway and each of ``peers``."""
    port = controller.port(pod)
    assert pod['status']['podIP'] == port.ip
    assert node.pod_addresses(pod) == {port.ip + '/24'}
    assert node.pod_pings(pod, testhost.GATEWAY), 'no answer from the gateway'
    for peer in peers:
        assert node.pod_pings(pod, controller.port(peer).ip), \
            'no answer from %s' % peer['metadata']['name']
