"""Summaries of timing samples: medians, percentiles, ratios."""

import statistics


def percentile(values, q):
    """The ``q``-th percentile (0..100) of ``values``, linearly interpolated."""
    ordered = sorted(values)
    if not ordered:
        return None
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def latency_ms(seconds):
    """``{n, median, p90, p99, mean, min, max}`` in milliseconds."""
    ms = [s * 1000 for s in seconds]
    return {'n': len(ms), 'median': _r(statistics.median(ms)), 'p90': _r(percentile(ms, 90)),
            'p99': _r(percentile(ms, 99)), 'mean': _r(statistics.fmean(ms)),
            'min': _r(min(ms)), 'max': _r(max(ms))}


def ratio(ours, theirs):
    """``ours / theirs``, or None when either is missing."""
    if ours is None or not theirs:
        return None
    return round(ours / theirs, 3)


def _r(value):
    return round(value, 3)
