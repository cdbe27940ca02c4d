"""Security groups stay in force: the daemon's plumbing leaves OVN's ACLs in the path."""

import uuid

from tests import wait
from tests.openstack import steps


def test_ingress_needs_a_rule(stack, node, runtime, pods):
    a = steps.start_pod(stack, node, runtime, pods)
    b = steps.start_pod(stack, node, runtime, pods)
    assert a.outcome.ok and b.outcome.ok, (a.outcome.output, b.outcome.output)
    address_b = stack.port(b.port_id)['fixed_ips'][0]['ip_address']
    assert node.ping(a.sandbox.netns, address_b, count=2, wait=5)
    # A group of its own for B: egress only, as Neutron makes a new group.
    closed = stack.neutron('POST', '/security-groups', {'security_group': {
        'name': 'closed-' + uuid.uuid4().hex[:6], 'project_id': stack.env['PROJECT']}}
    )['security_group']
    assert not [r for r in closed['security_group_rules'] if r['direction'] == 'ingress']
    try:
        stack.neutron('PUT', '/ports/' + b.port_id,
                      {'port': {'security_groups': [closed['id']]}})
        wait.until(lambda: not node.ping(a.sandbox.netns, address_b, count=1, wait=1), 30,
                   'OVN to drop traffic to B', 0.1)
        assert not node.ping(a.sandbox.netns, address_b, count=3, wait=1)
        stack.neutron('POST', '/security-group-rules', {'security_group_rule': {
            'security_group_id': closed['id'], 'project_id': stack.env['PROJECT'],
            'direction': 'ingress', 'ethertype': 'IPv4', 'protocol': 'icmp',
            'remote_ip_prefix': stack.env['POD_CIDR']}})
        wait.until(lambda: node.ping(a.sandbox.netns, address_b, count=1, wait=1), 30,
                   'OVN to let traffic to B through', 0.1)
        assert stack.port(b.port_id)['status'] == 'ACTIVE'
    finally:
        stack.neutron('PUT', '/ports/' + b.port_id,
                      {'port': {'security_groups': [stack.env['SECURITY_GROUP']]}})
        stack.neutron('DELETE', '/security-groups/' + closed['id'])
