"""Which sandbox a cgroup file names, as each runtime and cgroup driver writes it."""

import pytest

from kuryr_cni import sandboxes

UID = '6f164bf9-44cd-4e82-a21a-909e854c676c'
ID = 'ab' * 32


@pytest.mark.parametrize('line', [
    # containerd, systemd driver, cgroup v2
    '0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod%s.slice/'
    'cri-containerd-%s.scope' % (UID.replace('-', '_'), ID),
    # CRI-O, systemd driver
    '0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/'
    'crio-%s.scope' % (UID.replace('-', '_'), ID),
    # cgroupfs driver, cgroup v1
    '8:pids:/kubepods/besteffort/pod%s/%s' % (UID, ID),
])
def test_the_runtimes_cgroup_names_give_pod_and_sandbox(line):
    text = '12:blkio:/\n%s\n1:name=systemd:/\n' % line
    assert sandboxes._sandbox_in_cgroup(text) == (UID, ID)


@pytest.mark.parametrize('line', [
    '0::/system.slice/containerd.service',                     # not a pod's
    '0::/kubepods/besteffort/pod%s' % UID,                     # the pod, no container
    '0::/kubepods/besteffort/%s' % ID,                         # a container, no pod
    '0::/kubepods/besteffort/pod%s/crio-conmon-%s.scope' % (UID, ID),   # CRI-O's monitor
])
def test_anything_else_names_no_sandbox(line):
    assert sandboxes._sandbox_in_cgroup(line + '\n') is None


def test_the_pause_process_is_preferred_else_the_oldest(tmp_path):
    proc = tmp_path
    rows = {11: ('sh', 300, 'cd' * 32), 12: ('pause', 500, ID), 13: ('nginx', 100, 'ef' * 32)}
    for pid, (comm, start, cid) in rows.items():
        (proc / str(pid)).mkdir()
        (proc / str(pid) / 'comm').write_text(comm + '\n')
        (proc / str(pid) / 'stat').write_text('%d (%s) S %s\n' % (
            pid, comm, ' '.join(['0'] * 18 + [str(start)] + ['0'] * 5)))
        (proc / str(pid) / 'cgroup').write_text('0::/kubepods/pod%s/%s\n' % (UID, cid))
    space = sandboxes.Namespace((1, 2), '/run/netns/x', [11, 12, 13])
    assert sandboxes.sandboxes_in(space, proc=str(proc)) == {UID: ID}
    space.pids = [11, 13]
    assert sandboxes.sandboxes_in(space, proc=str(proc)) == {UID: 'ef' * 32}
