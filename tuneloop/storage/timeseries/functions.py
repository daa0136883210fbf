"""Counter functions over the time-series store: ``increase``, ``rate`` and
``histogram_quantile`` over Prometheus classic histograms (``<name>_bucket{le="..."}``).

Points and windows
    As in :func:`~tuneloop.storage.timeseries.query.query_range`, points sit at epoch multiples
    of ``step_s`` from the bucket holding ``start`` to the bucket holding the last instant
    before ``end``, and each is labelled with its bucket's start ``b``. The point at ``b`` is
    the increase over the window ``[b + step - window, b + step)``: with the default
    ``window = step`` that is exactly the bucket. Windows are not clipped to ``[start, end)``:
    a point means the same whatever range it was asked in.

Increase
    Each sample after the first of a series contributes its delta from the sample before it:
    ``value - previous``, or ``value`` itself when the value went down (a counter reset: the
    counter restarted from 0, so it has grown by ``value`` since; what it gained between the
    previous sample and the restart is lost, as in Prometheus). The increase over a window is
    the sum of the deltas of the samples inside it; a window without such a sample has no
    point (as PromQL returns nothing with fewer than two samples). ``rate`` is that increase
    divided by the window in seconds.

    Unlike PromQL, the sample *before* the window pairs with the window's first sample, so
    consecutive windows with ``window == step`` add up exactly to the increase over the whole
    range and a window holding ``n`` samples does not lose ``1/n`` of the growth. That is what
    makes extrapolation unnecessary: nothing is estimated, every delta is counted once, in the
    window of its later sample. A delta over a gap longer than ``max(window, LOOKBACK_S)``
    is dropped: the series was gone meanwhile, and its growth cannot be placed in time.

Where it runs
    The deltas (``LAG`` over each series ordered by time) and their sums per window, or per
    ``gcd(step, window)`` slice of it when windows overlap or leave gaps, run in SQL, on
    PostgreSQL and SQLite alike, over one time range, so PostgreSQL partitions and their
    boundaries are invisible to it. Only summing those slices into overlapping windows is done
    in Python: a SQL moving frame only yields rows where a slice has data, so windows ending in
    an empty slice would be missing; and ``histogram_quantile`` interpolates across buckets in
    Python, on a handful of numbers per group and point. Counter functions always read raw
    samples: rollups keep one value per minute and would hide a reset inside it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    DateTime,
    Float,
    FromClause,
    Interval,
    Select,
    Subquery,
    Table,
    case,
    func,
    literal,
    select,
    type_coerce,
)
from sqlalchemy import (
    cast as cast_,
)

from tuneloop.storage.models import Series
from tuneloop.storage.timeseries.query import (
    Bind,
    matched_series,
    regex_errors,
    use_connection,
)
from tuneloop.storage.timeseries.query_checks import check_range
from tuneloop.storage.timeseries.rollups import time_bucket
from tuneloop.storage.timeseries.sample_source import sample_rows
from tuneloop.storage.timeseries.types import Matcher, RangeSeries, SeriesInfo
from tuneloop.storage.types import UTCDateTime, from_micros, to_micros

LOOKBACK_S = 300
"""Longest gap, unless the window is longer, across which two samples still form a delta:
Prometheus' default lookback delta."""

BUCKET_SUFFIX = "_bucket"
BUCKET_LABEL = "le"

_MICROS = 1_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_series = cast(Table, Series.__table__)
# What Go's strconv.ParseFloat reads in an ``le`` label, less NaN, hex and underscores, which no
# exporter writes; Python's float() alone would also take " 1", "1_0" and "nan".
_BOUND_RE = re.compile(r"[+-]?(?:inf(?:inity)?|(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)", re.IGNORECASE)


@dataclass(slots=True)
class LabeledSeries:
    """A computed series that belongs to no stored one: its labels and (time, value) points."""

    labels: dict[str, str]
    points: list[tuple[datetime, float]]


# --------------------------------------------------------------------------- public functions


def increase(
    bind: Bind,
    project_id: int,
    metric: str | None,
    matchers: Sequence[Matcher] = (),
    *,
    start: datetime,
    end: datetime,
    step_s: int,
    window_s: int | None = None,
    max_series: int | None = None,
) -> list[RangeSeries]:
    """How much each matching counter grew in the window of each point (see the module
    docstring); series without a point are left out. ``window_s`` defaults to ``step_s``."""
    grid = _Grid.of(start, end, step_s, window_s)
    return [
        RangeSeries(info, [(_datetime(ts), value) for ts, value in points])
        for info, points in _increases(bind, project_id, metric, matchers, grid, max_series)
    ]


def rate(
    bind: Bind,
    project_id: int,
    metric: str | None,
    matchers: Sequence[Matcher] = (),
    *,
    start: datetime,
    end: datetime,
    step_s: int,
    window_s: int | None = None,
    max_series: int | None = None,
) -> list[RangeSeries]:
    """:func:`increase` per second of window."""
    grid = _Grid.of(start, end, step_s, window_s)
    return [
        RangeSeries(info, [(_datetime(ts), value / grid.window_s) for ts, value in points])
        for info, points in _increases(bind, project_id, metric, matchers, grid, max_series)
    ]


def histogram_quantile(
    bind: Bind,
    project_id: int,
    q: float,
    metric: str,
    matchers: Sequence[Matcher] = (),
    *,
    start: datetime,
    end: datetime,
    step_s: int,
    window_s: int | None = None,
    max_series: int | None = None,
    by: Sequence[str] | None = None,
) -> list[LabeledSeries]:
    """The ``q``-quantile of the observations of histogram ``metric`` (its base name: the
    series read are ``<metric>_bucket``) made in the window of each point, per set of labels
    other than ``le``, as PromQL's ``histogram_quantile(q, increase(<metric>_bucket[w]))``;
    with ``by``, per set of those labels, the buckets of a set added up first, as
    ``histogram_quantile(q, sum by (<by>, le) (increase(<metric>_bucket[w])))``.

    Bucket series whose ``le`` is missing or not a number are ignored, as in Prometheus.
    Groups are sorted by labels; a point is NaN where :func:`bucket_quantile` says so (no
    observations in the window, no ``+Inf`` bucket). ``max_series`` bounds bucket series read.
    """
    grid = _Grid.of(start, end, step_s, window_s)
    bucket_series = _increases(bind, project_id, metric + BUCKET_SUFFIX, matchers, grid, max_series)
    groups: dict[tuple[tuple[str, str], ...], dict[int, list[tuple[float, float]]]] = {}
    for info, points in bucket_series:
        upper = parse_bound(info.labels.get(BUCKET_LABEL))
        if upper is None:
            continue
        key = tuple(
            sorted(
                (k, v)
                for k, v in info.labels.items()
                if k != BUCKET_LABEL and (by is None or k in by)
            )
        )
        at_time = groups.setdefault(key, {})
        for ts, count in points:
            at_time.setdefault(ts, []).append((upper, count))
    return [
        LabeledSeries(
            dict(key),
            [(_datetime(ts), bucket_quantile(q, at_time[ts])) for ts in sorted(at_time)],
        )
        for key, at_time in sorted(groups.items())
    ]


def bucket_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """The ``q``-quantile of a classic histogram given as (upper bound, cumulative count)
    pairs in any order, by Prometheus' rules:

    - q is NaN: NaN; q < 0: -Inf; q > 1: +Inf;
    - no ``+Inf`` bucket, fewer than two distinct bounds, or no observations: NaN;
    - buckets with the same bound are added up; a count below the one of a lower bound (data
      that is not monotonic) is raised to it, after counts within 1e-12 relative are treated
      as equal (float noise from summing rates);
    - the quantile falls in the bucket where the cumulative count first reaches
      ``q * observations`` and is interpolated linearly within it; the lowest bucket starts
      at 0 unless its bound is <= 0, in which case that bound is returned; in the ``+Inf``
      bucket the upper bound of the bucket below it is returned.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = _coalesced(sorted(buckets, key=lambda bucket: bucket[0]))
    if not ordered or ordered[-1][0] != math.inf:
        return math.nan
    bounds = [bound for bound, _ in ordered]
    counts = _monotonic(_without_float_noise([count for _, count in ordered]))
    if len(bounds) < 2 or counts[-1] == 0:
        return math.nan
    rank = q * counts[-1]
    index = next((i for i in range(len(counts) - 1) if counts[i] >= rank), len(counts) - 1)
    if index == len(counts) - 1:
        return bounds[-2]
    if index == 0 and bounds[0] <= 0:
        return bounds[0]
    low, below = (bounds[index - 1], counts[index - 1]) if index > 0 else (0.0, 0.0)
    if counts[index] == below:
        # Only q == 0 over an empty lowest bucket gets here: 0/0, which is NaN in Go too.
        return math.nan
    return low + (bounds[index] - low) * ((rank - below) / (counts[index] - below))


def parse_bound(text: str | None) -> float | None:
    """A bucket's upper bound from its ``le`` label, or ``None`` if it is not a number."""
    if text is None or not _BOUND_RE.fullmatch(text):
        return None
    return float(text)


# --------------------------------------------------------------------------- windows


@dataclass(frozen=True, slots=True)
class _Grid:
    """Where the points of a counter query are and what each one's window covers."""

    step_s: int
    window_s: int
    first_us: int
    """Start of the first point's bucket."""
    last_us: int
    """Start of the last point's bucket."""

    @classmethod
    def of(cls, start: datetime, end: datetime, step_s: int, window_s: int | None) -> _Grid:
        check_range(start, end, step_s)
        window_s = step_s if window_s is None else window_s
        if window_s <= 0:
            raise ValueError(f"window_s must be a positive number of seconds, got {window_s}")
        step_us = step_s * _MICROS
        return cls(
            step_s=step_s,
            window_s=window_s,
            first_us=to_micros(start) // step_us * step_us,
            last_us=(to_micros(end) - 1) // step_us * step_us,
        )

    @property
    def slice_s(self) -> int:
        """Width of the slices SQL sums into: every window is a whole number of them."""
        return math.gcd(self.step_s, self.window_s)

    @property
    def read_from(self) -> datetime:
        """Start of the first window."""
        return from_micros(self.first_us + (self.step_s - self.window_s) * _MICROS)

    @property
    def read_to(self) -> datetime:
        """End of the last window."""
        return from_micros(self.last_us + self.step_s * _MICROS)

    @property
    def max_gap(self) -> timedelta:
        return timedelta(seconds=max(self.window_s, LOOKBACK_S))

    def windows(self, starts: Sequence[int], sums: Sequence[float]) -> list[tuple[int, float]]:
        """(bucket start, sum over its window) of each point whose window holds a slice, from
        the slices' sorted starts (µs) and sums. O(slices + points) at any window length."""
        if self.window_s == self.step_s:
            # Slices are the windows themselves.
            return list(zip(starts, sums, strict=True))
        total = _window_sum(sums)
        step_us, window_us = self.step_s * _MICROS, self.window_s * _MICROS
        points: list[tuple[int, float]] = []
        low = high = 0
        bucket = self.first_us
        while bucket <= self.last_us:
            end = bucket + step_us
            while high < len(starts) and starts[high] < end:
                high += 1
            while low < high and starts[low] < end - window_us:
                low += 1
            if low < high:
                points.append((bucket, total(low, high)))
                bucket = end
            elif high < len(starts):
                # Empty window: skip to the first bucket whose window reaches the next slice.
                bucket = max(end, starts[high] // step_us * step_us)
            else:
                break
        return points


def _window_sum(values: Sequence[float]) -> Callable[[int, int], float]:
    """``sum(values[low:high])`` in O(1) per call, from prefix sums.

    The prefix sums are kept compensated (Neumaier: a running total plus its rounding error),
    so a difference of two is as exact as a fresh sum and a window of zeros is exactly 0.0,
    never residue of the values before it: "throughput fell to zero" must read as 0.
    Non-finite values (a counter that held inf) would poison every later difference; they
    get plain slice sums instead.
    """
    if not all(map(math.isfinite, values)):
        return lambda low, high: sum(values[low:high], 0.0)
    highs, lows = [0.0], [0.0]
    running = error = 0.0
    for value in values:
        total = running + value
        if abs(running) >= abs(value):
            error += (running - total) + value
        else:
            error += (value - total) + running
        running = total
        highs.append(running)
        lows.append(error)
    return lambda low, high: (highs[high] - highs[low]) + (lows[high] - lows[low])


# --------------------------------------------------------------------------- SQL


def _increases(
    bind: Bind,
    project_id: int,
    metric: str | None,
    matchers: Sequence[Matcher],
    grid: _Grid,
    max_series: int | None,
) -> list[tuple[SeriesInfo, list[tuple[int, float]]]]:
    """Each matching series that has points, with its (bucket start in µs, increase) points."""
    with use_connection(bind) as connection:
        dialect = connection.dialect.name
        scan = (grid.read_from - grid.max_gap, grid.read_to)
        matching, ids, chunked = matched_series(
            connection, project_id, metric, matchers, max_series, [scan]
        )
        if not matching:
            return []
        with regex_errors():
            source = sample_rows(connection, ids, [scan], chunked=chunked)
            rows = connection.execute(_slice_sums(dialect, source, ids, grid)).all()
    slices: dict[int, tuple[list[int], list[float]]] = {}
    for series_id, bucket_us, value in rows:
        starts, sums = slices.setdefault(series_id, ([], []))
        starts.append(bucket_us)
        sums.append(value)
    # A series created after the lookup has rows but no info: it is left for the next query.
    found = ((info, grid.windows(*slices[info.id])) for info in matching if info.id in slices)
    return [(info, points) for info, points in found if points]


def _slice_sums(dialect: str, source: FromClause, ids: Select[Any], grid: _Grid) -> Select[Any]:
    """Per series and slice of ``grid.slice_s`` seconds, the sum of the deltas of the samples
    in it (ordered by series, slice)."""
    paired = _paired(source, ids, grid.read_from - grid.max_gap, grid.read_to)
    value, previous = paired.c.value, paired.c.prev_value
    delta = case((value >= previous, value - previous), else_=value)
    bucket = time_bucket(paired.c.ts, grid.slice_s, dialect)
    # Integer µs rather than datetimes: a million points cost seconds of conversions in Python.
    bucket_us: ColumnElement[int]
    if dialect == "postgresql":
        bucket_us = cast_(func.extract("epoch", bucket) * _MICROS, BigInteger())
    else:
        bucket_us = type_coerce(bucket, BigInteger())
    return (
        select(paired.c.series_id, bucket_us.label("bucket_us"), func.sum(delta).label("value"))
        .where(
            previous.is_not(None),
            paired.c.ts >= grid.read_from,
            _within(dialect, paired, grid.max_gap),
        )
        .group_by(paired.c.series_id, bucket_us)
        .order_by(paired.c.series_id, bucket_us)
    )


def _paired(
    source: FromClause, ids: Select[Any], scan_from: datetime, scan_to: datetime
) -> Subquery:
    """Samples in ``[scan_from, scan_to)`` with the value and time of the sample before each.

    The scan starts one longest gap before the first window, so the first sample of a window
    finds its predecessor whenever the delta between them can count. Ties in time are ordered
    by value, so a duplicated sample never looks like a reset.
    """
    over: dict[str, Any] = {
        "partition_by": source.c.series_id,
        "order_by": (source.c.ts, source.c.value),
    }
    return (
        select(
            source.c.series_id,
            source.c.ts,
            source.c.value,
            func.lag(source.c.value, type_=Float(precision=53)).over(**over).label("prev_value"),
            func.lag(source.c.ts, type_=UTCDateTime()).over(**over).label("prev_ts"),
        )
        .where(source.c.series_id.in_(ids), source.c.ts >= scan_from, source.c.ts < scan_to)
        .subquery("paired")
    )


def _within(dialect: str, paired: Subquery, gap: timedelta) -> ColumnElement[bool]:
    """The sample is at most ``gap`` after the one before it."""
    if dialect == "postgresql":
        ts = type_coerce(paired.c.ts, DateTime(timezone=True))
        previous = type_coerce(paired.c.prev_ts, DateTime(timezone=True))
        return ts - previous <= literal(gap, Interval())
    # SQLite stores integer microseconds.
    micros = type_coerce(paired.c.ts, BigInteger()) - type_coerce(paired.c.prev_ts, BigInteger())
    return micros <= literal(gap // timedelta(microseconds=1), BigInteger())


def _datetime(micros: int) -> datetime:
    # The arithmetic form of from_micros, several times faster per point.
    return _EPOCH + timedelta(microseconds=micros)


# --------------------------------------------------------------------------- buckets


def _coalesced(ordered: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted buckets with the counts of equal bounds added up."""
    merged: list[tuple[float, float]] = []
    for bound, count in ordered:
        if merged and merged[-1][0] == bound:
            merged[-1] = (bound, merged[-1][1] + count)
        else:
            merged.append((bound, count))
    return merged


def _without_float_noise(counts: list[float], tolerance: float = 1e-12) -> list[float]:
    """Counts that differ from the last kept one by at most ``tolerance`` relative are set to
    it, so rounding in summed rates cannot make a histogram look non-monotonic."""
    fixed = counts[:1]
    kept = counts[0] if counts else 0.0
    for count in counts[1:]:
        delta = abs(count - kept)
        # count == 0 is never noise (Go divides to +Inf there).
        if delta != 0 and count != 0 and delta / count <= tolerance:
            fixed.append(kept)
        else:
            fixed.append(count)
            kept = count
    return fixed


def _monotonic(counts: list[float]) -> list[float]:
    """The running maximum: a higher bound has counted at least what every lower one has."""
    envelope: list[float] = []
    for count in counts:
        envelope.append(max(count, envelope[-1]) if envelope else count)
    return envelope
