"""``python -m tools.bench.profile``: where the daemon's CPU goes during ADDs.

Starts the benchmark's kuryr-cni test host (:class:`tools.bench.systems.KuryrSystem`)
with every ADD the daemon's workers answer under :mod:`cProfile`, timed by
each thread's own CPU clock (user and system: a netlink request is handled
by the kernel in the sender's context), then runs rounds of ``--pods`` ADDs
at ``--concurrency``, each followed by their DELs; the first round warms up.

Prints the daemon's CPU per ADD by process (from ``/proc``, as the benchmark
splits it), then the top functions of the workers' request threads, by
inclusive and by own time, as milliseconds per ADD. The profiler's own cost
inflates what makes many Python calls; read the shares, not the sums.

``--stages`` times instead only the steps of an ADD listed in ``STAGES``
(each thread's CPU clock read on entry and exit, nothing else): true
milliseconds per ADD, inclusive, with the profiler's cost kept out.
``--stages --wall`` reads the wall clock instead: where the time of an ADD
goes, waits (``fsync``, locks, the kernel's) included, set beside what the
runtime waited for per ADD (the driver's fork to exit), whose remainder is the
shim's exec and its HTTP hop. Meant with ``--concurrency 1``: the serial ADD.
Needs root.
"""

import argparse
import collections
import cProfile
import glob
import os
import pstats
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time

from tools.bench import systems as systems_mod
from tools.testbed import host as testhost

PROFILE_DIR = 'KURYR_CNI_PROFILE_DIR'
STAGES_MODE = 'KURYR_CNI_PROFILE_STAGES'
WALL_MODE = 'KURYR_CNI_PROFILE_WALL'
MEASURING = 'measuring'     # made in the profile directory once the warm-up is over
LOOP = 'server.BoundedServer._turn'
# (module, attribute path) of the steps --stages times, outermost first.
STAGES = (
    ('kuryr_cni.daemon.api', 'CNIHandler.answer'),
    ('kuryr_cni.cni.request', 'parse'),
    ('kuryr_cni.daemon.api', '_log_request'),
    ('kuryr_cni.ownership', 'Ownership.add'),
    ('kuryr_cni.ownership', 'Ownership._wait'),
    ('kuryr_cni.ownership', 'Ownership._claim_and_plug'),
    ('kuryr_cni.ownership', 'Ownership._admit'),
    ('kuryr_cni.ownership', 'Ownership._refuse_foreign_ifname'),
    ('kuryr_cni.ownership', 'Ownership._save'),
    ('kuryr_cni.state', 'BindingStore.save'),
    ('kuryr_cni.binding.bridge', 'BridgeDriver.connect'),
    ('kuryr_cni.binding.bridge', 'BridgeDriver._create_veth'),
    ('kuryr_cni.binding.bridge', 'BridgeDriver._finish_host_end'),
    ('kuryr_cni.binding.podside', 'configure'),
    ('kuryr_cni.rtnl', 'Channel.send'),
    ('pyroute2.netlink.rtnl.ifinfmsg', 'ifinfmsg.encode'),
    ('pyroute2.netlink.rtnl.ifaddrmsg', 'ifaddrmsg.encode'),
    ('pyroute2.netlink.rtnl.rtmsg', 'rtmsg.encode'),
    ('kuryr_cni.cni.result', 'build'),
    ('kuryr_cni.metrics', 'observe_request'),
    ('kuryr_cni.metrics', 'in_flight'),
    ('kuryr_cni.metrics', 'vif_waited'),
)


def _process_cpu(host):
    """{process title: [user, system] CPU seconds} of the daemon's processes."""
    cpu = collections.defaultdict(lambda: [0.0, 0.0])
    for pid, title in host.processes().items():
        try:
            with open('/proc/%d/stat' % pid) as f:
                fields = f.read().rpartition(')')[2].split()
        except FileNotFoundError:
            continue
        name = title.split(':', 1)[-1].strip().split()[0] if ':' in title else 'parent'
        cpu[name][0] += int(fields[11]) / systems_mod.CLOCK_TICKS
        cpu[name][1] += int(fields[12]) / systems_mod.CLOCK_TICKS
    return cpu


def run(args, out_dir):
    os.environ[PROFILE_DIR] = out_dir
    if args.stages:
        os.environ[STAGES_MODE] = '1'
    if args.wall:
        os.environ[WALL_MODE] = '1'
    testhost.daemon_command = lambda: [sys.executable, '-m', 'tools.bench.profile', '--daemon']
    kuryr = systems_mod.KuryrSystem(args.workers)
    adds, spent = 0, collections.defaultdict(lambda: [0.0, 0.0])
    waited = []     # what the runtime waited for, per measured ADD
    try:
        for generation in range(args.rounds + 1):
            sandboxes = kuryr.sandboxes(range(args.pods), generation)
            before = _process_cpu(kuryr.host)
            _, seconds = kuryr.run('ADD', sandboxes, args.concurrency)
            after = _process_cpu(kuryr.host)
            if generation == 0:
                # From now on the daemon's ADDs count (see _measuring).
                open(os.path.join(out_dir, MEASURING), 'w').close()
            else:
                adds += len(sandboxes)
                waited.extend(seconds)
                for name, (user, system) in after.items():
                    spent[name][0] += user - before.get(name, (0, 0))[0]
                    spent[name][1] += system - before.get(name, (0, 0))[1]
            kuryr.run('DEL', sandboxes, args.concurrency)
    finally:
        kuryr.close()
    return adds, spent, waited


def report(args, adds, spent, waited, out_dir):
    print('%d ADDs at concurrency %d, %d workers; daemon CPU per ADD (ms), under the profiler:'
          % (adds, args.concurrency, args.workers))
    for name, (user, system) in sorted(spent.items(), key=lambda kv: -sum(kv[1])):
        print('  %-12s user %6.2f  system %6.2f' % (name, 1000 * user / adds,
                                                    1000 * system / adds))
    if args.stages:
        totals = collections.Counter()
        for path in glob.glob(os.path.join(out_dir, '*.stages')):
            with open(path) as f:
                totals.update({k: float(v) for k, v in (line.split() for line in f)})
        clock = 'wall clock' if args.wall else 'thread CPU (user and system)'
        print('\nADD steps, %s per ADD, inclusive:' % clock)
        for module, name in STAGES:
            key = '%s.%s' % (module.rpartition('.')[2], name)
            print('  %6.3f ms  %s' % (1000 * totals[key] / adds, key))
        if not args.wall:
            print('  %6.3f ms  %s, per request (the DELs between ADDs alike)'
                  % (1000 * totals[LOOP] / (2 * adds), LOOP))
        else:
            print('  %6.3f ms  what the runtime waited for (mean; median %.3f)'
                  % (1000 * statistics.mean(waited), 1000 * statistics.median(waited)))
        return
    files = glob.glob(os.path.join(out_dir, '*.prof'))
    if not files:
        print('no profile was written', file=sys.stderr)
        return
    stats = pstats.Stats(*files)
    total = stats.total_tt
    print('\nrequest threads: %.2f ms per ADD in all' % (1000 * total / adds))
    for title, key in (('inclusive', 3), ('own', 2)):
        print('\nTop %d by %s time (ms per ADD, share):' % (args.top, title))
        rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][key])[:args.top]
        for (path, line, func), row in rows:
            print('  %6.3f  %5.1f%%  %s (%s:%d)' % (
                1000 * row[key] / adds, 100 * row[key] / total, func, _short(path), line))


def _short(path):
    for marker in ('site-packages/', '/kuryr_cni/', 'lib/python3.11/'):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def daemon():
    """The daemon, each ADD profiled in its worker thread, dumped after each."""
    from kuryr_cni.daemon import api
    from kuryr_cni.daemon import main as daemon_main

    out_dir = os.environ[PROFILE_DIR]
    local = threading.local()
    answer = api.CNIHandler.answer
    if os.environ.get(STAGES_MODE):
        _time_stages(out_dir, local)
        sys.argv[1:] = sys.argv[2:]
        return daemon_main.main()

    def profiled(self, request):
        if not _measuring(request, out_dir):
            return answer(self, request)
        if not hasattr(local, 'profile'):
            local.profile = cProfile.Profile(time.thread_time)
            local.path = os.path.join(out_dir, '%d-%d.prof'
                                      % (os.getpid(), threading.get_ident()))
        local.profile.enable()
        try:
            return answer(self, request)
        finally:
            local.profile.disable()
            local.profile.dump_stats(local.path)

    api.CNIHandler.answer = profiled
    sys.argv[1:] = sys.argv[2:]
    return daemon_main.main()


def _time_stages(out_dir, local):
    """Wrap every STAGES function: thread CPU (or wall time) spent inside it during ADDs,
    dumped per thread."""
    import importlib

    clock = time.monotonic if os.environ.get(WALL_MODE) else time.thread_time

    def timed(key, function, dump):
        def wrapper(*args, **kwargs):
            if not getattr(local, 'in_add', False):
                return function(*args, **kwargs)
            started = clock()
            try:
                return function(*args, **kwargs)
            finally:
                local.spent[key] += clock() - started
                if dump:
                    with open(local.path, 'w') as f:
                        f.writelines('%s %r\n' % item for item in local.spent.items())
        return wrapper

    for position, (module_name, name) in enumerate(STAGES):
        *outer, attribute = name.split('.')
        try:
            owner = importlib.import_module(module_name)
            for part in outer:
                owner = getattr(owner, part)
            getattr(owner, attribute)
        except (ImportError, AttributeError):
            continue        # a step this version of the daemon does not have
        key = '%s.%s' % (module_name.rpartition('.')[2], name)
        wrapped = timed(key, getattr(owner, attribute), dump=position == 0)
        if position == 0:
            wrapped = _marking_adds(wrapped, local, out_dir)
        setattr(owner, attribute, wrapped)
    if clock is time.thread_time:      # by the wall clock, a turn is mostly waiting
        _time_loop(out_dir, clock)


def _time_loop(out_dir, clock):
    """Thread CPU of the server loops' turns (every request's, ADD or DEL), per process."""
    from kuryr_cni.daemon import server

    turn = server.BoundedServer._turn
    spent = [0.0, 0]
    path = os.path.join(out_dir, '%d-loop.stages' % os.getpid())

    def timed_turn(self, *args):
        if not os.path.exists(os.path.join(out_dir, MEASURING)):
            return turn(self, *args)
        started = clock()
        try:
            return turn(self, *args)
        finally:
            spent[0] += clock() - started
            spent[1] += 1
            if spent[1] % 20 == 0:
                with open(path, 'w') as f:
                    f.write('%s %r\n' % (LOOP, spent[0]))

    server.BoundedServer._turn = timed_turn


def _measuring(request, out_dir):
    """Whether ``request`` is an ADD past the warm-up."""
    return request.path == '/addNetwork' and os.path.exists(os.path.join(out_dir, MEASURING))


def _marking_adds(answer, local, out_dir):
    def marked(self, request):
        if not _measuring(request, out_dir):
            return answer(self, request)
        if not hasattr(local, 'spent'):
            local.spent = collections.Counter()
            local.path = os.path.join(out_dir, '%d-%d.stages'
                                      % (os.getpid(), threading.get_ident()))
        local.in_add = True
        try:
            return answer(self, request)
        finally:
            local.in_add = False
    return marked


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ['--daemon']:
        return daemon()
    parser = argparse.ArgumentParser(prog='python -m tools.bench.profile',
                                     description=__doc__.split('\n\n')[0])
    parser.add_argument('--pods', type=int, default=50)
    parser.add_argument('--rounds', type=int, default=6)
    parser.add_argument('--concurrency', type=int, default=50)
    parser.add_argument('--workers', type=int, default=4)
    parser.add_argument('--top', type=int, default=40)
    parser.add_argument('--stages', action='store_true',
                        help='time the steps of STAGES only, without cProfile')
    parser.add_argument('--wall', action='store_true',
                        help='with --stages: by the wall clock, not the thread CPU clock')
    args = parser.parse_args(argv)
    if os.geteuid() != 0 or shutil.which('ip') is None:
        print('Needs root and iproute2: it builds network namespaces.', file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix='kc-profile-') as out_dir:
        try:
            adds, spent, waited = run(args, out_dir)
        except systems_mod.BenchError as exc:
            print('Profile failed: %s' % exc, file=sys.stderr)
            return 1
        report(args, adds, spent, waited, out_dir)
    return 0


if __name__ == '__main__':
    sys.exit(main())
