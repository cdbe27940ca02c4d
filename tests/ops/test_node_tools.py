"""The commands of the real-counterpart tiers: tools/node, tools/kube-apiserver and their helpers.

Bringing a node up needs root and a build (the node tier does it); here:
shellcheck, usage, a stop that finds nothing, and the images tools/oci-image
writes, read back as ``ctr images import`` reads them.
"""

import hashlib
import json
import pathlib
import shutil
import subprocess
import tarfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TOOLS = REPO / 'tools'
SCRIPTS = ('node', 'kube-apiserver', 'private-apt')


@pytest.mark.parametrize('name', SCRIPTS)
def test_shellcheck(name):
    shellcheck = shutil.which('shellcheck')
    if shellcheck is None:
        pytest.skip('shellcheck is not installed (apt-get install shellcheck)')
    proc = subprocess.run([shellcheck, '--shell=bash', '--severity=style', str(TOOLS / name)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize('args', [(), ('start',), ('stop',), ('stop', 'DIR', 'containerd'),
                                  ('restart', 'DIR')])
def test_node_usage(args):
    proc = subprocess.run([str(TOOLS / 'node'), *args], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 2
    assert 'tools/node start DIR' in proc.stderr


def test_node_stop_of_a_node_never_started_does_nothing(tmp_path):
    for _ in range(2):
        proc = subprocess.run([str(TOOLS / 'node'), 'stop', str(tmp_path / 'node')],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_oci_image_is_a_layout_ctr_can_import(tmp_path):
    rootfs = tmp_path / 'rootfs'
    (rootfs / 'bin').mkdir(parents=True)
    (rootfs / 'bin' / 'tool').write_bytes(b'#!/bin/sh\n')
    out = tmp_path / 'image.tar'
    subprocess.run([str(TOOLS / 'oci-image'), str(rootfs), 'localhost/test:1', str(out),
                    '/bin/tool', '-x'], check=True, timeout=60)
    with tarfile.open(out) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}

    def blob(descriptor):
        data = files['blobs/sha256/' + descriptor['digest'].split(':', 1)[1]]
        assert hashlib.sha256(data).hexdigest() == descriptor['digest'].split(':', 1)[1]
        assert len(data) == descriptor['size']
        return data

    assert json.loads(files['oci-layout']) == {'imageLayoutVersion': '1.0.0'}
    [entry] = json.loads(files['index.json'])['manifests']
    assert entry['annotations']['io.containerd.image.name'] == 'localhost/test:1'
    manifest = json.loads(blob(entry))
    config = json.loads(blob(manifest['config']))
    assert config['config']['Entrypoint'] == ['/bin/tool', '-x']
    [layer] = manifest['layers']
    assert config['rootfs']['diff_ids'] == [layer['digest']]
    layer_path = tmp_path / 'layer.tar'
    layer_path.write_bytes(blob(layer))
    with tarfile.open(layer_path) as tar:
        assert './bin/tool' in tar.getnames()
