"""Histogram arithmetic: OTLP explicit-bucket and exponential histograms -> the classic
Prometheus form the store keeps (cumulative counts per upper bound ``le``, ``+Inf`` last).

Exponential histograms (base ``2**(2**-scale)``; positive bucket ``i`` holds values in
``(base**i, base**(i+1)]``, negative bucket ``i`` the same magnitudes below zero) become
explicit buckets:

* the scale is first lowered to at most :data:`MAX_SCALE` (3: a bucket factor of 1.09, the
  resolution Prometheus' own clients recommend for native histograms). The point is stable
  ``le`` values: every point of a series then lands on the same grid, whatever resolution the
  SDK happened to reach, so each ``le`` series stays continuous and delta points can be summed;
* then lowered further until the populated index range fits in :data:`MAX_BUCKETS` buckets
  (lowering the scale by one merges bucket pairs ``2k, 2k+1`` into ``k``, an exact operation);
* every bucket of the populated range is emitted (empty ones too, so a quantile never
  interpolates across a missing bound); the zero bucket is counted into the lowest positive
  bucket, or gets its own ``le = zero_threshold`` when there is no positive bucket.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from opentelemetry.proto.metrics.v1.metrics_pb2 import ExponentialHistogramDataPoint

MAX_SCALE: Final = 3
MAX_BUCKETS: Final = 160
"""Most finite buckets of one converted exponential histogram (the SDK's default size)."""
MIN_OTLP_SCALE: Final = -10
MAX_OTLP_SCALE: Final = 20


class HistogramError(ValueError):
    """A histogram point whose buckets contradict each other or the spec."""


@dataclass(frozen=True, slots=True)
class Classic:
    """Cumulative counts: ``cumulative[i]`` values are <= ``bounds[i]``; ``count`` is ``+Inf``."""

    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]
    count: int


def explicit(bounds: Sequence[float], bucket_counts: Sequence[int], count: int) -> Classic:
    """An OTLP explicit-bucket histogram point in classic form. ``bucket_counts`` has one more
    entry than ``bounds`` (the overflow bucket) or none at all (count and sum only)."""
    if not bucket_counts:
        return Classic((), (), count)
    if len(bucket_counts) != len(bounds) + 1:
        raise HistogramError(
            f"{len(bucket_counts)} bucket counts for {len(bounds)} bounds: need bounds + 1"
        )
    if not all(math.isfinite(bound) for bound in bounds):
        raise HistogramError("explicit bounds must be finite")
    if any(low >= high for low, high in itertools.pairwise(bounds)):
        raise HistogramError("explicit bounds must be strictly increasing")
    if sum(bucket_counts) != count:
        raise HistogramError(f"bucket counts add up to {sum(bucket_counts)}, not count {count}")
    cumulative: list[int] = []
    running = 0
    for bucket in bucket_counts[:-1]:
        running += bucket
        cumulative.append(running)
    return Classic(tuple(bounds), tuple(cumulative), count)


@dataclass(slots=True)
class Exponential:
    """An exponential histogram with sparse buckets (index -> count, no zero counts)."""

    scale: int
    zero_count: int
    zero_threshold: float
    positive: dict[int, int] = field(default_factory=dict)
    negative: dict[int, int] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return self.zero_count + sum(self.positive.values()) + sum(self.negative.values())


def exponential_from_point(point: ExponentialHistogramDataPoint) -> Exponential:
    """The buckets of ``point``, checked against the spec."""
    if not MIN_OTLP_SCALE <= point.scale <= MAX_OTLP_SCALE:
        raise HistogramError(f"scale {point.scale} is outside [{MIN_OTLP_SCALE}, {MAX_OTLP_SCALE}]")
    if not (math.isfinite(point.zero_threshold) and point.zero_threshold >= 0):
        raise HistogramError("zero_threshold must be a finite number >= 0")
    histogram = Exponential(
        point.scale,
        point.zero_count,
        point.zero_threshold,
        _sparse(point.positive.offset, point.positive.bucket_counts),
        _sparse(point.negative.offset, point.negative.bucket_counts),
    )
    if histogram.count != point.count:
        raise HistogramError(f"buckets add up to {histogram.count}, not count {point.count}")
    return histogram


def _sparse(offset: int, counts: Sequence[int]) -> dict[int, int]:
    return {offset + i: c for i, c in enumerate(counts) if c}


def downscale(histogram: Exponential, by: int) -> Exponential:
    """The same histogram ``by`` scales coarser (exact: buckets merge, none split)."""
    if by <= 0:
        return histogram
    return Exponential(
        histogram.scale - by,
        histogram.zero_count,
        histogram.zero_threshold,
        _shift(histogram.positive, by),
        _shift(histogram.negative, by),
    )


def _shift(buckets: Mapping[int, int], by: int) -> dict[int, int]:
    merged: dict[int, int] = {}
    for index, count in buckets.items():
        # >> floors, so negative indexes merge the same way as positive ones (spec).
        merged[index >> by] = merged.get(index >> by, 0) + count
    return merged


def merge(a: Exponential, b: Exponential) -> Exponential:
    """The sum of two histograms of the same series (for delta accumulation)."""
    scale = min(a.scale, b.scale)
    a, b = downscale(a, a.scale - scale), downscale(b, b.scale - scale)
    return Exponential(
        scale,
        a.zero_count + b.zero_count,
        max(a.zero_threshold, b.zero_threshold),
        _add(a.positive, b.positive),
        _add(a.negative, b.negative),
    )


def _add(a: Mapping[int, int], b: Mapping[int, int]) -> dict[int, int]:
    out = dict(a)
    for index, count in b.items():
        out[index] = out.get(index, 0) + count
    return out


def _span(buckets: Mapping[int, int], by: int) -> int:
    """Buckets in the populated index range of ``buckets`` after downscaling by ``by``."""
    if not buckets:
        return 0
    return (max(buckets) >> by) - (min(buckets) >> by) + 1


def to_classic(
    histogram: Exponential, *, max_scale: int = MAX_SCALE, max_buckets: int = MAX_BUCKETS
) -> Classic:
    """``histogram`` as explicit cumulative buckets (see the module docstring)."""
    by = max(histogram.scale - max_scale, 0)
    # Past 64 every int64 index has collapsed to -1 or 0: the loop cannot shrink it further.
    while _span(histogram.positive, by) + _span(histogram.negative, by) > max_buckets and by < 64:
        by += 1
    histogram = downscale(histogram, by)
    scale = histogram.scale
    buckets: list[tuple[float, int]] = []
    if histogram.negative:
        low, high = min(histogram.negative), max(histogram.negative)
        # Most negative first: bucket i holds [-base**(i+1), -base**i), so its le is -base**i.
        for index in range(high, low - 1, -1):
            buckets.append((-_power(index, scale), histogram.negative.get(index, 0)))
    if histogram.positive:
        low, high = min(histogram.positive), max(histogram.positive)
        for index in range(low, high + 1):
            count = histogram.positive.get(index, 0)
            if index == low:
                count += histogram.zero_count
            buckets.append((_power(index + 1, scale), count))
    elif histogram.zero_count:
        buckets.append((histogram.zero_threshold, histogram.zero_count))
    return _cumulate(buckets, histogram.count)


def _power(index: int, scale: int) -> float:
    """``base ** index`` for ``base = 2 ** (2 ** -scale)``: exact for scale <= 0; ``inf`` when
    it overflows (such a bucket then folds into the next bound, ``+Inf`` at worst)."""
    try:
        if scale <= 0:
            return math.ldexp(1.0, index << -scale)
        return float(2.0 ** (index / (1 << scale)))
    except OverflowError:
        return math.inf


def _cumulate(buckets: list[tuple[float, int]], count: int) -> Classic:
    bounds: list[float] = []
    cumulative: list[int] = []
    running = 0
    for bound, bucket in buckets:
        running += bucket
        if not math.isfinite(bound):
            continue  # its count is carried into the next finite bound or +Inf
        if bounds and bound <= bounds[-1]:
            # Underflow made two bounds equal: keep one, with the larger cumulative count.
            bounds.pop()
            cumulative.pop()
        bounds.append(bound)
        cumulative.append(running)
    return Classic(tuple(bounds), tuple(cumulative), count)
