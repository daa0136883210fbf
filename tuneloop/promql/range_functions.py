"""Functions of a range vector (``rate(x[5m])``, ``max_over_time(x[1h])``): for one series'
raw samples and the end of each step's window, the value per step, as Prometheus computes it.

A window is ``(end - range, end]``. Windows are found for all steps at once by binary search;
what sums (count, sum, resets) uses running totals, the rest looks at each window.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final

import numpy as np

from tuneloop.promql.values import BoolArray, FloatArray, TimeArray
from tuneloop.storage.timeseries.raw import RawSeries

Result = tuple[FloatArray, BoolArray]
RangeFunction = Callable[[RawSeries, TimeArray, int, float], Result]
"""(series, window ends in ms, range in ms, parameter) to (values, present) per step."""


def _windows(series: RawSeries, ends: TimeArray, range_ms: int) -> tuple[TimeArray, TimeArray]:
    low = np.searchsorted(series.times_ms, ends - range_ms, side="right")
    high = np.searchsorted(series.times_ms, ends, side="right")
    return low.astype(np.int64), high.astype(np.int64)


def _running(values: FloatArray) -> FloatArray:
    return np.concatenate(([0.0], np.cumsum(values)))


def _extrapolated(
    series: RawSeries, ends: TimeArray, range_ms: int, *, counter: bool, rate: bool
) -> Result:
    """Prometheus' extrapolatedRate: the change over the samples in the window, counter
    resets added back, extrapolated towards the window's edges (to half a sample interval
    beyond the first and last sample at most, and never below zero for counters)."""
    low, high = _windows(series, ends, range_ms)
    present = high - low >= 2
    out = np.zeros(len(ends))
    if not present.any():
        return out, present
    values, times = series.values, series.times_ms
    lo, hi = low[present], high[present] - 1
    first, last = values[lo], values[hi]
    change = last - first
    if counter:
        dropped = np.concatenate(([0.0], np.where(values[1:] < values[:-1], values[:-1], 0.0)))
        resets = np.cumsum(dropped)
        change = change + resets[hi] - resets[lo]
    to_start = (times[lo] - (ends[present] - range_ms)) / 1000.0
    to_end = (ends[present] - times[hi]) / 1000.0
    sampled = (times[hi] - times[lo]) / 1000.0
    average = sampled / (hi - lo)
    if counter:
        with np.errstate(divide="ignore", invalid="ignore"):
            to_zero = sampled * (first / change)
        closer = (change > 0) & (first >= 0) & (to_zero < to_start)
        to_start = np.where(closer, to_zero, to_start)
    threshold = average * 1.1
    interval = (
        sampled
        + np.where(to_start < threshold, to_start, average / 2)
        + np.where(to_end < threshold, to_end, average / 2)
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        result = change * (interval / sampled)
    if rate:
        result = result / (range_ms / 1000.0)
    out[present] = result
    return out, present


def rate(series: RawSeries, ends: TimeArray, range_ms: int, _: float) -> Result:
    return _extrapolated(series, ends, range_ms, counter=True, rate=True)


def increase(series: RawSeries, ends: TimeArray, range_ms: int, _: float) -> Result:
    return _extrapolated(series, ends, range_ms, counter=True, rate=False)


def delta(series: RawSeries, ends: TimeArray, range_ms: int, _: float) -> Result:
    return _extrapolated(series, ends, range_ms, counter=False, rate=False)


def _instant(series: RawSeries, ends: TimeArray, range_ms: int, *, is_rate: bool) -> Result:
    """irate and idelta: from the last two samples of each window."""
    low, high = _windows(series, ends, range_ms)
    present = high - low >= 2
    out = np.zeros(len(ends))
    hi = high[present] - 1
    last, previous = series.values[hi], series.values[hi - 1]
    if not is_rate:
        out[present] = last - previous
        return out, present
    change = np.where(last < previous, last, last - previous)  # a reset: from zero
    seconds = (series.times_ms[hi] - series.times_ms[hi - 1]) / 1000.0
    out[present] = change / seconds
    return out, present


def irate(series: RawSeries, ends: TimeArray, range_ms: int, _: float) -> Result:
    return _instant(series, ends, range_ms, is_rate=True)


def idelta(series: RawSeries, ends: TimeArray, range_ms: int, _: float) -> Result:
    return _instant(series, ends, range_ms, is_rate=False)


def _summed(series: RawSeries, ends: TimeArray, range_ms: int, per_sample: FloatArray) -> Result:
    low, high = _windows(series, ends, range_ms)
    totals = _running(per_sample)
    return totals[high] - totals[low], high > low


def count_over_time(series: RawSeries, ends: TimeArray, range_ms: int, _: float) -> Result:
    return _summed(series, ends, range_ms, np.ones(len(series.values)))


def sum_over_time(series: RawSeries, ends: TimeArray, range_ms: int, _: float) -> Result:
    return _per_window(series, ends, range_ms, lambda window: math.fsum(window.tolist()))


def avg_over_time(series: RawSeries, ends: TimeArray, range_ms: int, _: float) -> Result:
    return _per_window(
        series, ends, range_ms, lambda window: math.fsum(window.tolist()) / len(window)
    )


def present_over_time(series: RawSeries, ends: TimeArray, range_ms: int, _: float) -> Result:
    low, high = _windows(series, ends, range_ms)
    return np.ones(len(ends)), high > low


def last_over_time(series: RawSeries, ends: TimeArray, range_ms: int, _: float) -> Result:
    low, high = _windows(series, ends, range_ms)
    present = high > low
    return series.values[np.maximum(high - 1, 0)] if len(series.values) else np.zeros(
        len(ends)
    ), present


def resets(series: RawSeries, ends: TimeArray, range_ms: int, _: float) -> Result:
    values = series.values
    dropped = np.concatenate(([0.0], (values[1:] < values[:-1]).astype(np.float64)))
    return _pairwise(series, ends, range_ms, dropped)


def changes(series: RawSeries, ends: TimeArray, range_ms: int, _: float) -> Result:
    values = series.values
    # NaN to NaN is no change, as in Prometheus.
    same = (values[1:] == values[:-1]) | (np.isnan(values[1:]) & np.isnan(values[:-1]))
    changed = np.concatenate(([0.0], (~same).astype(np.float64)))
    return _pairwise(series, ends, range_ms, changed)


def _pairwise(series: RawSeries, ends: TimeArray, range_ms: int, marks: FloatArray) -> Result:
    """Count of ``marks`` (each sample against the one before it) within each window."""
    low, high = _windows(series, ends, range_ms)
    totals = _running(marks)
    present = high > low
    # The first sample of a window has no predecessor inside it.
    counts = np.where(present, totals[high] - totals[np.minimum(low + 1, high)], 0.0)
    return counts, present


def _per_window(
    series: RawSeries, ends: TimeArray, range_ms: int, reduce: Callable[[FloatArray], float]
) -> Result:
    low, high = _windows(series, ends, range_ms)
    present = high > low
    out = np.zeros(len(ends))
    values = series.values
    for step in np.flatnonzero(present).tolist():
        out[step] = reduce(values[low[step] : high[step]])
    return out, present


def min_over_time(series: RawSeries, ends: TimeArray, range_ms: int, _: float) -> Result:
    return _per_window(series, ends, range_ms, lambda w: float(np.fmin.reduce(w)))


def max_over_time(series: RawSeries, ends: TimeArray, range_ms: int, _: float) -> Result:
    return _per_window(series, ends, range_ms, lambda w: float(np.fmax.reduce(w)))


def stdvar_over_time(series: RawSeries, ends: TimeArray, range_ms: int, _: float) -> Result:
    return _per_window(series, ends, range_ms, lambda w: float(np.var(w)))


def stddev_over_time(series: RawSeries, ends: TimeArray, range_ms: int, _: float) -> Result:
    return _per_window(series, ends, range_ms, lambda w: float(np.std(w)))


def quantile(q: float, values: FloatArray) -> float:
    """Prometheus' quantile: linear interpolation between the closest ranks; ``q`` below 0
    is -Inf, above 1 +Inf."""
    if math.isnan(q) or not len(values):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = np.sort(values)
    rank = q * (len(ordered) - 1)
    lower = max(0, math.floor(rank))
    upper = min(len(ordered) - 1, lower + 1)
    weight = rank - math.floor(rank)
    return float(ordered[lower] * (1 - weight) + ordered[upper] * weight)


def quantile_over_time(series: RawSeries, ends: TimeArray, range_ms: int, q: float) -> Result:
    return _per_window(series, ends, range_ms, lambda w: quantile(q, w))


RANGE_FUNCTIONS: Final[dict[str, RangeFunction]] = {
    "rate": rate,
    "increase": increase,
    "delta": delta,
    "irate": irate,
    "idelta": idelta,
    "resets": resets,
    "changes": changes,
    "avg_over_time": avg_over_time,
    "min_over_time": min_over_time,
    "max_over_time": max_over_time,
    "sum_over_time": sum_over_time,
    "count_over_time": count_over_time,
    "last_over_time": last_over_time,
    "present_over_time": present_over_time,
    "stddev_over_time": stddev_over_time,
    "stdvar_over_time": stdvar_over_time,
    "quantile_over_time": quantile_over_time,
}
"""Functions whose (last) argument is a range vector; ``quantile_over_time`` takes ``q``
first."""

KEEPS_NAME: Final = frozenset({"last_over_time"})
"""Prometheus drops the metric name from every range function's output but this one."""
