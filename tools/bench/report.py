"""From raw measurements to figures, targets, a terminal table, JSON and a chart.

Every figure that has a counterpart in the reference plugins also carries its
ratio to it (kuryr-cni / reference: below 1 is faster for latencies, above 1
is faster for throughput). The targets are those of issue 12, ratios to the
reference checked on medians of the same run, and the daemon's memory.
"""

import json
import os

from tools.bench import stats

KURYR = 'kuryr'
REFERENCE = 'reference'
UPSTREAM = 'kuryr_daemon'
LATENCIES = ('serial_add', 'serial_del', 'add_none', 'add_attached', 'del_attached')


def figures(data):
    """The figures of a run (see doc/source/benchmark.rst for each one)."""
    opts = data['options']
    out = {'version_ms': {name: stats.latency_ms(samples)
                          for name, samples in data['version'].items()}}
    version = out['version_ms']
    version['ratio'] = stats.ratio(version[KURYR]['median'],
                                   version.get(REFERENCE, {}).get('median'))
    for key in LATENCIES:
        entry = {name: stats.latency_ms(samples) for name, samples in data[key].items()}
        entry['ratio'] = {q: stats.ratio(entry[KURYR][q], entry.get(REFERENCE, {}).get(q))
                          for q in ('median', 'p90', 'p99')}
        out[key + '_ms'] = entry
    out['throughput_ops_per_s'] = {}
    out['cpu_ms_per_op'] = {}
    for concurrency, rates in data['throughput'].items():
        for command in ('ADD', 'DEL'):
            key = '%s_c%s' % (command.lower(), concurrency)
            entry = {name: rates[name][command] for name in rates}
            entry['ratio'] = stats.ratio(entry[KURYR], entry.get(REFERENCE))
            out['throughput_ops_per_s'][key] = entry
            cpu = {}
            for name in rates:
                used = dict(rates[name]['cpu_ms'][command])
                used['total'] = round(sum(used.values()), 2)
                cpu[name] = used
            cpu['ratio'] = stats.ratio(cpu[KURYR]['total'], cpu.get(REFERENCE, {}).get('total'))
            out['cpu_ms_per_op'][key] = cpu
    out['shim_alone_cpu_ms'] = {command.lower(): round(seconds * 1000, 2)
                                for command, seconds in data['shim_alone_cpu'].items()}
    growth = {name: stats.ratio(out['add_attached_ms'][name]['median'],
                                out['add_none_ms'][name]['median'])
              for name in data['add_none']}
    growth['ratio'] = stats.ratio(growth[KURYR], growth.get(REFERENCE))
    out['add_growth'] = growth
    workers = {int(w): pss['total_mib'] for w, pss in data['pss_workers'].items()}
    low, high = min(workers), max(workers)
    out['daemon_pss_mib'] = {
        'workers': opts['workers'], 'attached_pods': opts['memory_pods'],
        'idle': data['pss_idle']['total_mib'],
        'attached': data['pss_attached']['total_mib'],
        'after_warm_up': {str(w): total for w, total in sorted(workers.items())},
        'per_extra_worker': round((workers[high] - workers[low]) / (high - low), 2),
    }
    out['pings'] = data['ping']
    out['clean'] = not any(data['leftovers'].values())
    if 'kuryr_daemon' in data:
        out['kuryr_daemon'] = upstream_figures(data['kuryr_daemon'])
    return out


def upstream_figures(raw):
    """The figures of the kuryr-daemon phase: each system's, and kuryr-cni / kuryr-daemon."""
    if 'skipped' in raw or 'failed' in raw:
        return dict(raw)
    out = {'concurrency': raw['concurrency'], 'ping': raw['ping'],
           'clean': not raw['leftovers'], 'leftovers': raw['leftovers'],
           'load': raw.get('load', {}), 'partial': raw.get('partial'),
           'retried': {phase: len(ops) for phase, ops in raw.get('retried', {}).items()},
           'daemon_errors': raw.get('daemon_errors', {})}
    for key in ('serial_add', 'serial_del'):
        entry = {name: stats.latency_ms(samples) for name, samples in raw[key].items()}
        entry['ratio'] = stats.ratio(entry[KURYR]['median'], entry[UPSTREAM]['median'])
        out[key + '_ms'] = entry
    for command in ('ADD', 'DEL'):
        rates = {name: raw['throughput'][name][command] for name in raw['throughput']}
        rates['ratio'] = stats.ratio(rates[KURYR], rates[UPSTREAM])
        out[command.lower() + '_ops_per_s'] = rates
        cpu = {}
        for name in raw['throughput']:
            used = dict(raw['throughput'][name]['cpu_ms'][command])
            used['total'] = round(sum(used.values()), 2)
            cpu[name] = used
        cpu['ratio'] = stats.ratio(cpu[KURYR]['total'], cpu[UPSTREAM]['total'])
        out[command.lower() + '_cpu_ms'] = cpu
    pss = {'idle': {KURYR: raw['kuryr_pss_idle']['total_mib'],
                    UPSTREAM: raw['pss_idle']['total_mib']}}
    for count, totals in raw['pss_attached'].items():
        pss[count] = {name: p['total_mib'] for name, p in totals.items()}
    for entry in pss.values():
        entry['ratio'] = stats.ratio(entry[KURYR], entry[UPSTREAM])
    out['pss_mib'] = pss
    return out


def targets(fig, opts):
    """Issue 12's targets, raised by issue 23 (ADD throughput, serial ADD, the daemon's
    user CPU per ADD) and by issue 34 (ADD throughput and serial ADD again, PSS, PSS
    against kuryr-daemon's): ``[{name, value, limit, op, unit, met}]`` (met None: not
    measured)."""
    top = str(max(opts['concurrency']))
    pss = fig['daemon_pss_mib']
    add_cpu = fig['cpu_ms_per_op'].get('add_c' + top, {}).get(KURYR, {})
    rows = [
        ('shim VERSION median vs reference', fig['version_ms']['ratio'], '<=', 1.2, 'x'),
        ('serial ADD median vs reference', fig['serial_add_ms']['ratio']['median'], '<=', 0.8,
         'x'),
        ('serial DEL median vs reference', fig['serial_del_ms']['ratio']['median'], '<=', 1.1,
         'x'),
        ('ADD throughput at c=%s vs reference' % top,
         fig['throughput_ops_per_s'].get('add_c' + top, {}).get('ratio'), '>=', 1.5, 'x'),
        ('DEL throughput at c=%s vs reference' % top,
         fig['throughput_ops_per_s'].get('del_c' + top, {}).get('ratio'), '>=', 1.2, 'x'),
        ('daemon user-space CPU per ADD at c=%s' % top, add_cpu.get('service_user'), '<=', 3.5,
         'ms'),
        ('daemon PSS, %d workers, %d pods attached' % (pss['workers'], pss['attached_pods']),
         pss['attached'], '<=', 150, 'MiB'),
        ('ADD median with %d pods attached / with none' % pss['attached_pods'],
         fig['add_growth'][KURYR], '<=', 1.2, 'x'),
    ]
    upstream = fig.get('kuryr_daemon', {}).get('pss_mib', {})
    for count in sorted((c for c in upstream if c != 'idle'), key=int):
        rows.append(('daemon PSS vs kuryr-daemon\'s, %s pods attached' % count,
                     upstream[count]['ratio'], '<=', 0.75, 'x'))
    out = []
    for name, value, op, limit, unit in rows:
        met = None if value is None else (value <= limit if op == '<=' else value >= limit)
        out.append({'name': name, 'value': value, 'op': op, 'limit': limit, 'unit': unit,
                    'met': met})
    return out


# --- the terminal table -----------------------------------------------------------

def table(fig, goals, opts):
    """The figures as a plain-text table, then the targets."""
    rows = [('figure', 'kuryr-cni', 'reference', 'ratio')]
    version = fig['version_ms']
    rows.append(('VERSION start-up, median (ms)', version[KURYR]['median'],
                 version.get(REFERENCE, {}).get('median'), version['ratio']))
    titles = {'serial_add': 'serial ADD', 'serial_del': 'serial DEL',
              'add_none': 'ADD, no pods attached',
              'add_attached': 'ADD, %d pods attached' % opts['memory_pods'],
              'del_attached': 'DEL, %d pods attached' % opts['memory_pods']}
    for key in LATENCIES:
        entry = fig[key + '_ms']
        for q in (('median', 'p90', 'p99') if key.startswith('serial') else ('median',)):
            rows.append(('%s, %s (ms)' % (titles[key], q), entry[KURYR][q],
                         entry.get(REFERENCE, {}).get(q), entry['ratio'][q]))
    for key, entry in fig['throughput_ops_per_s'].items():
        command, concurrency = key.split('_c')
        rows.append(('%s throughput, concurrency %s (ops/s)' % (command.upper(), concurrency),
                     entry[KURYR], entry.get(REFERENCE), entry['ratio']))
    top = str(max(opts['concurrency']))
    for command in ('add', 'del'):
        entry = fig['cpu_ms_per_op']['%s_c%s' % (command, top)]
        ref = entry.get(REFERENCE, {})
        rows.append(('%s CPU per op at c=%s, total (ms)' % (command.upper(), top),
                     entry[KURYR]['total'], ref.get('total'), entry['ratio']))
        rows.append(('  the shim (reference: bridge + host-local) (ms)', entry[KURYR]['plugin'],
                     ref.get('plugin'), None))
        rows.append(('    the shim alone, against a stub daemon (ms)',
                     fig['shim_alone_cpu_ms'][command], None, None))
        rows.append(('  the daemon in user space (ms)', entry[KURYR]['service_user'], None, None))
        rows.append(('  the daemon in the kernel (ms)', entry[KURYR]['service_sys'], None, None))
    growth = fig['add_growth']
    rows.append(('ADD cost growth (attached / none)', growth[KURYR], growth.get(REFERENCE),
                 growth['ratio']))
    pss = fig['daemon_pss_mib']
    rows.append(('daemon PSS idle, %d workers (MiB)' % pss['workers'], pss['idle'], None, None))
    rows.append(('daemon PSS, %d pods attached (MiB)' % pss['attached_pods'], pss['attached'],
                 None, None))
    for workers, total in pss['after_warm_up'].items():
        rows.append(('daemon PSS after warm-up, %s workers (MiB)' % workers, total, None, None))
    rows.append(('daemon PSS per extra worker (MiB)', pss['per_extra_worker'], None, None))
    text = _columns(rows)
    if 'kuryr_daemon' in fig:
        text.append('')
        text.extend(upstream_table(fig['kuryr_daemon']))
    text.append('')
    for goal in goals:
        verdict = {True: 'met', False: 'MISSED', None: 'not measured'}[goal['met']]
        text.append('target: %-48s %8s %s %s %s  %s' % (
            goal['name'], _fmt(goal['value']), goal['op'], goal['limit'], goal['unit'],
            verdict))
    return '\n'.join(text)


def upstream_table(up):
    """The kuryr-daemon phase's figures: the three systems side by side."""
    if 'skipped' in up or 'failed' in up:
        return ['kuryr-daemon 10.0.0 %s' % ('skipped: ' + up['skipped'] if 'skipped' in up
                                            else 'FAILED: ' + up['failed'])]
    load = up.get('load', {})
    rows = [('against kuryr-daemon 10.0.0', 'kuryr-cni', 'reference', 'kuryr-daemon',
             'ratio', 'load')]
    for key, title in (('serial_add', 'serial ADD'), ('serial_del', 'serial DEL')):
        entry = up[key + '_ms']
        for q in ('median', 'p90'):
            rows.append(('%s, %s (ms)' % (title, q), entry[KURYR][q],
                         entry.get(REFERENCE, {}).get(q), entry[UPSTREAM][q],
                         entry['ratio'] if q == 'median' else None, load.get(key)))
    for command in ('add', 'del'):
        rates = up[command + '_ops_per_s']
        rows.append(('%s throughput, concurrency %s (ops/s)' % (command.upper(),
                                                                up['concurrency']),
                     rates[KURYR], rates.get(REFERENCE), rates[UPSTREAM], rates['ratio'],
                     load.get('throughput')))
        cpu = up[command + '_cpu_ms']
        rows.append(('%s CPU per op, total (ms)' % command.upper(), cpu[KURYR]['total'],
                     cpu.get(REFERENCE, {}).get('total'), cpu[UPSTREAM]['total'],
                     cpu['ratio'], None))
        for part, title in (('plugin', 'the executable the runtime runs'),
                            ('service_user', 'the daemon in user space'),
                            ('service_sys', 'the daemon in the kernel')):
            rows.append(('  %s (ms)' % title, cpu[KURYR][part],
                         cpu.get(REFERENCE, {}).get(part) if part == 'plugin' else None,
                         cpu[UPSTREAM][part], None, None))
    for count, entry in up['pss_mib'].items():
        title = 'idle' if count == 'idle' else '%s pods attached' % count
        rows.append(('daemon PSS, %s (MiB)' % title, entry[KURYR], None, entry[UPSTREAM],
                     entry['ratio'],
                     load.get('pss_idle' if count == 'idle' else 'pss_%s_%s' % (count,
                                                                                UPSTREAM))))
    lines = _columns(rows)
    lines.append('(ratio: kuryr-cni / kuryr-daemon; load: 1-minute load average after the '
                 'figure; kuryr-daemon left after its DELs: %s)'
                 % ({k: len(v) for k, v in up['leftovers'].items()} or 'nothing'))
    lines.append('(kuryr-daemon operations failed and retried, by phase: %s; exceptions in '
                 'its log: %s)' % (up.get('retried') or 'none', up.get('daemon_errors') or 'none'))
    if up.get('partial'):
        lines.append('(kuryr-daemon\'s attach budget ran out: %(reached)d of %(wanted)d pods)'
                     % up['partial'])
    return lines


def _columns(rows):
    cells = [[_fmt(c) if i else c for i, c in enumerate(row)] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = []
    for n, row in enumerate(cells):
        lines.append('  '.join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i])
                               for i, c in enumerate(row)))
        if n == 0:
            lines.append('-' * len(lines[0]))
    return lines


def _fmt(value):
    if value is None:
        return '-'
    if isinstance(value, str):
        return value
    return '%.3g' % value if abs(value) < 10 else '%.1f' % value


# --- files -------------------------------------------------------------------------

def write_json(path, data, fig, goals):
    with open(path, 'w') as f:
        json.dump({'figures': fig, 'targets': goals, 'options': data['options'],
                   'machine': data['machine'], 'reference_skipped': data['reference_skipped'],
                   'hosts': data['hosts'], 'leftovers': data['leftovers'],
                   'daemon_forced_stops': data['daemon_forced_stops'],
                   'kuryr_daemon': data.get('kuryr_daemon'),
                   'raw': {key: data[key] for key in (
                       'version', *LATENCIES, 'throughput', 'attach_wall', 'detach_wall',
                       'pss_idle', 'pss_attached', 'pss_workers')}},
                  f, indent=1, sort_keys=True)
        f.write('\n')


def write_chart(path, data, fig):
    """A PNG: latency distributions, throughput and memory, both systems."""
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib import pyplot

    names = [n for n in (KURYR, REFERENCE) if n in data['serial_add']]
    colours = {KURYR: '#1f77b4', REFERENCE: '#ff7f0e'}
    labels = {KURYR: 'kuryr-cni', REFERENCE: 'reference'}
    figure, axes = pyplot.subplots(2, 3, figsize=(16, 9))

    ax = axes[0][0]
    keys = [k for k in (KURYR, REFERENCE) if k in data['version']]
    ax.boxplot([[s * 1000 for s in data['version'][k]] for k in keys], showfliers=False)
    ax.set_xticks(range(1, len(keys) + 1), [labels[k] for k in keys])
    ax.set_title('VERSION start-up (ms)')
    if REFERENCE in fig['version_ms']:      # the target: 1.2 x the reference's median
        ax.axhline(1.2 * fig['version_ms'][REFERENCE]['median'], color='red', linestyle=':',
                   linewidth=1)

    for ax, key, title in ((axes[0][1], 'serial_add', 'serial ADD latency'),
                           (axes[0][2], 'serial_del', 'serial DEL latency')):
        for name in names:
            values = sorted(s * 1000 for s in data[key][name])
            ax.plot(values, [(i + 1) / len(values) for i in range(len(values))],
                    drawstyle='steps-post', color=colours[name], label=labels[name])
        ax.set_title('%s (CDF)' % title)
        ax.set_xlabel('ms')
        ax.set_ylabel('fraction of operations')
        ax.legend()

    ax = axes[1][0]
    groups = list(fig['throughput_ops_per_s'])
    width = 0.8 / len(names)
    for n, name in enumerate(names):
        ax.bar([g + n * width for g in range(len(groups))],
               [fig['throughput_ops_per_s'][k][name] for k in groups], width,
               color=colours[name], label=labels[name])
    ax.set_xticks([g + width * (len(names) - 1) / 2 for g in range(len(groups))],
                  [k.replace('_c', ' c=').upper() for k in groups])
    ax.set_title('throughput (ops/s, higher is better)')
    ax.set_ylim(0, 1.25 * max(fig['throughput_ops_per_s'][k][n] for k in groups for n in names))
    ax.legend(loc='upper center', ncol=len(names))      # in the headroom above the bars

    ax = axes[1][1]
    series, ticks = [], []
    for name in names:
        for key, what in (('add_none', 'none'), ('add_attached', '%d' % (
                data['options']['memory_pods']))):
            series.append([s * 1000 for s in data[key][name]])
            ticks.append('%s\n%s attached' % (labels[name], what))
    ax.boxplot(series, showfliers=False)
    ax.set_xticks(range(1, len(ticks) + 1), ticks)
    ax.set_title('ADD latency vs pods attached (ms)')

    ax = axes[1][2]
    pss = fig['daemon_pss_mib']
    bars = [('idle', pss['idle']), ('%d pods' % pss['attached_pods'], pss['attached'])]
    bars += [('%s workers\nwarm' % w, v) for w, v in pss['after_warm_up'].items()]
    ax.bar(range(len(bars)), [v for _, v in bars], color=colours[KURYR])
    ax.set_xticks(range(len(bars)), [b for b, _ in bars])
    ax.axhline(200, color='red', linestyle=':', linewidth=1)
    ax.set_title('kuryr-cni daemon PSS (MiB)')

    figure.suptitle('kuryr-cni vs reference plugins, %d pods, %d workers, %s'
                    % (data['options']['pods'], data['options']['workers'],
                       data['machine']['time']))
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    pyplot.close(figure)


def results_dir(base, stamp):
    path = os.path.join(base, stamp)
    os.makedirs(path, exist_ok=True)
    return path
