"""increase, rate and histogram_quantile on real SQLite and real PostgreSQL, against values
computed by hand."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from sqlalchemy import Engine

from tests.storage.test_query import make_project
from tuneloop.storage.timeseries.functions import (
    LOOKBACK_S,
    bucket_quantile,
    histogram_quantile,
    increase,
    parse_bound,
    rate,
)
from tuneloop.storage.timeseries.partitions import list_partitions
from tuneloop.storage.timeseries.query import TooManySeries
from tuneloop.storage.timeseries.types import Matcher, MatchOp, SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter

T0 = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
COUNTER = "tokens_total"
INF = math.inf

Samples = Sequence[tuple[float, float]]
"""(seconds after T0, value)"""


def write(
    engine: Engine,
    project_id: int,
    samples: Samples,
    labels: Mapping[str, str] | None = None,
    metric: str = COUNTER,
) -> None:
    batch = SeriesBatch(
        metric,
        labels or {"gpu": "0"},
        [T0 + timedelta(seconds=offset) for offset, _ in samples],
        [value for _, value in samples],
        kind=SeriesKind.COUNTER,
    )
    assert not SampleWriter(engine).write(project_id, [batch]).rejected


def points(found: Sequence[object]) -> list[list[tuple[float, float]]]:
    """Points as (seconds after T0, value), per series."""
    return [
        [((ts - T0).total_seconds(), value) for ts, value in series.points]  # type: ignore[attr-defined]
        for series in found
    ]


# --------------------------------------------------------------------------- increase and rate

# 15-second scrapes growing by 10 per scrape, starting at 0 at T0.
STEADY = [(15.0 * i, 10.0 * i) for i in range(8)]

INCREASE_CASES: list[tuple[str, Samples, dict[str, int], list[tuple[float, float]]]] = [
    # The sample at T0 has no predecessor; after it every delta counts in its own bucket, so
    # the points add up to the whole growth (70), with nothing lost between buckets.
    ("steady", STEADY, {}, [(0, 30), (60, 40)]),
    # 20 -> 5 is a reset: the counter restarted from 0 and has grown by 5 since.
    ("reset", [(0, 0), (15, 10), (30, 20), (45, 5), (60, 15)], {}, [(0, 25), (60, 10)]),
    ("reset to zero", [(0, 100), (15, 0), (30, 3), (75, 4)], {}, [(0, 3), (60, 1)]),
    ("two resets in a bucket", [(0, 50), (10, 60), (20, 2), (30, 8), (40, 1)], {}, [(0, 19)]),
    # Sliding windows of 120 s on 60 s steps: the point at b covers [b - 60, b + 60).
    ("window 2 steps", STEADY, {"window_s": 120, "end_s": 240}, [(0, 30), (60, 70), (120, 40)]),
    # Windows of 45 s: the point at b covers [b + 15, b + 60); the delta at +60 is in none.
    ("window < step", STEADY, {"window_s": 45}, [(0, 30), (60, 30)]),
    # Windows of 90 s: [b - 30, b + 60).
    ("window 1.5 steps", STEADY, {"window_s": 90, "end_s": 180}, [(0, 30), (60, 60), (120, 20)]),
    # Points are not clipped to the range: the first one still covers its whole bucket.
    ("range inside buckets", STEADY, {"start_s": 30, "end_s": 90}, [(0, 30), (60, 40)]),
    # A gap over LOOKBACK_S: the series was gone; its growth meanwhile counts nowhere.
    ("gap", [(0, 0), (15, 10), (316, 20), (331, 25)], {"end_s": 360}, [(0, 10), (300, 5)]),
    # Duplicates (same time) are ordered by value, so they never look like a reset.
    ("duplicates", [(0, 0), (15, 12), (15, 10), (15, 12), (30, 20)], {}, [(0, 20)]),
    # A counter that stops growing reads exactly 0, also in overlapping windows.
    ("flat", [(0, 0.1), (15, 0.3), (75, 0.3), (135, 0.3)], {"window_s": 120, "end_s": 180},
     [(0, 0.2), (60, 0.2), (120, 0.0)]),
]  # fmt: skip


def test_increase_and_rate_match_hand_computed_values(engine: Engine) -> None:
    # One database for all cases (each its own project): a fresh one per case costs more
    # than the cases.
    for index, (name, samples, options, expected) in enumerate(INCREASE_CASES):
        project = make_project(engine, f"p{index}")
        write(engine, project, samples)
        window_s = options.get("window_s")
        kwargs = {
            "start": T0 + timedelta(seconds=options.get("start_s", 0)),
            "end": T0 + timedelta(seconds=options.get("end_s", 120)),
            "step_s": 60,
            "window_s": window_s,
        }

        (increases,) = points(increase(engine, project, COUNTER, **kwargs))  # type: ignore[arg-type]
        (rates,) = points(rate(engine, project, COUNTER, **kwargs))  # type: ignore[arg-type]

        assert [ts for ts, _ in increases] == [ts for ts, _ in expected], name
        assert [value for _, value in increases] == pytest.approx([v for _, v in expected]), name
        per_second = [value / (window_s or 60) for _, value in expected]
        assert [value for _, value in rates] == pytest.approx(per_second), name
        if expected[-1][1] == 0:
            assert increases[-1][1] == 0.0, name  # exactly, not 1e-17


def reference_increase(
    samples: Samples, start_s: int, end_s: int, step_s: int, window_s: int
) -> list[tuple[float, float]]:
    """The documented semantics, written the slow and obvious way (times in seconds after T0,
    which is an epoch multiple of every step used here)."""
    ordered = sorted(samples)
    gap = max(window_s, LOOKBACK_S)
    deltas = [
        (ts, value - prev if value >= prev else value)
        for (prev_ts, prev), (ts, value) in pairwise(ordered)
        if ts - prev_ts <= gap
    ]
    result = []
    bucket = start_s // step_s * step_s
    while bucket < end_s:
        inside = [d for ts, d in deltas if bucket + step_s - window_s <= ts < bucket + step_s]
        if inside:
            result.append((float(bucket), math.fsum(inside)))
        bucket += step_s
    return result


def test_increase_agrees_with_a_reference_on_random_counters(engine: Engine) -> None:
    rng = random.Random(7)
    project = make_project(engine)
    series: dict[str, list[tuple[float, float]]] = {}
    for gpu in range(4):
        value, ts, samples = 0.0, 0.0, []
        while ts < 3600:
            samples.append((ts, value))
            ts += rng.choice([5, 10, 15, 15, 15, 30, 400])  # 400: a gap over LOOKBACK_S
            value = rng.uniform(0, 50) if rng.random() < 0.05 else value + rng.uniform(0, 100)
        series[str(gpu)] = samples
        write(engine, project, samples, {"gpu": str(gpu)})

    for step_s, window_s, start_s, end_s in [
        (60, 60, 0, 3600), (60, 300, 600, 3000), (300, 120, 0, 3600), (45, 100, 7, 1999),
        (15, 15, 100, 2000), (600, 600, 0, 3600),
    ]:  # fmt: skip
        found = increase(
            engine, project, COUNTER, start=T0 + timedelta(seconds=start_s),
            end=T0 + timedelta(seconds=end_s), step_s=step_s, window_s=window_s,
        )  # fmt: skip
        got = {s.series.labels["gpu"]: points([s])[0] for s in found}
        for name, samples in series.items():
            expected = reference_increase(samples, start_s, end_s, step_s, window_s)
            assert [ts for ts, _ in got.get(name, [])] == [ts for ts, _ in expected]
            assert [v for _, v in got.get(name, [])] == pytest.approx([v for _, v in expected])


def test_lookback_grows_with_the_window(engine: Engine) -> None:
    project = make_project(engine)
    gap = LOOKBACK_S + 100
    write(engine, project, [(0, 0), (gap, 40)])
    window = 2 * gap

    found = increase(
        engine, project, COUNTER, start=T0, end=T0 + timedelta(seconds=gap + 1),
        step_s=gap, window_s=window,
    )  # fmt: skip

    # The point at `gap` covers [0, 2 * gap): the 400 s gap is inside a window that long.
    assert points(found) == [[(gap, 40.0)]]


def test_counter_across_a_partition_boundary_and_a_reset_at_midnight(engine: Engine) -> None:
    project = make_project(engine)
    midnight = datetime(2024, 3, 2, tzinfo=UTC)
    offset = (midnight - T0).total_seconds()
    # Every 15 s from 2 minutes before midnight: 0..7, then a restart at midnight: 3..10.
    values = [*range(8), *range(3, 11)]
    write(engine, project, [(offset + 15 * k, float(v)) for k, v in zip(range(-8, 8), values)])
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            names = {partition.name for partition in list_partitions(connection)}
        assert {"samples_p20240301", "samples_p20240302"} <= names

    found = increase(
        engine, project, COUNTER, start=midnight - timedelta(minutes=2),
        end=midnight + timedelta(minutes=2), step_s=60,
    )  # fmt: skip

    # [-120, -60): 0,1,2,3 -> 3 (the first has no predecessor); [-60, 0): 3 -> 4..7 -> 4;
    # [0, 60): 7 -> 3 is a reset (3), then 4, 5, 6 -> 6; [60, 120): 7..10 -> 4.
    assert points(found) == [[(offset + s, v) for s, v in [(-120, 3), (-60, 4), (0, 6), (60, 4)]]]
    total = increase(
        engine, project, COUNTER, start=midnight - timedelta(minutes=2),
        end=midnight + timedelta(minutes=2), step_s=240,
    )  # fmt: skip
    # 4-minute buckets split at midnight, and still add up to all the growth (3 + 4 + 6 + 4).
    assert [value for _, value in total[0].points] == [7.0, 10.0]


def test_only_matching_series_with_points_are_returned(engine: Engine) -> None:
    project, other = make_project(engine), make_project(engine, "other")
    write(engine, project, STEADY, {"gpu": "0"})
    write(engine, project, [(0, 5), (15, 10)], {"gpu": "1"})
    write(engine, project, [(0, 5)], {"gpu": "2"})  # one sample: no delta, no point
    write(engine, project, STEADY, {"gpu": "0"}, metric="other_total")
    write(engine, other, STEADY, {"gpu": "0"})
    kwargs = {"start": T0, "end": T0 + timedelta(minutes=2), "step_s": 60}

    found = rate(engine, project, COUNTER, **kwargs)  # type: ignore[arg-type]
    matched = rate(engine, project, COUNTER, [Matcher("gpu", MatchOp.RE, "[12]")], **kwargs)  # type: ignore[arg-type]

    assert [series.series.labels for series in found] == [{"gpu": "0"}, {"gpu": "1"}]
    assert points(found) == [[(0, 0.5), (60, 40 / 60)], [(0, 5 / 60)]]
    assert [series.series.labels for series in matched] == [{"gpu": "1"}]


BAD_CALLS: list[tuple[dict[str, object], type[Exception], str]] = [
    ({"end": T0}, ValueError, "must be after start"),
    ({"step_s": 0}, ValueError, "step_s must be a positive"),
    ({"window_s": 0}, ValueError, "window_s must be a positive"),
    ({"end": T0 + timedelta(days=2), "step_s": 15}, ValueError, "more than 11000"),
    ({"max_series": 1}, TooManySeries, "matches more than 1 series"),
    ({"start": datetime(2024, 3, 1)}, ValueError, "naive datetime"),
]


def test_bad_calls_raise(engine: Engine) -> None:
    project = make_project(engine)
    write(engine, project, STEADY, {"gpu": "0"})
    write(engine, project, STEADY, {"gpu": "1"})
    for le in ("1", "+Inf"):
        write(engine, project, STEADY, {"le": le}, metric="tokens_bucket")

    for kwargs, error, message in BAD_CALLS:
        call = {"start": T0, "end": T0 + timedelta(minutes=2), "step_s": 60} | kwargs
        for function in (increase, rate):
            with pytest.raises(error, match=message):
                function(engine, project, COUNTER, **call)  # type: ignore[arg-type]
        with pytest.raises(error, match=message):
            histogram_quantile(engine, project, 0.5, "tokens", **call)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- bucket_quantile

STANDARD = [(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (INF, 40.0)]

QUANTILE_CASES: list[tuple[str, float, list[tuple[float, float]], float]] = [
    ("interpolates in a bucket", 0.5, STANDARD, 0.1 + 0.4 * (10 / 20)),
    ("upper part of a bucket", 0.9, STANDARD, 0.5 + 0.5 * (6 / 10)),
    ("q=1 is the highest finite bound reached", 1.0, STANDARD, 1.0),
    ("lowest bucket starts at 0", 0.05, STANDARD, 0.1 * (2 / 10)),
    ("q=0", 0.0, [(1.0, 5.0), (INF, 5.0)], 0.0),
    ("unsorted input", 0.5, STANDARD[::-1], 0.3),
    ("in +Inf: bound of the bucket below", 0.99, [(1.0, 10.0), (2.0, 20.0), (INF, 100.0)], 2.0),
    ("lowest bound <= 0 is returned", 0.25, [(-1.0, 10.0), (1.0, 20.0), (INF, 20.0)], -1.0),
    ("equal bounds add up", 0.25, [(1.0, 5.0), (1.0, 5.0), (2.0, 20.0), (INF, 20.0)], 0.5),
    # Counts 10, 4, 12 become 10, 10, 12: rank 10.8 interpolates from 10, not from 4.
    ("non-monotonic", 0.9, [(1.0, 10.0), (2.0, 4.0), (3.0, 12.0), (INF, 12.0)], 2.4),
    # 3 + 1e-15 is float noise on 3: q=1 stays in the first bucket.
    ("float noise", 1.0, [(1.0, 3.0), (2.0, 3.0 + 1e-15), (INF, 3.0 + 1e-15)], 1.0),
    ("q < 0", -0.1, STANDARD, -INF),
    ("q > 1", 1.1, STANDARD, INF),
    ("q NaN", math.nan, STANDARD, math.nan),
    ("no +Inf bucket", 0.5, [(0.1, 1.0), (1.0, 2.0)], math.nan),
    ("only +Inf", 0.5, [(INF, 10.0)], math.nan),
    ("one bound twice", 0.5, [(INF, 10.0), (INF, 5.0)], math.nan),
    ("no observations", 0.5, [(1.0, 0.0), (INF, 0.0)], math.nan),
    ("no buckets", 0.5, [], math.nan),
    ("q=0 over an empty lowest bucket", 0.0, [(1.0, 0.0), (2.0, 5.0), (INF, 5.0)], math.nan),
]


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [case[1:] for case in QUANTILE_CASES],
    ids=[case[0] for case in QUANTILE_CASES],
)
def test_bucket_quantile_follows_prometheus(
    q: float, buckets: list[tuple[float, float]], expected: float
) -> None:
    result = bucket_quantile(q, buckets)
    if math.isnan(expected):
        assert math.isnan(result)
    else:
        assert result == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0.1", 0.1), ("+Inf", INF), ("Inf", INF), ("1e3", 1000.0), (".5", 0.5), ("-2", -2.0),
     ("abc", None), ("NaN", None), (" 1", None), ("1_0", None), ("", None), (None, None)],
)  # fmt: skip
def test_parse_bound(text: str | None, expected: float | None) -> None:
    assert parse_bound(text) == expected


# --------------------------------------------------------------------------- histogram_quantile

HISTOGRAM = "request_seconds"

# Cumulative bucket counters at +0, +30, +60, +90 s per (job, le). Job "b" restarted between
# +30 and +60: every bucket went down.
BUCKETS: dict[tuple[str, str], list[float]] = {
    ("a", "0.1"): [0, 10, 10, 20],
    ("a", "0.5"): [0, 30, 40, 50],
    ("a", "1"): [0, 40, 60, 70],
    ("a", "+Inf"): [0, 40, 80, 80],
    ("b", "0.1"): [5, 15, 2, 4],
    ("b", "1.0"): [5, 25, 6, 10],
    ("b", "+Inf"): [5, 30, 8, 12],
    ("c", "1"): [0, 10, 20, 30],  # no +Inf bucket: NaN
    ("a", "junk"): [0, 1000, 2000, 3000],  # not a bound: ignored
}


def write_histogram(engine: Engine, project_id: int) -> None:
    for (job, le), counts in BUCKETS.items():
        write(
            engine, project_id, list(zip((0, 30, 60, 90), counts, strict=True)),
            {"job": job, "le": le}, metric=HISTOGRAM + "_bucket",
        )  # fmt: skip
    # Not a bucket series of the histogram: never read.
    write(engine, project_id, [(0, 0), (30, 500)], {"job": "a"}, metric=HISTOGRAM + "_count")
    write(engine, project_id, [(0, 0), (30, 500)], {"job": "a"}, metric=HISTOGRAM)


def test_histogram_quantile_per_group_across_a_reset(engine: Engine) -> None:
    project = make_project(engine)
    write_histogram(engine, project)
    kwargs = {"start": T0, "end": T0 + timedelta(minutes=2), "step_s": 60}

    median = histogram_quantile(engine, project, 0.5, HISTOGRAM, **kwargs)  # type: ignore[arg-type]
    p90 = histogram_quantile(engine, project, 0.9, HISTOGRAM, **kwargs)  # type: ignore[arg-type]

    assert [group.labels for group in median] == [{"job": "a"}, {"job": "b"}, {"job": "c"}]
    (a, b, c), (a90, _, _) = points(median), points(p90)
    # a, [0, 60): increases 10, 30, 40, 40. rank 20 -> 0.1 + 0.4 * (10 / 20).
    #    [60, 120): 10, 20, 30, 40. rank 20 -> 0.1 + 0.4 * (10 / 10).
    assert [ts for ts, _ in a] == [ts for ts, _ in a90] == [ts for ts, _ in b] == [0, 60]
    assert [value for _, value in a] == pytest.approx([0.3, 0.5])
    # p90: rank 36 -> 0.5 + 0.5 * (6 / 10); then rank 36 > 30 falls in +Inf -> 1.
    assert [value for _, value in a90] == pytest.approx([0.8, 1.0])
    # b, [0, 60): 10, 20, 25. rank 12.5 -> 0.1 + 0.9 * (2.5 / 10).
    #    [60, 120): after the reset 2, 6, 8 plus 2, 4, 4 = 4, 10, 12. rank 6 -> 0.1 + 0.9 * 2 / 6.
    assert [value for _, value in b] == pytest.approx([0.325, 0.4])
    assert [ts for ts, _ in c] == [0, 60]
    assert all(math.isnan(value) for _, value in c)


def test_histogram_quantile_with_matchers_and_windows(engine: Engine) -> None:
    project = make_project(engine)
    write_histogram(engine, project)

    (a,) = histogram_quantile(
        engine, project, 0.5, HISTOGRAM, [Matcher("job", MatchOp.EQ, "a")],
        start=T0, end=T0 + timedelta(minutes=1), step_s=60, window_s=120,
    )  # fmt: skip

    # Window [-60, 60) holds the deltas at +30 only: 10, 30, 40, 40 as above.
    assert a.labels == {"job": "a"}
    assert [(ts - T0).total_seconds() for ts, _ in a.points] == [0]
    assert a.points[0][1] == pytest.approx(0.3)


def test_histogram_quantile_by_adds_the_groups_buckets_up(engine: Engine) -> None:
    project = make_project(engine)
    write_histogram(engine, project)

    (both,) = histogram_quantile(
        engine, project, 0.5, HISTOGRAM, [Matcher("job", MatchOp.RE, "a|b")],
        start=T0, end=T0 + timedelta(minutes=1), step_s=60, by=[],
    )  # fmt: skip

    # As sum by (le): [0, 60) holds a's 10, 30, 40, 40 and b's 10, 20 (le 1.0), 25:
    # 20, 30, 60, 65; rank 32.5 -> 0.5 + 0.5 * (2.5 / 30). Per job they are 0.3 and 0.325.
    assert both.labels == {}
    assert both.points[0][1] == pytest.approx(0.5 + 0.5 * 2.5 / 30)
