"""The daemon under systemd for real: installed as install.rst says, run by the shipped unit.

In the ``systemd`` guest (Debian 12, systemd 252 as PID 1) the shell block of
doc/source/install.rst, "Under systemd", runs line by line, as
tests/ops/test_install.py takes it from the page, in a copy of the checkout,
with three differences a guest without network or Go imposes: ``apt-get`` is
a stand-in (the image already holds python3-venv; golang-go is not needed,
see next), ``tools/build-shim`` installs the shim built on the host (a static
executable of the same source), and pip finds the packages in the build's
wheel folder (``PIP_NO_INDEX``, ``PIP_FIND_LINKS``) instead of PyPI. Before
the last line the configuration is edited as the page asks: the way to the
API server (the wire-level stand-in, on the tier's bridge, 10.250.0.1) and the
trunk link for vlan VIFs (``[binding] link_iface = vec0``). The unit file is
the shipped one, byte for byte.

Then, on the running service: ``active`` through ``READY=1``; the exposure
``systemd-analyze security`` gives; the hardening in force on every process
of the service (``/proc/PID/status``: ``NoNewPrivs``, ``CapBnd``,
``Seccomp`` 2; ``/`` read-only and the state directory writable in its mount
namespace) while ADD, CHECK and DEL through the installed shim plug a real
802.1Q eth0 into a pod namespace, which pings a gateway on VLAN 101 in the
other guest; one journal line per request; the watchdog killing and restarting a daemon
stopped with SIGSTOP, the pod keeping its network and its DEL answered after;
and ``systemctl restart`` with a pod plugged and an ADD sent meanwhile.

Then the unit acted on under a stream of ADDs (:mod:`tests.vm.guest_stream`):
``systemctl restart``, and ``systemctl stop`` with DELs sent while stopped,
then ``start``: every ADD answered, every pod started plugged in the end and
pinging its gateway on its own VLAN, failed ADDs leaving nothing, the queued
DELs replayed, one journal line per request. Last, a reboot of the guest with
two pods: their bindings recovered, the runtime's DELs for the dead sandboxes
leaving nothing behind.
"""

import collections
import json
import re
import shlex
import socket
import time

import pytest

from kuryr_cni import netns
from tests import wait
from tests.ops import test_install
from tests.unit import osvif_fixtures as fx
from tests.vm import conftest as vm
from tests.vm import guests as vm_guests
from tools.testbed import apiserver

REPO = vm_guests.REPO
UNIT = 'kuryr-cni-daemon'
UNIT_FILE = 'etc/systemd/kuryr-cni-daemon.service'
GATEWAY = '10.250.0.1'          # the tier's bridge, in its namespace
VLAN_ID = 101
POD_GATEWAY = '10.0.0.1'        # dual_stack_network's; on VLAN 101 of the kernel guest
POD = 'web-0'
UID = 'uid-web-0'
# The unit's CapabilityBoundingSet: CHOWN (0), DAC_OVERRIDE (1), KILL (5), SETGID (6),
# SETUID (7), SETPCAP (8), NET_ADMIN (12), SYS_PTRACE (19), SYS_ADMIN (21). The watcher
# and ops empty it when they drop root.
CAP_BND = '%016x' % sum(1 << bit for bit in (0, 1, 5, 6, 7, 8, 12, 19, 21))
NO_CAPS = '%016x' % 0
UNPRIVILEGED_ROLES = ('watcher', 'ops')
WEB_1_PORT = '8c5f3a10-2f4e-4c3b-9a61-0d6f2b7e4a26'   # web-0's is fx.PORT_ID
INSTALL_TIMEOUT = 900
WATCHDOG_SEC = 30
RESTART_SEC = 5
_REQUEST = re.compile(r'(?:^|\s)(ADD|DEL|CHECK) pod (\S+) container (\S+) ifname (\S+): ',
                      re.M)


def _install_script(port):
    """The page's lines in the guest, with the stand-ins and the configuration edit."""
    steps = test_install._documented_steps().splitlines()
    assert steps[-1] == 'systemctl enable --now %s' % UNIT
    excluded = ' '.join('--exclude=./%s' % path
                        for path in ('.git', '.venv', '.cache', '.tox', 'doc/build'))
    return '\n'.join([
        'set -o errexit -o nounset -o pipefail',
        'mkdir -p /root/stand-ins /root/src',
        "printf '#!/bin/sh\\necho \"apt-get $*: offline, the image has what is needed\"\\n' "
        '>/root/stand-ins/apt-get && chmod 0755 /root/stand-ins/apt-get',
        'tar -C %s %s -cf - . | tar -C /root/src -xf -' % (REPO, excluded),
        "printf '#!/bin/sh\\nexec install -m 0755 %s/shim/kuryr-cni \"$1\"\\n' "
        '>/root/src/tools/build-shim' % REPO,
        'cd /root/src',
        'export PATH=/root/stand-ins:$PATH PIP_NO_INDEX=1 PIP_FIND_LINKS=%s '
        'PIP_DISABLE_PIP_VERSION_CHECK=1' % vm_guests.WHEELS,
        *steps[:-1],
        "sed -i -e 's|^#api_root = <None>|api_root = http://%s:%d|' "
        "-e 's|^#link_iface = <None>|link_iface = vec0|' /etc/kuryr-cni/kuryr-cni.conf"
        % (GATEWAY, port),
        '/opt/kuryr-cni/bin/oslo-config-validator --namespace kuryr_cni --namespace oslo.log '
        '--input-file /etc/kuryr-cni/kuryr-cni.conf',
        'started=$(date +%s.%N)',
        steps[-1],
        'echo "active after $(echo "$(date +%s.%N) - $started" | python3 -c '
        '"import sys; print(round(eval(sys.stdin.read()), 1))") s"',
    ])


class Service:
    """The daemon's unit in the guest, seen through systemctl and /proc."""

    def __init__(self, guests, api):
        self.guests = guests
        self.api = api

    def sh(self, command, timeout=120):
        return self.guests.run(vm.SYSTEMD, command, timeout=timeout)

    def show(self, *properties):
        out = self.sh('systemctl show %s -p %s' % (UNIT, ','.join(properties))).check('show')
        return dict(line.split('=', 1) for line in out.splitlines() if '=' in line)

    def pids(self):
        """The service's processes: its cgroup's members."""
        out = self.sh('cat /sys/fs/cgroup/system.slice/%s.service/cgroup.procs' % UNIT)
        return [int(pid) for pid in out.check('cgroup.procs').split()]

    def python(self, module, *args, timeout=180):
        """Run ``module`` of the checkout with the daemon's virtualenv; its last line, decoded."""
        out = self.sh('cd %s && PYTHONPATH=%s /opt/kuryr-cni/bin/python -m %s %s' % (
            REPO, REPO, module, ' '.join(shlex.quote(arg) for arg in args)),
            timeout=timeout).check(' '.join((module,) + args[:1]))
        return json.loads(out.strip().splitlines()[-1])

    def cni(self, command, container_id, netns_name, pod=POD, uid=UID):
        return self.python('tests.vm.guest_cni', command, container_id, netns_name, pod, uid)

    def facts(self, *netns_names, ping=None):
        """:mod:`tests.vm.guest_facts` of these namespaces."""
        return self.python('tests.vm.guest_facts', *(('--ping', ping) if ping else ()),
                           *netns_names)

    def journal(self):
        return self.sh('journalctl -u %s -o cat --no-pager' % UNIT).check('journalctl')


@pytest.fixture(scope='module')
def api(guests):
    sock = netns.socket_in('/run/netns/' + guests.netns, socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((GATEWAY, 0))
    server = apiserver.APIServer(sock=sock)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope='module')
def service(request, guests, api):
    """The daemon installed and started; its pod's KuryrPort and gateway ready.

    When the session also waits for the kernel guest's long run, that starts
    first, so that it overlaps this.
    """
    if any(vm.waits_for_the_kernel_run(item) for item in request.session.items):
        request.getfixturevalue('kernel_run')
    result = guests.run(vm.SYSTEMD, _install_script(api.address[1]), timeout=INSTALL_TIMEOUT)
    print(result.output[-2000:])
    result.check('the documented install')
    # The pod's gateway: VLAN 101 on the kernel guest's NIC, in a namespace of its own (its
    # root namespace is the functional tests', which check that nothing changes there).
    guests.run(vm.KERNEL, (
        'ip netns add gw && ip link add link vec0 name vec0.{id} netns gw type vlan id {id} '
        '&& ip -n gw addr add {gw}/26 dev vec0.{id} && ip -n gw link set vec0.{id} up').format(
            id=VLAN_ID, gw=POD_GATEWAY)).check('the gateway on VLAN 101')
    # The pod, as kuryr-controller would leave it: a KuryrPort with one VLAN 101 VIF.
    api.create_pod('default', POD, vm.SYSTEMD, uid=UID)
    api.create_kuryrport('default', POD, vm.SYSTEMD,
                         spec={'podUid': UID, 'podStatic': False, 'podNodeName': vm.SYSTEMD},
                         status={'vifs': fx.status_vifs(fx.vlan_vif(vlan_id=VLAN_ID))})
    return Service(guests, api)


def test_the_shipped_unit_reaches_active_through_ready(service):
    service.sh('cmp /etc/systemd/system/%s.service %s/%s' % (UNIT, REPO, UNIT_FILE)).check(
        'the installed unit is the shipped file')
    state = service.show('ActiveState', 'SubState', 'Type', 'NotifyAccess', 'WatchdogUSec',
                         'StatusText', 'NRestarts')
    assert state['ActiveState'] == 'active' and state['SubState'] == 'running', state
    assert state['Type'] == 'notify' and state['NotifyAccess'] == 'main', state
    assert state['WatchdogUSec'] == '%ds' % WATCHDOG_SEC, state
    assert state['StatusText'], state   # the daemon's STATUS= line
    assert state['NRestarts'] == '0', state
    out = service.sh('systemd-analyze security --no-pager %s' % UNIT).check('security')
    exposure = re.search(r'Overall exposure level for \S+: ([0-9.]+) (\w+)', out)
    print('systemd-analyze security: %s %s' % exposure.groups())
    assert float(exposure.group(1)) <= 4.0, out[-1500:]


def _status(service, pid):
    out = service.sh('cat /proc/%d/status' % pid).check('status of %d' % pid)
    return dict(re.findall(r'^(\w+):\s+(.*)$', out, re.M))


def _role(service, pid):
    """'watcher' of 'kuryr-cni-daemon: watcher' (the process title), else the title."""
    title = service.sh('tr "\\0" " " </proc/%d/cmdline' % pid).check('title of %d' % pid)
    return title.strip().rsplit(': ', 1)[-1]


def _mount_options(service, pid, path):
    out = service.sh('cat /proc/%d/mountinfo' % pid).check('mountinfo')
    options = [line.split()[5] for line in out.splitlines() if line.split()[4] == path]
    return options[-1].split(',')           # the mount on top


def test_hardening_holds_while_a_pod_plugs_and_unplugs(service):
    main_pid = int(service.show('MainPID')['MainPID'])
    pids = service.pids()
    assert main_pid in pids and len(pids) >= 3, pids   # parent, workers, watcher...
    nobody = service.sh('id -u nobody').check('nobody').strip()
    roles = set()
    for pid in pids:
        status = _status(service, pid)
        assert status['NoNewPrivs'] == '1', (pid, status)
        assert status['Seccomp'] == '2', (pid, status)
        role = _role(service, pid)
        roles.add(role)
        if role in UNPRIVILEGED_ROLES:      # privilege separation, as the unit runs it
            assert status['Uid'].split() == [nobody] * 4, (role, status)
            assert [status[key] for key in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd',
                                            'CapAmb')] == [NO_CAPS] * 5, (role, status)
        else:
            assert status['CapBnd'] == CAP_BND, (pid, status)
        assert 'ro' in _mount_options(service, pid, '/'), pid
        assert 'rw' in _mount_options(service, pid, '/var/lib/kuryr-cni'), pid
    assert set(UNPRIVILEGED_ROLES) <= roles, roles
    service.sh('ip netns add pod-a').check('the pod namespace')
    try:
        added = service.cni('add', 'sandbox-a', 'pod-a')
        assert added['code'] == 0, added
        link = json.loads(service.sh('ip -n pod-a -j -d link show eth0').check('eth0'))[0]
        assert link['linkinfo']['info_kind'] == 'vlan', link
        assert link['linkinfo']['info_data']['id'] == VLAN_ID, link
        service.sh('ip netns exec pod-a ping -c 2 -W 3 %s' % POD_GATEWAY).check(
            'the pod pings its gateway across VLAN 101')
        checked = service.cni('check', 'sandbox-a', 'pod-a')
        assert checked['code'] == 0, checked
        deleted = service.cni('del', 'sandbox-a', 'pod-a')
        assert deleted['code'] == 0, deleted
        assert 'eth0' not in service.sh('ip -n pod-a -br link').check('links')
        journal = service.journal()
        requests = [(c, cid) for c, pod, cid, _ in _REQUEST.findall(journal)
                    if cid == 'sandbox-a']
        assert requests == [('ADD', 'sandbox-a'), ('CHECK', 'sandbox-a'),
                            ('DEL', 'sandbox-a')], journal[-3000:]
    finally:
        service.sh('ip netns del pod-a')


def test_watchdog_restarts_a_stopped_daemon_and_the_pod_keeps_its_network(service):
    service.sh('ip netns add pod-b').check('the pod namespace')
    try:
        assert service.cni('add', 'sandbox-b', 'pod-b')['code'] == 0
        before = service.show('MainPID', 'NRestarts')
        service.sh('kill -STOP %s' % before['MainPID']).check('SIGSTOP')
        stopped = time.monotonic()
        # Only the parent is stopped: the workers go on answering until systemd acts.
        assert service.cni('check', 'sandbox-b', 'pod-b')['code'] == 0
        limit = WATCHDOG_SEC + RESTART_SEC + 60     # a busy guest answers late
        while True:
            now = service.show('MainPID', 'NRestarts', 'ActiveState')
            if now['NRestarts'] != before['NRestarts'] and now['ActiveState'] == 'active':
                break
            assert time.monotonic() - stopped < limit, now
            time.sleep(2)
        print('the watchdog restarted the stopped daemon in %.0f s'
              % (time.monotonic() - stopped))
        assert now['MainPID'] != before['MainPID']
        journal = service.journal()
        assert 'Watchdog timeout' in journal, journal[-2000:]
        # The pod kept its network through the restart; its DEL is answered by the new daemon.
        link = json.loads(service.sh('ip -n pod-b -j link show eth0').check('eth0'))[0]
        assert 'UP' in link['flags'], link
        assert service.cni('del', 'sandbox-b', 'pod-b')['code'] == 0
        assert 'eth0' not in service.sh('ip -n pod-b -br link').check('links')
    finally:
        service.sh('ip netns del pod-b')


def test_systemctl_restart_keeps_pods_and_an_add_sent_meanwhile_gets_through(service):
    service.api.create_pod('default', 'web-1', vm.SYSTEMD, uid='uid-web-1')
    service.api.create_kuryrport(
        'default', 'web-1', vm.SYSTEMD,
        spec={'podUid': 'uid-web-1', 'podStatic': False, 'podNodeName': vm.SYSTEMD},
        status={'vifs': fx.status_vifs(fx.vlan_vif(vlan_id=VLAN_ID + 1, n=6, id=WEB_1_PORT))})
    service.sh('ip netns add pod-c && ip netns add pod-d').check('the pod namespaces')
    try:
        assert service.cni('add', 'sandbox-c', 'pod-c')['code'] == 0
        eth0 = json.loads(service.sh('ip -n pod-c -j link show eth0').check('eth0'))[0]
        before = service.show('MainPID')['MainPID']
        service.sh('systemctl restart --no-block %s' % UNIT).check('restart')
        # As kubelet does: an ADD told to try again (code 11) is sent again.
        answers = []
        deadline = time.monotonic() + 180
        while not answers or answers[-1]['code'] != 0:
            answers.append(service.cni('add', 'sandbox-d', 'pod-d', pod='web-1',
                                       uid='uid-web-1'))
            # The shim's exit status, then the CNI code of its error answer.
            assert answers[-1]['code'] == 0 or answers[-1]['output']['code'] == 11, answers
            assert time.monotonic() < deadline, answers

        def restarted():
            now = service.show('MainPID', 'ActiveState')
            return now['ActiveState'] == 'active' and now['MainPID'] != before

        wait.until(restarted, 180, 'the restarted daemon to be active', interval=2)
        # The pod plugged before the restart kept its device, untouched.
        after = json.loads(service.sh('ip -n pod-c -j link show eth0').check('eth0'))[0]
        assert (after['ifindex'], 'UP' in after['flags']) == (eth0['ifindex'], True)
        # One journal line per request that reached a daemon (the shim alone answers
        # "unreachable" while neither listens).
        reached = [a for a in answers if 'unreachable' not in json.dumps(a['output'])]
        # An ADD answered 'registry unavailable' met a daemon being stopped: its worker
        # may be killed between its answer and its log line (seen once in a fresh-clone
        # run; issue 34's restart work is to make such ADDs wait instead).
        stopping = [a for a in reached if 'registry unavailable' in json.dumps(a['output'])]
        journal = service.journal()
        lines = [c for c, _pod, cid, _ in _REQUEST.findall(journal) if cid == 'sandbox-d']
        assert set(lines) <= {'ADD'}, (answers, journal[-3000:])
        assert len(reached) - len(stopping) <= len(lines) <= len(reached), (
            answers, journal[-3000:])
        print('ADD during systemctl restart: %d attempts, %d reached a daemon'
              % (len(answers), len(reached)))
        for sandbox, netns_name, pod, uid in (('sandbox-c', 'pod-c', POD, UID),
                                              ('sandbox-d', 'pod-d', 'web-1', 'uid-web-1')):
            assert service.cni('del', sandbox, netns_name, pod=pod, uid=uid)['code'] == 0
    finally:
        service.sh('ip netns del pod-c; ip netns del pod-d')


# --- A stream of ADDs across restarts, and a reboot ---------------------------------------

# One VLAN per stream pod (each a subport of its own): VLAN 110 + i and 10.0.0.(10 + i) for
# pod i, in POD_GATEWAY's /26. In the kernel guest, one namespace holds a device per VLAN,
# each with POD_GATEWAY/32 and a route to its pod's address alone, so every pod's ARP and
# ping are answered on its own VLAN. (A bridge over those devices answered no ARP: they share
# one MAC.)
STREAM_GATEWAY_NETNS = 'stream-gw'
STREAM_VLANS = range(110, 150)
STREAM_THREADS = 2
STREAM_PODS = 12    # at most: the pods of a stream not started when it ends stay unused
STREAM_DEADLINE = 420
STREAM_PAUSE = 1     # seconds between a thread's ADDs
STREAM_AFTER = 2     # pods plugged after the last action
JOURNAL_LAG = 60    # seconds journald may take to store lines already written
_REPLAYED = re.compile(r'Replayed queued DEL \S+ for (\S+): ')


@pytest.fixture(scope='module')
def stream_pods(service):
    """A function making ``count`` pods named ``PREFIX-i``, each with a KuryrPort of one
    VLAN VIF; POD_GATEWAY answers on every stream VLAN in the kernel guest."""
    links = '\n'.join('link add link vec0 name vec0.{0} netns {1} type vlan id {0}'.format(
        vlan, STREAM_GATEWAY_NETNS) for vlan in STREAM_VLANS)
    routes = '\n'.join('addr add {gw}/32 dev vec0.{v}\nlink set vec0.{v} up\n'
                       'route add 10.0.0.{n}/32 dev vec0.{v}'.format(
                           gw=POD_GATEWAY, v=vlan, n=vlan - 100) for vlan in STREAM_VLANS)
    service.guests.run(vm.KERNEL, 'ip netns add {0} && ip -batch - <<EOF && ip -n {0} -batch - '
                       '<<EOF2\n{1}\nEOF\n{2}\nEOF2'.format(STREAM_GATEWAY_NETNS, links, routes)
                       ).check('the stream gateway')
    vlans = iter(STREAM_VLANS)

    def make(prefix, count):
        pods = []
        for i in range(count):
            vlan = next(vlans)
            name, uid = '%s-%d' % (prefix, i), 'uid-%s-%d' % (prefix, i)
            n = vlan - 100
            port = '8c5f3a10-2f4e-4c3b-9a61-%012x' % vlan
            service.api.create_pod('default', name, vm.SYSTEMD, uid=uid)
            service.api.create_kuryrport(
                'default', name, vm.SYSTEMD,
                spec={'podUid': uid, 'podStatic': False, 'podNodeName': vm.SYSTEMD},
                status={'vifs': fx.status_vifs(fx.vlan_vif(vlan_id=vlan, n=n, id=port))})
            pods.append({'name': name, 'uid': uid, 'address': '10.0.0.%d' % n})
        return pods

    try:
        yield make
    finally:
        service.guests.run(vm.KERNEL, 'ip netns del %s' % STREAM_GATEWAY_NETNS)


def _drop_namespaces(service, prefix):
    service.sh("ip netns list | awk '$1 ~ /^%s-/ {print $1}' | xargs -r -n1 ip netns del"
               % prefix)


def _request_lines(service, command, expected):
    """The container IDs of ``command``'s journal lines, once journald holds ``expected``.

    journald reads each process's stream on its own, so a line written before
    another may be stored after it: a bounded wait, then the account as it is.
    """
    def lines():
        return [cid for c, _pod, cid, _ in _REQUEST.findall(service.journal()) if c == command]

    try:
        return wait.until(lambda: set(expected) <= set(lines()) and lines(), JOURNAL_LAG,
                          'the journal lines of %s' % sorted(expected), interval=2)
    except AssertionError:
        return lines()


def _stream(service, pods, before, actions):
    """Run the stream in the guest, print its figures; the result of tests.vm.guest_stream."""
    spec = {'pods': [[pod['name'], pod['uid']] for pod in pods], 'threads': STREAM_THREADS,
            'before': before, 'actions': actions, 'after': STREAM_AFTER, 'pause': STREAM_PAUSE,
            'deadline': STREAM_DEADLINE}
    result = service.python('tests.vm.guest_stream', json.dumps(spec),
                            timeout=STREAM_DEADLINE + 120)
    attempts = result['attempts']
    failed = [a for a in attempts if a['code'] != 0]
    longest = max(attempts, key=lambda a: a['seconds'])
    print('%s: %d ADDs, %d failed (%s), longest %.1f s (%s, code %s); %s' % (
        pods[0]['name'].rsplit('-', 1)[0], len(attempts), len(failed),
        ', '.join(sorted({_reason(a) for a in failed})) or '-', longest['seconds'],
        longest['sandbox'], longest['code'],
        '; '.join('%s %.1f s' % (a['action'], a['seconds']) for a in result['actions'])))
    return result


def _stopping(attempt):
    """Whether a failed ADD's answer came from a daemon being stopped."""
    return attempt['code'] != 0 and any(
        words in json.dumps(attempt['output']) for words in (
            'registry unavailable', 'malformed response'))


def _reason(attempt):
    output = attempt['output'] or {}
    unexpected = output.get('code') == 999      # the details say what went wrong
    return '%s %s%s' % (output.get('code'), output.get('msg'),
                        ' [%s]' % str(output.get('details'))[:160] if unexpected else '')


def _check_stream(service, pods, result, deleted=()):
    """The invariants of a stream: nothing lost, nothing left, one journal line a request."""
    attempts = result['attempts']
    assert result['unfinished'] == 0, result
    # Every ADD answered: success, or a CNI error with its code.
    unanswered = [a for a in attempts
                  if a['code'] != 0 and not isinstance((a['output'] or {}).get('code'), int)]
    assert not unanswered, unanswered
    # Nothing lost: every pod started plugged in the end, once.
    plugged = {a['pod']: a for a in attempts if a['code'] == 0}
    assert sorted(plugged) == sorted({a['pod'] for a in attempts}), attempts
    assert sorted(result['plugged']) == sorted(a['sandbox'] for a in plugged.values())
    failed = [a for a in attempts if a['code'] != 0]
    facts = service.facts(*(a['sandbox'] for a in attempts), ping=POD_GATEWAY)
    bindings = {b['pod']: b for b in facts['bindings']}
    # Every pod that got its answer is connected: its eth0, its address, a ping across its
    # VLAN; its binding owned by that sandbox. A pod whose DEL was sent is unplugged.
    for pod in (pod for pod in pods if pod['name'] in plugged):   # the pods left over:
        sandbox = plugged[pod['name']]['sandbox']                  # never started
        here = facts['netns'][sandbox]
        if sandbox in deleted:
            assert here['eth0'] is None, (pod, here)
            assert 'default/' + pod['name'] not in bindings, bindings
            continue
        addresses = [a['local'] for a in (here['eth0'] or {}).get('addr_info', ())]
        assert pod['address'] in addresses and here['ping'], (pod, here)
        assert bindings['default/' + pod['name']]['owner'] == sandbox, bindings
    # A failed ADD left nothing: no eth0 in its namespace, no sandbox in any binding.
    held = {cid for b in bindings.values() for cid in b['sandboxes']}
    for attempt in failed:
        assert facts['netns'][attempt['sandbox']]['eth0'] is None, (attempt, facts)
        assert attempt['sandbox'] not in held, (attempt, bindings)
    assert facts['state']['del-queue'] == [], facts['state']
    # One journal line per ADD that reached a daemon; none for the shim's own answer.
    reached = {a['sandbox'] for a in attempts
               if 'unreachable' not in json.dumps(a['output'] or {})}
    lines = collections.Counter(_request_lines(service, 'ADD', reached))
    wrong = [(a, lines[a['sandbox']]) for a in attempts
             if lines[a['sandbox']] != (a['sandbox'] in reached)
             and not (lines[a['sandbox']] == 0 and _stopping(a))]
    assert not wrong, (wrong, service.journal()[-3000:])
    # A daemon being stopped may answer without the line (seen in these runs, and in the
    # older test above): counted and shown, for issue 34's restart work.
    lacking = [a for a in attempts if a['sandbox'] in reached and not lines[a['sandbox']]]
    if lacking:
        print('%d ADDs answered by a stopping daemon without their journal line: %s' % (
            len(lacking), '; '.join('%s %s' % (a['sandbox'], _reason(a)) for a in lacking)))
    return plugged


def _unplug_all(service, pods, plugged, deleted=()):
    """DEL every pod still plugged; then nothing of them is left."""
    for pod in (pod for pod in pods if pod['name'] in plugged):
        sandbox = plugged[pod['name']]['sandbox']
        if sandbox not in deleted:
            assert service.cni('del', sandbox, sandbox, pod=pod['name'],
                               uid=pod['uid'])['code'] == 0
    facts = service.facts(*(a['sandbox'] for a in plugged.values()))
    assert all(here['eth0'] is None for here in facts['netns'].values()), facts
    names = {'default/' + pod['name'] for pod in pods}
    assert not names & {b['pod'] for b in facts['bindings']}, facts['bindings']
    assert facts['host_vlans'] == [] and facts['state'] == {
        'bindings': [], 'locks': [], 'del-queue': []}, facts


def test_systemctl_restart_under_a_stream_of_adds_loses_nothing(service, stream_pods):
    pods = stream_pods('restart', STREAM_PODS)
    try:
        result = _stream(service, pods, before=2,
                         actions=['systemctl restart %s' % UNIT])
        assert result['actions'][0]['rc'] == 0, result['actions']
        plugged = _check_stream(service, pods, result)
        _unplug_all(service, pods, plugged)
    finally:
        _drop_namespaces(service, 'restart')


def test_systemctl_stop_and_start_under_a_stream_of_adds_replays_the_dels(service,
                                                                          stream_pods):
    pods = stream_pods('stopstart', STREAM_PODS)
    try:
        result = _stream(service, pods, before=3, actions=[
            'systemctl stop %s' % UNIT,
            ['failures', STREAM_THREADS],           # the ADDs find no daemon...
            ['dels', 2],                            # ...and the DELs are queued
            'ls /var/lib/kuryr-cni/del-queue',
            'systemctl start %s' % UNIT,
        ])
        stop, _failures, _dels, queue_listing, start = result['actions']
        assert stop['rc'] == 0 and start['rc'] == 0, result['actions']
        deleted = [d['sandbox'] for d in result['deleted']]
        assert len(deleted) == 2 and all(d['code'] == 0 for d in result['deleted']), result
        assert len(queue_listing['output'].split()) == 2, queue_listing
        plugged = _check_stream(service, pods, result, deleted=deleted)
        # Each queued DEL replayed once by the started daemon, before its READY=1.
        replayed = _REPLAYED.findall(service.journal())
        assert sorted(cid for cid in replayed if cid.startswith('stopstart-')) == sorted(
            deleted), service.journal()[-3000:]
        _unplug_all(service, pods, plugged, deleted=deleted)
    finally:
        _drop_namespaces(service, 'stopstart')


def test_a_reboot_with_pods_recovers_bindings_and_the_runtime_dels_clean_up(
        service, stream_pods):
    pods = stream_pods('reboot', 2)
    sandboxes = ['%s-s' % pod['name'] for pod in pods]
    try:
        for pod, sandbox in zip(pods, sandboxes):
            service.sh('ip netns add %s' % sandbox).check('the pod namespace')
            assert service.cni('add', sandbox, sandbox, pod=pod['name'],
                               uid=pod['uid'])['code'] == 0
        before = service.facts(*sandboxes, ping=POD_GATEWAY)
        assert all(here['ping'] for here in before['netns'].values()), before
        print(service.guests.reboot(vm.SYSTEMD).strip())
        # Booted: systemd is "running", so the enabled unit went active through READY=1.
        assert service.show('ActiveState')['ActiveState'] == 'active'
        after = service.facts(*sandboxes)
        assert after['netns'] == {sandbox: None for sandbox in sandboxes}, after
        bindings = {b['pod']: b['owner'] for b in after['bindings']}
        assert bindings == {'default/' + pod['name']: sandbox
                            for pod, sandbox in zip(pods, sandboxes)}, after['bindings']
        journal = service.sh('journalctl -b -u %s -o cat --no-pager' % UNIT).check('journal')
        assert 'Recovered 2 pod bindings' in journal, journal[-3000:]
        # The runtime's DELs for the dead sandboxes: their netns paths are gone.
        for pod, sandbox in zip(pods, sandboxes):
            assert service.cni('del', sandbox, sandbox, pod=pod['name'],
                               uid=pod['uid'])['code'] == 0
        left = service.facts(*sandboxes)
        assert left['bindings'] == [] and left['host_vlans'] == [] and left['cached'] == []
        assert left['state'] == {'bindings': [], 'locks': [], 'del-queue': []}, left
        dels = _request_lines(service, 'DEL', sandboxes)
        assert sorted(cid for cid in dels if cid in sandboxes) == sorted(sandboxes)
    finally:
        service.sh('for ns in %s; do ip netns del $ns 2>/dev/null; done; true'
                   % ' '.join(sandboxes))
