"""Histogram arithmetic, on hand-made examples whose answers are worked out in the comments."""

from __future__ import annotations

import math

import pytest
from opentelemetry.proto.metrics.v1.metrics_pb2 import ExponentialHistogramDataPoint

from collector.otlp import histograms as hist


def exp_point(
    scale: int,
    positive: tuple[int, list[int]] = (0, []),
    negative: tuple[int, list[int]] = (0, []),
    zero_count: int = 0,
    zero_threshold: float = 0.0,
) -> ExponentialHistogramDataPoint:
    count = zero_count + sum(positive[1]) + sum(negative[1])
    return ExponentialHistogramDataPoint(
        scale=scale,
        count=count,
        zero_count=zero_count,
        zero_threshold=zero_threshold,
        positive=ExponentialHistogramDataPoint.Buckets(
            offset=positive[0], bucket_counts=positive[1]
        ),
        negative=ExponentialHistogramDataPoint.Buckets(
            offset=negative[0], bucket_counts=negative[1]
        ),
    )


def classic(point: ExponentialHistogramDataPoint, **kw: int) -> hist.Classic:
    return hist.to_classic(hist.exponential_from_point(point), **kw)


def test_explicit_buckets_become_cumulative() -> None:
    result = hist.explicit([1.0, 2.5, 10.0], [1, 0, 2, 4], 7)
    assert result == hist.Classic((1.0, 2.5, 10.0), (1, 1, 3), 7)
    assert hist.explicit([], [], 5) == hist.Classic((), (), 5)  # count and sum only
    assert hist.explicit([], [5], 5) == hist.Classic((), (), 5)  # only the overflow bucket


@pytest.mark.parametrize(
    ("bounds", "counts", "count", "problem"),
    [
        ([1.0], [1, 1, 1], 3, "bounds \\+ 1"),
        ([2.0, 1.0], [1, 1, 1], 3, "strictly increasing"),
        ([1.0, 1.0], [1, 1, 1], 3, "strictly increasing"),
        ([float("nan")], [1, 1], 2, "finite"),
        ([1.0], [1, 1], 3, "not count 3"),
    ],
)
def test_inconsistent_explicit_buckets_are_refused(
    bounds: list[float], counts: list[int], count: int, problem: str
) -> None:
    with pytest.raises(hist.HistogramError, match=problem):
        hist.explicit(bounds, counts, count)


def test_exponential_scale_0_with_negative_and_zero_buckets_exactly() -> None:
    # base 2. Positive buckets 0..3: (1,2] x1, (2,4] x2, (4,8] x0, (8,16] x3.
    # Negative bucket 1: values in [-4,-2) x5, so its le is -2. Zero bucket x4, counted into
    # the lowest positive bucket. Cumulative: -2:5, 2:5+4+1=10, 4:12, 8:12, 16:15, +Inf:15.
    point = exp_point(0, positive=(0, [1, 2, 0, 3]), negative=(1, [5]), zero_count=4)
    assert classic(point) == hist.Classic((-2.0, 2.0, 4.0, 8.0, 16.0), (5, 10, 12, 12, 15), 15)


def test_exponential_scale_1_bounds_are_powers_of_root_two() -> None:
    # base 2**0.5; bucket -2 is (2**-1, 2**-0.5], bucket -1 is (2**-0.5, 1].
    point = exp_point(1, positive=(-2, [1, 3]))
    assert classic(point) == hist.Classic((2**-0.5, 1.0), (1, 4), 4)


def test_negative_scale_bounds() -> None:
    # scale -1: base 4; bucket 2 is (16, 64].
    assert classic(exp_point(-1, positive=(2, [7]))) == hist.Classic((64.0,), (7,), 7)


def test_fine_scales_are_lowered_to_max_scale_so_le_values_are_stable() -> None:
    # scale 5, buckets 0..15 one each: at scale 3 (by 2) buckets 0..3 hold 4 each, bounds
    # 2**(1/8) .. 2**(4/8).
    point = exp_point(5, positive=(0, [1] * 16))
    expected_bounds = tuple(2.0 ** (i / 8) for i in range(1, 5))
    assert classic(point) == hist.Classic(expected_bounds, (4, 8, 12, 16), 16)
    # The same data at scale 4 lands on the same grid.
    assert classic(exp_point(4, positive=(0, [2] * 8))) == classic(point)


def test_wide_histograms_are_downscaled_to_max_buckets() -> None:
    # scale 3, buckets 0..399: by 1 -> 200 buckets (> 160), by 2 -> 100: scale 1, 4 per bucket.
    result = classic(exp_point(3, positive=(0, [1] * 400)))
    assert len(result.bounds) == 100
    assert result.bounds[0] == 2**0.5 and result.bounds[-1] == 2.0**50
    assert result.cumulative == tuple(range(4, 401, 4)) and result.count == 400
    # Negative buckets count towards the limit too.
    both = classic(exp_point(3, positive=(0, [1] * 100), negative=(0, [1] * 100)))
    assert len(both.bounds) == 100  # 50 + 50 after one downscale


def test_only_a_zero_bucket_gets_its_own_bound() -> None:
    assert classic(exp_point(0, zero_count=3)) == hist.Classic((0.0,), (3,), 3)
    assert classic(exp_point(0, zero_count=3, zero_threshold=1e-9)) == hist.Classic(
        (1e-9,), (3,), 3
    )
    assert classic(exp_point(0)) == hist.Classic((), (), 0)


def test_overflowing_bounds_fold_into_the_next_bound() -> None:
    # scale -10: base 2**1024; bucket 0's bound 2**1024 overflows a double: +Inf holds it.
    assert classic(exp_point(-10, positive=(0, [2]))) == hist.Classic((), (), 2)
    # Two underflowing bounds collapse into one, keeping the larger cumulative count.
    tiny = classic(exp_point(-10, positive=(-4, [1, 1])))  # 2**-3072 and 2**-2048
    assert tiny.bounds == (0.0,) and tiny.cumulative == (2,)


@pytest.mark.parametrize(
    ("point", "problem"),
    [
        (exp_point(21, positive=(0, [1])), "scale 21"),
        (exp_point(-11, positive=(0, [1])), "scale -11"),
        (exp_point(0, zero_count=1, zero_threshold=-1.0), "zero_threshold"),
        (exp_point(0, zero_count=1, zero_threshold=math.nan), "zero_threshold"),
    ],
)
def test_invalid_exponential_points_are_refused(
    point: ExponentialHistogramDataPoint, problem: str
) -> None:
    with pytest.raises(hist.HistogramError, match=problem):
        hist.exponential_from_point(point)


def test_exponential_count_must_match_buckets() -> None:
    point = exp_point(0, positive=(0, [1, 2]))
    point.count = 4
    with pytest.raises(hist.HistogramError, match="not count 4"):
        hist.exponential_from_point(point)


def test_merge_brings_both_to_the_coarser_scale() -> None:
    a = hist.Exponential(2, 1, 0.0, {0: 1, 3: 2}, {})
    b = hist.Exponential(1, 2, 0.0, {0: 1, 1: 1}, {5: 1})
    merged = hist.merge(a, b)
    # a at scale 1: index 0 -> 0, 3 -> 1.
    assert merged == hist.Exponential(1, 3, 0.0, {0: 2, 1: 3}, {5: 1})
    assert merged.count == 9
