"""The benchmark gives kuryr-daemon 10.0.0 the very VIFs it gives kuryr-cni.

kuryr-cni's daemon reads pod *i*'s bridge-kind VIF from an annotation,
kuryr-daemon the same VIF as the os-vif ``VIFBridge`` primitive of a KuryrPort
(``tools/bench/upstream.py``). Read back by this project's own os-vif reader,
the primitive must say what the annotation says, field by field: otherwise the
two daemons would plug different things and the comparison would be void.
"""

import dataclasses

import pytest

from kuryr_cni import osvif
from kuryr_cni import vif as vifmod
from tools.bench import systems
from tools.bench import upstream


@pytest.mark.parametrize('index', [0, 7, 249, 250, 4999])
def test_kuryrport_vif_is_the_annotation_vif(index):
    annotation = systems.bridge_vifs(index)['eth0']
    primitive = upstream.vif_bridge(annotation)
    ours = vifmod.parse_vif(annotation)
    theirs = osvif.parse_vif(primitive)
    # network_id exists only in os-vif's form (the annotation has no network object).
    assert dataclasses.replace(theirs, network_id=None) == ours
    data = primitive['versioned_object.data']
    assert data['plugin'] == 'linux_bridge'       # a Linux bridge port, as kuryr-cni plugs it
    assert len(data['vif_name']) <= 15            # a valid host interface name
