"""The measured phases, each run on every system under test, interleaved.

Interleaving is how machine drift (other load, CPU frequency, page cache)
hits both systems alike: serial operations alternate system by system, one op
at a time, and the first system of each pair alternates too (A B, B A, ...);
batches alternate the same way round by round. Every function takes the list
of systems (kuryr-cni first, the reference second when present) and returns
samples keyed by system name.
"""

import json

from tools.bench import stub
from tools.bench.systems import BenchError, Sandbox

WARM_UP = 3


def alternate(systems, step):
    """The systems in the order they run at ``step``: reversed every other step."""
    return list(systems) if step % 2 == 0 else list(reversed(systems))


def version_startup(systems, runs):
    """Seconds of VERSION runs of each system's plugin, the order rotating each round.

    VERSION is answered by the plugin alone: what is left is the cost of an
    exec of it. The first ``WARM_UP`` rounds fill the page cache and are not kept.
    """
    jobs = [(s.name, s, s.version_op()) for s in systems]
    samples = {name: [] for name, _, _ in jobs}
    for step in range(WARM_UP + runs):
        shift = step % len(jobs)
        for name, system, op in jobs[shift:] + jobs[:shift]:
            _wall, (result,) = system.driver.run([op])
            if result['code'] != 0:
                raise RuntimeError('%s VERSION failed: %s' % (name, result['stdout']))
            if step >= WARM_UP:
                samples[name].append(result['seconds'])
    return samples


def shim_alone_cpu(system, socket_path, count, concurrency):
    """CPU seconds per ADD and per DEL of ``system``'s shim against a stub daemon.

    ``count`` of each run ``concurrency`` at a time, as the throughput phases
    run them, the shim talking to :class:`tools.bench.stub.StubDaemon` on
    ``socket_path`` instead of the daemon: the part of an operation's CPU no
    daemon behind this shim can take away. Returns ``{'ADD': s, 'DEL': s}``.
    """
    ops = {}
    for command in ('ADD', 'DEL'):
        ops[command] = []
        for index in range(count):
            op = system.op(command, Sandbox('stub-%d' % index, '/run/netns/kc-bench-stub',
                                            'pod-%d' % index, 'uid-%d' % index))
            op['stdin'] = json.dumps(dict(json.loads(op['stdin']), daemon_socket=socket_path))
            ops[command].append(op)
    cpu = {}
    with stub.StubDaemon(socket_path):
        for command in ('ADD', 'DEL'):
            _wall, results = system.driver.run(ops[command], concurrency)
            failed = [r for r in results if r['code'] != 0]
            if failed:
                raise BenchError('shim %s against the stub daemon failed: %s'
                                 % (command, failed[0]['stdout'].strip()))
            cpu[command] = system.driver.cpu / count
    return cpu


def serial(systems, command, sandboxes):
    """One ``command`` at a time per pod, alternating systems; ``{name: [seconds]}``.

    ``sandboxes`` maps each system's name to its list, all of the same length.
    """
    samples = {s.name: [] for s in systems}
    count = len(sandboxes[systems[0].name])
    for step in range(count):
        for system in alternate(systems, step):
            _wall, (seconds,) = system.run(command, [sandboxes[system.name][step]])
            samples[system.name].append(seconds)
    return samples


def batch(systems, command, sandboxes, concurrency, step=0, cpu=None):
    """All of ``command`` at ``concurrency``, system after system; ``{name: wall seconds}``.

    ``cpu``, when given, collects ``{name: [last_cpu, ...]}`` (see
    :attr:`tools.bench.systems.System.last_cpu`).
    """
    walls = {}
    for system in alternate(systems, step):
        walls[system.name], _seconds = system.run(command, sandboxes[system.name], concurrency)
        if cpu is not None:
            cpu.setdefault(system.name, []).append(system.last_cpu)
    return walls


def throughput(systems, make_sandboxes, concurrency, rounds):
    """ADD then DEL of a batch of pods at ``concurrency``, ``rounds`` times.

    ``make_sandboxes()`` returns fresh sandboxes per system for each round.
    Returns ``{name: {'ADD': ops/s, 'DEL': ops/s, 'rounds': [...], 'cpu_ms':
    {'ADD': {'plugin', 'service_user', 'service_sys'}, 'DEL': {...}}}}``: the rate
    is all operations over all wall time, ``cpu_ms`` the CPU milliseconds per
    operation of the plugin processes (``plugin``) and of the system's
    long-running processes (kuryr-cni's daemon) in user space
    (``service_user``) and in the kernel (``service_sys``), which tell what
    limits the rate.
    """
    totals = {s.name: {'ADD': [0, 0.0], 'DEL': [0, 0.0]} for s in systems}
    cpu = {s.name: {'ADD': {}, 'DEL': {}} for s in systems}
    per_round = {s.name: [] for s in systems}
    for step in range(rounds):
        sandboxes = make_sandboxes()
        this_round = {s.name: {} for s in systems}
        for command in ('ADD', 'DEL'):
            used = {}
            for name, wall in batch(systems, command, sandboxes, concurrency, step,
                                    used).items():
                count = len(sandboxes[name])
                totals[name][command][0] += count
                totals[name][command][1] += wall
                this_round[name][command] = round(count / wall, 2)
                for part, seconds in used[name][0].items():
                    cpu[name][command][part] = cpu[name][command].get(part, 0.0) + seconds
        for name in per_round:
            per_round[name].append(this_round[name])
    return {name: {'ADD': round(t['ADD'][0] / t['ADD'][1], 2),
                   'DEL': round(t['DEL'][0] / t['DEL'][1], 2),
                   'rounds': per_round[name],
                   'cpu_ms': {command: {part: round(seconds * 1000 / t[command][0], 2)
                                        for part, seconds in cpu[name][command].items()}
                              for command in ('ADD', 'DEL')}}
            for name, t in totals.items()}


def attach_many(systems, sandboxes, command, concurrency, chunk=100):
    """Run ``command`` for many pods, in interleaved chunks; ``{name: wall seconds}``."""
    walls = {s.name: 0.0 for s in systems}
    count = len(sandboxes[systems[0].name])
    for step, start in enumerate(range(0, count, chunk)):
        part = {name: items[start:start + chunk] for name, items in sandboxes.items()}
        for name, wall in batch(systems, command, part, concurrency, step).items():
            walls[name] += wall
    return walls
