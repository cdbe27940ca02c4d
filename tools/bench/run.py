"""One whole benchmark run, phase after phase; returns the raw measurements.

Order: start both systems → daemon PSS idle → VERSION start-up → serial ADD
and DEL → throughput at each concurrency → the shim against a stub daemon, at
the highest concurrency → ADD latency with no
pods attached → system after system: attach ``memory_pods`` → (kuryr-cni)
daemon PSS → ADD latency with them attached → delete them → ADD latency with
none again → check nothing is left → daemon PSS with ``workers`` and
``workers + 2`` CNI workers after the same warm-up → (with ``kuryr_daemon``)
kuryr-daemon 10.0.0 on a third test host, beside the other two
(:func:`_against_kuryr_daemon`) → remove every test host.
Every system's hosts, namespaces, processes and files are removed on the way
out, also on failure or SIGTERM.
"""

import contextlib
import dataclasses
import itertools
import os
import platform
import subprocess
import time

from tools.bench import driver as driver_mod
from tools.bench import memory
from tools.bench import systems as systems_mod
from tools.bench import upstream
from tools.bench import workload

EXTRA_WORKERS = 2
ATTACH_CHUNK = 25       # kuryr-daemon's pods attached per batch (the budget is checked between)


@dataclasses.dataclass
class Options:
    pods: int = 50
    workers: int = 4
    memory_pods: int = 500
    version_runs: int = 60
    rounds: int = 2
    concurrency: tuple = (10, 50)
    reference: bool = True
    kuryr_daemon: bool = False
    # kuryr-daemon ADDs ~1 pod/s at c=50 on two cores: its phase has counts of its own.
    kuryr_daemon_pods: int = 50             # per throughput batch, at the highest concurrency
    kuryr_daemon_serial: int = 10           # serial ADDs and DELs
    kuryr_daemon_memory_pods: tuple = (50,)  # pods attached for each PSS figure
    kuryr_daemon_attach_concurrency: int = 10   # its pods attached for PSS, this many at once
    kuryr_daemon_attach_budget: int = 3600      # seconds its attaching may take in all


def run(options, log):
    """Run every phase; returns the measurements (see :mod:`tools.bench.report`)."""
    data = {'options': dataclasses.asdict(options), 'machine': _machine(), 'hosts': []}
    with contextlib.ExitStack() as stack:
        log('Starting kuryr-cni (daemon with %d workers) on a test host' % options.workers)
        kuryr = systems_mod.KuryrSystem(options.workers)
        stack.callback(kuryr.close)
        data['hosts'].append({'netns': kuryr.host.ns, 'workdir': kuryr.host.workdir})
        systems = [kuryr]
        missing = (systems_mod.reference_missing() if options.reference
                   else 'disabled with --no-reference')
        if missing:
            log('Skipping the reference plugins: %s' % missing)
        else:
            log('Setting up the reference plugins (bridge + host-local) on a test host')
            reference = systems_mod.ReferenceSystem()
            stack.callback(reference.close)
            data['hosts'].append({'netns': reference.host.ns, 'workdir': reference.host.workdir})
            systems.append(reference)
        data['reference_skipped'] = missing
        data['pss_idle'] = memory.daemon_pss(kuryr.host)
        data.update(_measure(systems, kuryr, options, log))
        data['leftovers'] = {s.name: s.leftovers() for s in systems}
        data['pss_workers'] = _compare_workers(kuryr, options, log)
        if options.kuryr_daemon:
            data['kuryr_daemon'] = _against_kuryr_daemon(stack, systems, kuryr, options, log)
        data['daemon_forced_stops'] = kuryr.forced_stops
        log('Removing the test hosts')
    return data


def _measure(systems, kuryr, options, log):
    out = {}
    generation = itertools.count()
    base = range(options.pods)

    def fresh(indexes):
        gen = next(generation)
        return {s.name: s.sandboxes(indexes, gen) for s in systems}

    log('VERSION start-up, %d runs each' % options.version_runs)
    out['version'] = workload.version_startup(systems, options.version_runs)

    log('Serial ADD and DEL of %d pods' % options.pods)
    sandboxes = fresh(base)
    out['serial_add'] = workload.serial(systems, 'ADD', sandboxes)
    out['ping'] = {s.name: s.host.ping(sandboxes[s.name][0].netns, s.gateway())
                   for s in systems}
    out['serial_del'] = workload.serial(systems, 'DEL', sandboxes)

    out['throughput'] = {}
    for concurrency in options.concurrency:
        log('Throughput: ADD then DEL of %d pods at concurrency %d, %d rounds'
            % (options.pods, concurrency, options.rounds))
        out['throughput'][str(concurrency)] = workload.throughput(
            systems, lambda: fresh(base), concurrency, options.rounds)
    top = max(options.concurrency)
    log('The shim against a stub daemon at concurrency %d' % top)
    out['shim_alone_cpu'] = workload.shim_alone_cpu(
        kuryr, os.path.join(kuryr.host.workdir, 'stub.sock'), options.pods, top)

    log('ADD latency with no pods attached')
    sandboxes = fresh(base)
    out['add_none'] = workload.serial(systems, 'ADD', sandboxes)
    workload.serial(systems, 'DEL', sandboxes)

    many = range(options.pods, options.pods + options.memory_pods)
    attached = fresh(many)
    for key in ('attach_wall', 'add_attached', 'del_attached', 'detach_wall'):
        out[key] = {}
    for system in systems:
        # One system's pods at a time: the other's would load the machine too
        # (the reference's pods and bridge ports keep IPv6 link-local
        # addresses, whose multicast their bridge floods to every port).
        log('%s: attaching %d pods (concurrency %d), then ADD latency with them attached'
            % (system.label, options.memory_pods, top))
        out['attach_wall'].update(workload.attach_many([system], attached, 'ADD', top))
        if system is kuryr:
            out['pss_attached'] = memory.daemon_pss(kuryr.host)
        sandboxes = {system.name: system.sandboxes(base, next(generation))}
        out['add_attached'].update(workload.serial([system], 'ADD', sandboxes))
        out['del_attached'].update(workload.serial([system], 'DEL', sandboxes))
        log('%s: deleting the %d pods, then ADD latency with none again'
            % (system.label, options.memory_pods))
        out['detach_wall'].update(workload.attach_many([system], attached, 'DEL', top))
        # Pooled with the samples taken before attaching: the two bracket the
        # attached phase, so a machine drifting meanwhile moves both sides.
        sandboxes = {system.name: system.sandboxes(base, next(generation))}
        out['add_none'][system.name] += workload.serial([system], 'ADD', sandboxes)[system.name]
        workload.serial([system], 'DEL', sandboxes)
    return out


def _against_kuryr_daemon(stack, systems, kuryr, options, log):
    """kuryr-daemon 10.0.0 beside the others: the same phases, the same VIFs, own counts.

    Runs after the worker comparison, which leaves kuryr-cni's daemon with
    ``workers + 2`` workers: it is set back to ``workers`` first. Serial operations and the
    throughput batch are interleaved with the other systems as everywhere
    (each with fresh sandboxes of the same pod indexes); the memory figures
    attach each count of pods to kuryr-daemon and then to kuryr-cni (only
    one system's pods attached at a time) and read both daemons' PSS
    (:func:`_upstream_memory`). Returns the raw measurements, or ``{'skipped':
    why}``, or ``{'failed': why, 'measured': what was measured before}`` (the
    other systems' figures are kept either way).
    """
    missing = upstream.missing()
    if missing:
        log('Skipping kuryr-daemon: %s' % missing)
        return {'skipped': missing}
    log('Starting kuryr-daemon 10.0.0 on a test host')
    upstream_system = upstream.KuryrDaemonSystem()
    stack.callback(upstream_system.close)
    out = {}
    try:
        _upstream_phase(upstream_system, systems, kuryr, options, log, out)
        return out
    except (systems_mod.BenchError, driver_mod.DriverError) as exc:
        # The figures of the other systems are kept, and the failure (with the
        # tail of kuryr-daemon's log) is reported.
        log('kuryr-daemon phase failed: %s' % exc)
        out['retried'] = dict(out.get('retried', {}), failed=upstream_system.take_failures())
        out['daemon_errors'] = upstream_system.daemon_errors()
        return {'failed': str(exc)[:8000], 'measured': out}


def _load():
    """The machine's 1-minute load average now: every kuryr-daemon figure carries one."""
    return round(os.getloadavg()[0], 1)


def _upstream_phase(upstream_system, systems, kuryr, options, log, out):
    kuryr.restart_daemon(options.workers)
    out.update(pss_idle=memory.daemon_pss(upstream_system.session),
               kuryr_pss_idle=memory.daemon_pss(kuryr.host), load={'pss_idle': _load()}, retried={})
    every = list(systems) + [upstream_system]
    generation = itertools.count(2000)

    def fresh(indexes):
        gen = next(generation)
        return {s.name: s.sandboxes(indexes, gen) for s in every}

    log('kuryr-daemon: serial ADD and DEL of %d pods, beside the others (load %s)'
        % (options.kuryr_daemon_serial, _load()))
    sandboxes = fresh(range(options.kuryr_daemon_serial))
    out['serial_add'] = workload.serial(every, 'ADD', sandboxes)
    out['load']['serial_add'] = _load()
    out['retried']['serial_add'] = upstream_system.take_failures()
    out['ping'] = upstream_system.host.ping(sandboxes[upstream_system.name][0].netns,
                                            upstream_system.gateway())
    out['serial_del'] = workload.serial(every, 'DEL', sandboxes)
    out['load']['serial_del'] = _load()
    out['retried']['serial_del'] = upstream_system.take_failures()
    top = max(options.concurrency)
    log('kuryr-daemon: ADD then DEL of %d pods at concurrency %d, beside the others (load %s)'
        % (options.kuryr_daemon_pods, top, _load()))
    out['throughput'] = workload.throughput(
        every, lambda: fresh(range(options.kuryr_daemon_pods)), top, 1)
    out['load']['throughput'] = _load()
    out['retried']['throughput'] = upstream_system.take_failures()
    out['concurrency'] = top
    out['leftovers'] = upstream_system.leftovers()
    _upstream_memory(upstream_system, kuryr, options, log, generation, out)
    out['retried']['attach'] = upstream_system.take_failures()
    out['daemon_errors'] = upstream_system.daemon_errors()


def _upstream_memory(upstream_system, kuryr, options, log, generation, out):
    """PSS of both daemons with each count of pods attached, one system's pods at a time.

    kuryr-daemon first, its pods attached in chunks at
    ``kuryr_daemon_attach_concurrency``, growing to each count in turn (no DEL
    between counts), until ``kuryr_daemon_attach_budget`` seconds are spent: a
    count it did not reach is measured at the count it did reach
    (``partial``). Its pods stay until its test host goes (their DELs measure
    nothing and cost seconds of CPU each). Then kuryr-cni, grown to the very
    counts kuryr-daemon was measured at, its pods deleted after. Writes into ``out``.
    """
    first = options.pods + options.memory_pods
    out.update(pss_attached={}, attach={})
    measured = []
    deadline = time.monotonic() + options.kuryr_daemon_attach_budget
    attached = 0
    for count in options.kuryr_daemon_memory_pods:
        while attached < count and time.monotonic() < deadline:
            step = min(count - attached, ATTACH_CHUNK)
            log('%s: attaching pods %d to %d of %d for its PSS, concurrency %d (load %s)'
                % (upstream_system.label, attached + 1, attached + step, count,
                   options.kuryr_daemon_attach_concurrency, _load()))
            part = {upstream_system.name: upstream_system.sandboxes(
                range(first + attached, first + attached + step), next(generation))}
            wall = workload.batch([upstream_system], 'ADD', part,
                                  options.kuryr_daemon_attach_concurrency)
            out['attach'].setdefault(str(count), []).append(
                {'pods': step, 'wall': round(wall[upstream_system.name], 1), 'load': _load()})
            attached += step
        if attached == 0:
            break
        key = str(attached)
        out['pss_attached'][key] = {upstream_system.name: memory.daemon_pss(
            upstream_system.session)}
        out['load']['pss_%s_%s' % (key, upstream_system.name)] = _load()
        measured.append(attached)
        if attached < count:
            log('%s: attach budget of %d s spent at %d of %d pods'
                % (upstream_system.label, options.kuryr_daemon_attach_budget, attached, count))
            out['partial'] = {'wanted': count, 'reached': attached}
            break
    top = max(options.concurrency)
    sandboxes = []
    for count in measured:
        log('%s: attaching up to %d pods for its PSS' % (kuryr.label, count))
        more = kuryr.sandboxes(range(first + len(sandboxes), first + count), next(generation))
        workload.attach_many([kuryr], {kuryr.name: more}, 'ADD', top)
        sandboxes += more
        out['pss_attached'][str(count)][kuryr.name] = memory.daemon_pss(kuryr.host)
        out['load']['pss_%d_%s' % (count, kuryr.name)] = _load()
    if sandboxes:
        workload.attach_many([kuryr], {kuryr.name: sandboxes}, 'DEL', top)


def _compare_workers(kuryr, options, log):
    """Daemon PSS with ``workers`` and ``workers + 2`` CNI workers, same warm-up each.

    Each daemon is started afresh and serves ADD then DEL of ``pods`` pods at
    the highest concurrency (which spreads requests over every worker) before
    it is measured idle.
    """
    result = {}
    indexes = range(options.pods)
    for step, workers in enumerate((options.workers, options.workers + EXTRA_WORKERS)):
        log('Daemon memory with %d workers after a warm-up' % workers)
        kuryr.restart_daemon(workers)
        sandboxes = {kuryr.name: kuryr.sandboxes(indexes, 1000 + step)}
        for command in ('ADD', 'DEL'):
            workload.batch([kuryr], command, sandboxes, max(options.concurrency))
        result[str(workers)] = memory.daemon_pss(kuryr.host)
    return result


def _machine():
    def output(*cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            return None
    return {'time': time.strftime('%Y-%m-%dT%H:%M:%S%z'), 'kernel': platform.release(),
            'python': platform.python_version(), 'cpus': len(os.sched_getaffinity(0)),
            'commit': output('git', '-C', systems_mod.driver_mod.REPO, 'rev-parse', 'HEAD'),
            'reference_package': output('dpkg-query', '-W', '-f', '${Version}',
                                        'containernetworking-plugins') or None}
