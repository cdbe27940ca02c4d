"""What kuryr-controller 10.0.0 really writes, against what the other tiers assume.

The unit and functional tiers build KuryrPorts from
``tests/unit/osvif_fixtures.py``, by hand. Here a pod's real KuryrPort is
compared with them field by field, object versions included, and with the
recording in ``tests/fixtures/kuryr-controller-10.0.0/kuryrport.json``,
which the unit tier parses (``tests/unit/test_osvif.py``). Run the tier with
``OPENSTACK_RECORD_FIXTURES=1`` to write that recording anew from the real
controller. The KuryrPort CRD this project ships is compared with
kuryr-controller's own too.
"""

import json
import os

import yaml

from tests import fixtures
from tests.openstack import stack as osstack
from tests.openstack import steps
from tests.unit import osvif_fixtures as fx

RECORDING = fixtures.KURYRPORT_RECORDING
SHIPPED_CRD = os.path.join(osstack.REPO, 'etc', 'kubernetes', 'kuryrport-crd.yaml')
# Set by the API server, not by kuryr-controller: left out of the recording.
SERVER_METADATA = ('creationTimestamp', 'generation', 'managedFields', 'resourceVersion', 'uid')


def recorded(kuryrport):
    """``kuryrport`` without what the API server set."""
    metadata = {k: v for k, v in kuryrport['metadata'].items() if k not in SERVER_METADATA}
    return dict(kuryrport, metadata=metadata)


def shape(value):
    """The structure of ``value``: keys, os-vif object names and versions, value types."""
    if isinstance(value, dict):
        if 'versioned_object.name' in value:
            return ('%s %s %s' % (value['versioned_object.namespace'],
                                  value['versioned_object.name'],
                                  value['versioned_object.version']),
                    shape(value['versioned_object.data']))
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(item) for item in value]
    return type(value).__name__


def test_the_fixtures_are_what_kuryr_controller_writes(stack, node, runtime, pods):
    # A pod taken all the way (a port never plugged would hold up its deletion).
    started = steps.start_pod(stack, node, runtime, pods, wait_for=('KuryrPort active',))
    assert started.outcome.ok, started.outcome.output
    pod = started.pod
    real = recorded(stack.kuryrport(pod['metadata']['name']))
    if os.environ.get('OPENSTACK_RECORD_FIXTURES') == '1':
        os.makedirs(os.path.dirname(RECORDING), exist_ok=True)
        with open(RECORDING, 'w') as f:
            json.dump(real, f, indent=2, sort_keys=True)
            f.write('\n')
    with open(RECORDING) as f:
        recording = json.load(f)
    assert shape(real) == shape(recording)

    vif = real['status']['vifs']['eth0']['vif']
    data = vif['versioned_object.data']
    network = data['network']['versioned_object.data']
    [subnet] = network['subnets']['versioned_object.data']['objects']
    subnet = subnet['versioned_object.data']
    [ip] = subnet['ips']['versioned_object.data']['objects']
    # What a geneve network on ML2/OVN gives: 1500 less geneve's 58 bytes.
    assert network['mtu'] == 1442
    assert data['port_profile']['versioned_object.version'] == '1.4'
    assert data['network']['versioned_object.version'] == '1.1'
    # The hand-written fixtures, shaped as this pod's network is (one IPv4 subnet, no
    # routes), are the real thing, field by field and version by version.
    mine = fx.kuryrport('default', pod['metadata']['name'], stack.node,
                        pod['metadata']['uid'], fx.status_vifs(fx.ovs_vif(
                            active=True, network=fx.network(
                                [fx.subnet(subnet['cidr'], [ip['versioned_object.data']
                                                            ['address']],
                                           gateway=subnet['gateway'])], mtu=1442))))
    assert shape(mine) == shape(real)
    assert {k: v for k, v in data.items() if k in CONSTANT} == {
        k: v for k, v in mine['status']['vifs']['eth0']['vif']['versioned_object.data'].items()
        if k in CONSTANT}
    assert data['vif_name'] == 'tap' + data['id'][:11]
    assert data['port_profile']['versioned_object.data'] == {'interface_id': data['id']}


# Fields whose values are the same for every pod of an ML2/OVN cloud.
CONSTANT = ('active', 'bridge_name', 'has_traffic_filtering', 'plugin', 'preserve_on_delete')


def test_the_shipped_crd_is_kuryr_controllers(stack):
    served = stack.k8s('GET', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions/'
                       'kuryrports.openstack.org')
    with open(SHIPPED_CRD) as f:
        shipped = yaml.safe_load(f)
    assert shipped['spec']['names'] == {k: v for k, v in served['spec']['names'].items()
                                        if k in shipped['spec']['names']}
    assert shipped['spec']['scope'] == served['spec']['scope']
    assert [(v['name'], v['served'], v['storage'], v['schema'], v.get('subresources'))
            for v in shipped['spec']['versions']] == \
        [(v['name'], v['served'], v['storage'], v['schema'], v.get('subresources'))
         for v in served['spec']['versions']]
