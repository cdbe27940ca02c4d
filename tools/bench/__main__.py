"""``python -m tools.bench``: run the benchmark, print the table, write JSON and a chart.

Needs root (it creates network namespaces). Exit status: 0 when the run
completed (targets met or not: the table says which), 1 when it could not run,
2 for bad arguments.
"""

import argparse
import os
import shutil
import signal
import sys
import time

from tools.bench import report
from tools.bench import run as bench_run
from tools.bench import systems


def parse_args(argv):
    defaults = bench_run.Options()
    parser = argparse.ArgumentParser(
        prog='python -m tools.bench',
        description='kuryr-cni against the reference CNI plugins, side by side in one run.')
    parser.add_argument('--pods', type=int, default=defaults.pods,
                        help='pods per phase (default %(default)s)')
    parser.add_argument('--workers', type=int, default=defaults.workers,
                        help='CNI workers of the daemon (default %(default)s)')
    parser.add_argument('--memory-pods', type=int, default=defaults.memory_pods,
                        help='pods attached for the memory and cost-growth figures '
                             '(default %(default)s)')
    parser.add_argument('--version-runs', type=int, default=defaults.version_runs,
                        help='VERSION runs per program (default %(default)s)')
    parser.add_argument('--rounds', type=int, default=defaults.rounds,
                        help='rounds per throughput figure (default %(default)s)')
    parser.add_argument('--concurrency', type=int, nargs='+', default=list(defaults.concurrency),
                        help='concurrency levels of the throughput figures '
                             '(default %(default)s; the highest one is the target\'s)')
    parser.add_argument('--no-reference', action='store_true',
                        help='measure kuryr-cni alone')
    parser.add_argument('--kuryr-daemon', action='store_true',
                        help='also measure kuryr-daemon 10.0.0 (OPENSTACK_CACHE\'s build); '
                             'it ADDs about a pod a second, so it has counts of its own')
    parser.add_argument('--kuryr-daemon-pods', type=int, default=defaults.kuryr_daemon_pods,
                        help='kuryr-daemon: pods of the throughput batch (default %(default)s)')
    parser.add_argument('--kuryr-daemon-serial', type=int,
                        default=defaults.kuryr_daemon_serial,
                        help='kuryr-daemon: serial ADDs and DELs (default %(default)s)')
    parser.add_argument('--kuryr-daemon-memory-pods', type=int, nargs='+',
                        default=list(defaults.kuryr_daemon_memory_pods),
                        help='kuryr-daemon: pods attached for each PSS figure, kuryr-cni '
                             'measured alike (default %(default)s; 500 take kuryr-daemon '
                             '~20 CPU-minutes)')
    parser.add_argument('--kuryr-daemon-attach-concurrency', type=int,
                        default=defaults.kuryr_daemon_attach_concurrency,
                        help='kuryr-daemon: its pods attached for PSS this many at once '
                             '(default %(default)s)')
    parser.add_argument('--kuryr-daemon-attach-budget', type=int,
                        default=defaults.kuryr_daemon_attach_budget,
                        help='kuryr-daemon: seconds its attaching for PSS may take in all; '
                             'a count not reached is measured at the count reached '
                             '(default %(default)s)')
    parser.add_argument('--no-chart', action='store_true', help='write no PNG chart')
    parser.add_argument('--results', default=os.path.join(systems.driver_mod.REPO,
                                                          'bench-results'),
                        help='folder of the results; each run gets a timestamped '
                             'subfolder (default %(default)s)')
    args = parser.parse_args(argv)
    for name in ('pods', 'workers', 'memory_pods', 'version_runs', 'rounds',
                 'kuryr_daemon_pods', 'kuryr_daemon_serial', 'kuryr_daemon_attach_concurrency',
                 'kuryr_daemon_attach_budget'):
        if getattr(args, name) < 1:
            parser.error('--%s must be at least 1' % name.replace('_', '-'))
    if (args.pods + args.memory_pods + max(args.kuryr_daemon_memory_pods) > 60000
            or min(args.concurrency) < 1 or min(args.kuryr_daemon_memory_pods) < 1):
        parser.error('--pods + --memory-pods + --kuryr-daemon-memory-pods must stay under '
                     '60000, --concurrency and --kuryr-daemon-memory-pods above 0')
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if os.geteuid() != 0 or shutil.which('ip') is None:
        print('The benchmark needs root and iproute2: it builds network namespaces.',
              file=sys.stderr)
        return 1
    # SIGTERM unwinds like Ctrl-C, so every namespace and process is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    options = bench_run.Options(
        pods=args.pods, workers=args.workers, memory_pods=args.memory_pods,
        version_runs=args.version_runs, rounds=args.rounds,
        concurrency=tuple(sorted(set(args.concurrency))), reference=not args.no_reference,
        kuryr_daemon=args.kuryr_daemon, kuryr_daemon_pods=args.kuryr_daemon_pods,
        kuryr_daemon_serial=args.kuryr_daemon_serial,
        kuryr_daemon_attach_concurrency=args.kuryr_daemon_attach_concurrency,
        kuryr_daemon_attach_budget=args.kuryr_daemon_attach_budget,
        kuryr_daemon_memory_pods=tuple(sorted(set(args.kuryr_daemon_memory_pods))))
    started = time.monotonic()

    def log(message):
        print('[%6.1fs] %s' % (time.monotonic() - started, message), file=sys.stderr,
              flush=True)

    try:
        data = bench_run.run(options, log)
    except systems.BenchError as exc:
        print('Benchmark failed: %s' % exc, file=sys.stderr)
        return 1
    fig = report.figures(data)
    goals = report.targets(fig, data['options'])
    folder = report.results_dir(args.results, time.strftime('%Y%m%d-%H%M%S'))
    json_path = os.path.join(folder, 'bench.json')
    report.write_json(json_path, data, fig, goals)
    print(report.table(fig, goals, data['options']))
    if data['reference_skipped']:
        print('\nReference skipped: %s' % data['reference_skipped'])
    print('\nJSON:  %s' % json_path)
    if not args.no_chart:
        chart = os.path.join(folder, 'bench.png')
        try:
            report.write_chart(chart, data, fig)
            print('chart: %s' % chart)
        except ImportError:
            print('chart: not drawn, matplotlib is not installed', file=sys.stderr)
    log('Done')
    return 0


if __name__ == '__main__':
    sys.exit(main())
