"""A runtime's CNI calls inside a guest: ``python -m tests.vm.guest_cni COMMAND ...``.

Runs in the ``systemd`` guest with the daemon's own virtualenv
(``/opt/kuryr-cni``) and the checkout on ``PYTHONPATH``: the runtime
emulator (:mod:`tools.testbed.runtime`, which calls the shim as libcni does)
drives the installed shim, ``/opt/cni/bin/kuryr-cni`` (or ``$KURYR_CNI_SHIM``:
the nested guests run the checkout's build), with the shipped configuration's
socket and state paths. Prints the outcome as one JSON line.

    add|check|del CONTAINER_ID NETNS_NAME POD_NAME POD_UID

A NETNS_NAME of ``-`` sends the empty CNI_NETNS of a runtime's second DEL;
``$KURYR_CNI_TIMEOUT`` is the shim's timeout in seconds (an impatient runtime's).
"""

import json
import os
import sys

from tools.testbed import runtime as testruntime

SHIM = os.environ.get('KURYR_CNI_SHIM', '/opt/cni/bin/kuryr-cni')
SOCKET = '/run/kuryr-cni/daemon.sock'
STATE_DIR = '/var/lib/kuryr-cni'
CACHE_DIR = '/var/lib/cni-cache'        # the runtime's own result cache, as libcni keeps one


def main(argv):
    command, container_id, netns, pod, uid = argv
    runtime = testruntime.Runtime(SOCKET, STATE_DIR, CACHE_DIR, shim=SHIM,
                                  timeout=int(os.environ.get('KURYR_CNI_TIMEOUT', '110')))
    sandbox = testruntime.Sandbox(container_id, '/run/netns/' + netns, pod, pod_uid=uid)
    if command == 'del' and netns == '-':
        outcome = runtime.delete(sandbox, netns='')
    else:
        outcome = {'add': runtime.add, 'check': runtime.check, 'del': runtime.delete}[command](
            sandbox)
    print(json.dumps({'code': outcome.code, 'output': outcome.output}))


if __name__ == '__main__':
    main(sys.argv[1:])
