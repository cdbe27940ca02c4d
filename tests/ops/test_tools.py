"""The commands for real counterparts (tools/openstack, tools/kube-apiserver, tools/node,
tools/vm), as tools.

What needs no build and no root: the scripts are clean bash, say how they
are used, and ``stop`` is safe on a directory that never ran anything (so a
fixture may call it whatever failed before); the images tools/oci-image
writes for the node read back as ``ctr images import`` reads them.
"""

import hashlib
import json
import pathlib
import subprocess
import tarfile

import pytest

from tests.ops import shellcheck

REPO = pathlib.Path(__file__).resolve().parents[2]

TOOLS = [REPO / 'tools' / 'openstack', REPO / 'tools' / 'kube-apiserver', REPO / 'tools' / 'node',
         REPO / 'tools' / 'vm']
NODE = REPO / 'tools' / 'node'
VM = REPO / 'tools' / 'vm'


@pytest.mark.parametrize('tool', TOOLS + [REPO / 'tools' / 'private-apt'], ids=lambda p: p.name)
def test_shellcheck(tool):
    shellcheck.assert_clean(tool, '--shell=bash', '--severity=style')


@pytest.mark.parametrize('tool', TOOLS, ids=lambda p: p.name)
def test_usage(tool):
    proc = subprocess.run([str(tool)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    for verb in ('build', 'start DIR', 'stop DIR'):
        assert '%s %s' % (tool.name, verb) in proc.stderr, verb


def test_openstack_stop_of_nothing_is_a_noop_twice(tmp_path):
    for _ in range(2):
        proc = subprocess.run([str(TOOLS[0]), 'stop', str(tmp_path / 'never-started')],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / 'never-started').exists()


@pytest.mark.parametrize('args', [('stop', 'DIR', 'containerd'), ('restart', 'DIR'),
                                  ('start', 'DIR')])
def test_node_refuses_what_it_does_not_do(args):
    proc = subprocess.run([str(NODE), *args], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert 'node start DIR' in proc.stderr


def test_node_stop_of_nothing_is_a_noop_twice(tmp_path):
    for _ in range(2):
        proc = subprocess.run([str(NODE), 'stop', str(tmp_path / 'never-started')],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / 'never-started').exists()


def test_vm_stop_of_nothing_is_a_noop_twice(tmp_path):
    for _ in range(2):
        proc = subprocess.run([str(VM), 'stop', str(tmp_path / 'never-started')],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / 'never-started').exists()


@pytest.mark.parametrize('args', [('start', 'DIR'), ('run', 'DIR', 'n1'), ('stop',),
                                  ('start', 'DIR', '--mem')])
def test_vm_refuses_what_it_does_not_do(args):
    proc = subprocess.run([str(VM), *args], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert 'vm start DIR' in proc.stderr


def test_oci_image_is_a_layout_ctr_can_import(tmp_path):
    rootfs = tmp_path / 'rootfs'
    (rootfs / 'bin').mkdir(parents=True)
    (rootfs / 'bin' / 'tool').write_bytes(b'#!/bin/sh\n')
    out = tmp_path / 'image.tar'
    subprocess.run([str(REPO / 'tools' / 'oci-image'), str(rootfs), 'localhost/test:1',
                    str(out), '/bin/tool', '-x'], check=True, timeout=60)
    with tarfile.open(out) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}

    def blob(descriptor):
        digest = descriptor['digest'].split(':', 1)[1]
        data = files['blobs/sha256/' + digest]
        assert hashlib.sha256(data).hexdigest() == digest
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
    (tmp_path / 'layer.tar').write_bytes(blob(layer))
    with tarfile.open(tmp_path / 'layer.tar') as tar:
        assert './bin/tool' in tar.getnames()
