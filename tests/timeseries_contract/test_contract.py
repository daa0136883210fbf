"""The time-series contract (tuneloop.storage.timeseries.backend), the same assertions on every
backend: the built-in store on SQLite and PostgreSQL, and real VictoriaMetrics and Prometheus.
Where a TSDB can only approximate (counter functions), the fixture's one tolerance applies."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

import pytest

from tests.helpers import free_port
from tests.timeseries_contract.conftest import T0, Subject
from tuneloop.errors import Unavailable
from tuneloop.storage.prometheus.backend import PrometheusBackend
from tuneloop.storage.timeseries.query import TooManySeries
from tuneloop.storage.timeseries.types import (
    Aggregation,
    Matcher,
    MatchOp,
    RejectionCode,
    SeriesBatch,
    SeriesKind,
)

GAUGE = "tl_gpu_util"
COUNTER = "tl_tokens_total"
HISTOGRAM = "tl_step_seconds"
HOSTILE = [
    'say "hi"',
    "back\\slash",
    "new\nline",
    "tab\tand\rreturn",
    "ünïcødé ✓ 漢字",
    "'; DROP TABLE series; --",
    '"} or vector(1) # ',
    '\\"',
]


def at(*offsets_s: float) -> list[datetime]:
    return [T0 + timedelta(seconds=offset) for offset in offsets_s]


def gauge(labels: dict[str, str], values: Sequence[float], every_s: int = 10) -> SeriesBatch:
    return SeriesBatch(GAUGE, labels, at(*range(0, every_s * len(values), every_s)), list(values))


def eq(name: str, value: str) -> Matcher:
    return Matcher(name, MatchOp.EQ, value)


# --------------------------------------------------------------------------- series and labels


def write_fleet(subject: Subject) -> None:
    subject.write(
        [
            gauge({"gpu": "0", "host": "a"}, [1, 2]),
            gauge({"gpu": "1", "host": "a"}, [3, 4]),
            gauge({"gpu": "10", "host": "b"}, [5, 6]),
            SeriesBatch(COUNTER, {"host": "b"}, at(0, 10), [1, 2], SeriesKind.COUNTER),
        ]
    )


def test_find_series_names_labels_and_kinds(subject: Subject) -> None:
    write_fleet(subject)
    found = subject.backend.find_series(subject.project, None)
    assert sorted((s.metric, sorted(s.labels.items()), s.kind) for s in found) == [
        (GAUGE, [("gpu", "0"), ("host", "a")], SeriesKind.GAUGE),
        (GAUGE, [("gpu", "1"), ("host", "a")], SeriesKind.GAUGE),
        (GAUGE, [("gpu", "10"), ("host", "b")], SeriesKind.GAUGE),
        (COUNTER, [("host", "b")], SeriesKind.COUNTER),
    ]
    by_labels = {(s.metric, tuple(sorted(s.labels.items()))) for s in found}
    assert len(by_labels) == 4
    assert [s.metric for s in found] == sorted(s.metric for s in found)
    assert {s.metric: s.kind for s in found} == {
        GAUGE: SeriesKind.GAUGE,
        COUNTER: SeriesKind.COUNTER,
    }
    ids = {s.id for s in found}
    assert len(ids) == 4 and all(0 < i < 2**63 for i in ids)
    again = subject.backend.find_series(subject.project, GAUGE, [eq("gpu", "1")])
    assert [dict(s.labels) for s in again] == [{"gpu": "1", "host": "a"}]
    assert again[0].id in ids


def test_find_series_over_a_time_range(subject: Subject) -> None:
    write_fleet(subject)
    span = {"start": T0 - timedelta(minutes=1), "end": T0 + timedelta(minutes=1)}
    found = subject.backend.find_series(subject.project, GAUGE, [eq("host", "a")], **span)
    assert sorted(s.labels["gpu"] for s in found) == ["0", "1"]


def test_label_names_and_values(subject: Subject) -> None:
    write_fleet(subject)
    backend, project = subject.backend, subject.project
    start, end = T0 - timedelta(minutes=1), T0 + timedelta(minutes=5)
    assert backend.label_names(project, start=start, end=end) == ["__name__", "gpu", "host"]
    assert backend.label_names(project, [eq("__name__", COUNTER)], start=start, end=end) == [
        "__name__",
        "host",
    ]
    assert backend.label_values(project, "gpu", start=start, end=end) == ["0", "1", "10"]
    assert backend.label_values(project, "host", [eq("gpu", "0")], start=start, end=end) == ["a"]
    assert backend.label_values(project, "__name__", start=start, end=end) == [GAUGE, COUNTER]
    assert backend.label_values(project, "missing", start=start, end=end) == []


def test_regex_matchers_are_anchored(subject: Subject) -> None:
    write_fleet(subject)

    def gpus(*matchers: Matcher) -> list[str]:
        found = subject.backend.find_series(subject.project, GAUGE, matchers)
        return sorted(s.labels["gpu"] for s in found)

    assert gpus(Matcher("gpu", MatchOp.RE, "1")) == ["1"]
    assert gpus(Matcher("gpu", MatchOp.RE, "1.*")) == ["1", "10"]
    assert gpus(Matcher("gpu", MatchOp.NRE, "1.*")) == ["0"]
    assert gpus(Matcher("host", MatchOp.NE, "a")) == ["10"]
    assert gpus(Matcher("gpu", MatchOp.RE, "0|10"), Matcher("host", MatchOp.EQ, "b")) == ["10"]


def test_a_bad_regex_is_refused(subject: Subject) -> None:
    write_fleet(subject)
    with pytest.raises(ValueError):
        subject.backend.find_series(subject.project, GAUGE, [Matcher("gpu", MatchOp.RE, "(")])


def test_max_series(subject: Subject) -> None:
    write_fleet(subject)
    backend = subject.backend
    assert len(backend.find_series(subject.project, GAUGE, max_series=3)) == 3
    with pytest.raises(TooManySeries):
        backend.find_series(subject.project, GAUGE, max_series=2)
    with pytest.raises(TooManySeries):
        backend.query_range(
            subject.project,
            GAUGE,
            start=T0,
            end=T0 + timedelta(minutes=1),
            step_s=60,
            aggregation=Aggregation.AVG,
            max_series=2,
        )
    with pytest.raises(TooManySeries):
        backend.latest(subject.project, GAUGE, since=T0, max_series=2)


def test_hostile_label_values_round_trip(subject: Subject) -> None:
    subject.write([gauge({"v": value, "i": str(i)}, [i]) for i, value in enumerate(HOSTILE)])
    backend = subject.backend
    found = backend.find_series(subject.project, GAUGE)
    assert sorted(s.labels["v"] for s in found) == sorted(HOSTILE)
    for i, value in enumerate(HOSTILE):
        (one,) = backend.find_series(subject.project, GAUGE, [eq("v", value)])
        assert dict(one.labels) == {"v": value, "i": str(i)}
        (newest,) = backend.latest(subject.project, GAUGE, [eq("v", value)], since=T0)
        assert newest.value == i
        assert backend.label_values(subject.project, "i", [eq("v", value)], start=T0) == [str(i)]


def test_projects_see_only_their_own_series(subject: Subject) -> None:
    mine, theirs = subject.projects
    subject.write([gauge({"gpu": "0"}, [1, 1])], project=mine)
    subject.write([gauge({"gpu": "0"}, [7, 7]), gauge({"gpu": "9"}, [7, 7])], project=theirs)
    backend = subject.backend
    assert [dict(s.labels) for s in backend.find_series(mine, None)] == [{"gpu": "0"}]
    assert backend.label_values(mine, "gpu", start=T0) == ["0"]
    assert [s.value for s in backend.latest(mine, GAUGE, since=T0)] == [1]
    answer = backend.query_range(
        mine, GAUGE, start=T0, end=T0 + timedelta(minutes=1), step_s=60, aggregation=Aggregation.MAX
    )
    assert [[v for _, v in s.points] for s in answer] == [[1]]
    # A matcher on the project label narrows; it never widens.
    sneaky = [eq("tuneloop_project", str(theirs))]
    assert backend.find_series(mine, None, sneaky) == []


def test_write_keeps_good_samples_and_reports_bad_ones(subject: Subject) -> None:
    result = subject.backend.write(
        subject.project,
        [
            SeriesBatch(GAUGE, {"gpu": "0"}, at(0, 10, 20), [1.0, math.nan, 3.0]),
            SeriesBatch("", {"gpu": "1"}, at(0), [1.0]),
        ],
    )
    subject.settle()
    assert result.samples_written == 2
    assert sorted(r.code for r in result.rejected) == [
        RejectionCode.INVALID_METRIC,
        RejectionCode.NAN_VALUE,
    ]
    (newest,) = subject.backend.latest(subject.project, GAUGE, since=T0)
    assert (newest.ts, newest.value) == (T0 + timedelta(seconds=20), 3.0)


# --------------------------------------------------------------------------- range queries

VALUES = [float((i * 7) % 13) for i in range(60)]  # 10 minutes at 10 s, not monotonic


def expected_buckets(
    start: datetime, end: datetime, step_s: int, reduce: Callable[[list[float]], float]
) -> list[tuple[datetime, float]]:
    """The contract's buckets computed here: [b, b + step) clipped to [start, end)."""
    buckets: dict[datetime, list[float]] = {}
    for ts, value in zip(at(*range(0, 600, 10)), VALUES, strict=True):
        if start <= ts < end:
            offset = (ts - T0).total_seconds() // step_s * step_s
            buckets.setdefault(T0 + timedelta(seconds=offset), []).append(value)
    return [(b, reduce(values)) for b, values in sorted(buckets.items())]


def median(values: list[float]) -> float:
    return statistics.quantiles(values, n=4, method="inclusive")[1]


REDUCERS: dict[Aggregation, Callable[[list[float]], float]] = {
    Aggregation.AVG: statistics.fmean,
    Aggregation.MIN: min,
    Aggregation.MAX: max,
    Aggregation.SUM: math.fsum,
    Aggregation.COUNT: len,
    Aggregation.LAST: lambda values: values[-1],
    Aggregation.QUANTILE: median,
}


@pytest.mark.parametrize(
    ("start_s", "end_s"),
    [(0, 600), (25, 335), (0, 30)],
    ids=["aligned", "cut-at-both-ends", "inside-one-bucket"],
)
def test_query_range_each_aggregation(subject: Subject, start_s: int, end_s: int) -> None:
    subject.write([gauge({"gpu": "0"}, VALUES)])
    start, end = T0 + timedelta(seconds=start_s), T0 + timedelta(seconds=end_s)
    for aggregation, reduce in REDUCERS.items():
        q = 0.5 if aggregation is Aggregation.QUANTILE else None
        (answer,) = subject.backend.query_range(
            subject.project,
            GAUGE,
            [eq("gpu", "0")],
            start=start,
            end=end,
            step_s=60,
            aggregation=aggregation,
            q=q,
        )
        assert dict(answer.series.labels) == {"gpu": "0"}
        assert answer.series.metric == GAUGE
        expected = expected_buckets(start, end, 60, reduce)
        assert [t for t, _ in answer.points] == [t for t, _ in expected], aggregation
        assert [v for _, v in answer.points] == pytest.approx([v for _, v in expected], rel=1e-9), (
            aggregation
        )


def test_query_range_without_a_metric_name(subject: Subject) -> None:
    write_fleet(subject)
    answer = subject.backend.query_range(
        subject.project,
        None,
        [eq("host", "b")],
        start=T0,
        end=T0 + timedelta(minutes=1),
        step_s=60,
        aggregation=Aggregation.LAST,
    )
    assert sorted((s.series.metric, s.points[0][1]) for s in answer) == [(GAUGE, 6), (COUNTER, 2)]


# --------------------------------------------------------------------------- latest


def test_latest_value_and_time(subject: Subject) -> None:
    fresh = datetime.now(T0.tzinfo).replace(microsecond=0) - timedelta(seconds=30)
    subject.write(
        [
            gauge({"gpu": "0"}, VALUES),  # newest sample 20+ minutes old
            SeriesBatch(GAUGE, {"gpu": "1"}, [fresh - timedelta(seconds=5), fresh], [4.0, 5.0]),
        ]
    )
    backend = subject.backend
    found = {
        s.series.labels["gpu"]: (s.ts, s.value) for s in backend.latest(subject.project, GAUGE)
    }
    assert found == {"0": (T0 + timedelta(seconds=590), VALUES[-1]), "1": (fresh, 5.0)}
    since = T0 + timedelta(seconds=590)
    assert len(backend.latest(subject.project, GAUGE, since=since)) == 2
    assert [
        s.series.labels["gpu"]
        for s in backend.latest(subject.project, GAUGE, since=since + timedelta(seconds=1))
    ] == ["1"]
    assert backend.latest(subject.project, GAUGE, since=fresh + timedelta(seconds=1)) == []


# --------------------------------------------------------------------------- counters


def counter_values() -> list[float]:
    """A counter growing 1/s, sampled every 10 s, that restarts at 200 s (and has grown 5 since)."""
    values, total = [], 0.0
    for i in range(60):
        total = total + 10 if i != 20 else 5.0
        values.append(total)
    return values


def test_rate_and_increase_with_a_reset(subject: Subject) -> None:
    subject.write(
        [
            SeriesBatch(
                COUNTER, {"host": "a"}, at(*range(0, 600, 10)), counter_values(), SeriesKind.COUNTER
            )
        ]
    )
    start, end = T0 + timedelta(minutes=1), T0 + timedelta(minutes=9)
    for function, scale in ((subject.backend.increase, 1.0), (subject.backend.rate, 1 / 60)):
        (answer,) = function(subject.project, COUNTER, start=start, end=end, step_s=60)
        assert [t for t, _ in answer.points] == [start + timedelta(minutes=i) for i in range(8)]
        # Every window grows 60, less the 5 s lost in the one with the restart.
        expected = [60 * scale] * 8
        expected[2] = 55 * scale
        assert [v for _, v in answer.points] == pytest.approx(expected, rel=subject.counter_rel)
        assert [v for _, v in answer.points][2] < answer.points[1][1]


def test_histogram_quantile(subject: Subject) -> None:
    # Per 10 s: one observation <= 0.1, two in (0.1, 0.5], one in (0.5, 1].
    per_sample = {"0.1": 1, "0.5": 3, "1": 4, "+Inf": 4}
    subject.write(
        [
            SeriesBatch(
                HISTOGRAM + "_bucket",
                {"le": le, "job": "train"},
                at(*range(0, 600, 10)),
                [float(step * i) for i in range(1, 61)],
                SeriesKind.COUNTER,
            )
            for le, step in per_sample.items()
        ]
    )
    start, end = T0 + timedelta(minutes=1), T0 + timedelta(minutes=9)
    for q, expected in ((0.5, 0.3), (0.9, 0.8)):
        (group,) = subject.backend.histogram_quantile(
            subject.project, q, HISTOGRAM, start=start, end=end, step_s=60, window_s=120
        )
        assert group.labels == {"job": "train"}
        assert [t for t, _ in group.points] == [start + timedelta(minutes=i) for i in range(8)]
        assert [v for _, v in group.points] == pytest.approx(
            [expected] * 8, rel=subject.counter_rel
        )


def test_histogram_quantile_by_adds_up_each_groups_buckets(subject: Subject) -> None:
    # Two pods of one job: pod a observes <= 0.1 only, pod b in (0.5, 1] only. Per job the
    # buckets add up first, so the median lies between: not either pod's own median.
    per_pod = {
        "a": {"0.1": 1, "0.5": 1, "1": 1, "+Inf": 1},
        "b": {"0.1": 0, "0.5": 0, "1": 1, "+Inf": 1},
    }
    subject.write(
        [
            SeriesBatch(
                HISTOGRAM + "_bucket",
                {"le": le, "job": "serve", "pod": pod},
                at(*range(0, 600, 10)),
                [float(step * i) for i in range(1, 61)],
                SeriesKind.COUNTER,
            )
            for pod, buckets in per_pod.items()
            for le, step in buckets.items()
        ]
    )
    start, end = T0 + timedelta(minutes=1), T0 + timedelta(minutes=9)
    per_pod_groups = subject.backend.histogram_quantile(
        subject.project, 0.5, HISTOGRAM, start=start, end=end, step_s=60, window_s=120
    )
    assert sorted(group.labels["pod"] for group in per_pod_groups) == ["a", "b"]
    (group,) = subject.backend.histogram_quantile(
        subject.project, 0.5, HISTOGRAM, start=start, end=end, step_s=60, window_s=120, by=["job"]
    )
    assert group.labels == {"job": "serve"}
    # Of 2 observations per step, the 1st lies in (0, 0.1]: rank 1 of bucket 0.1 -> 0.1.
    assert [v for _, v in group.points] == pytest.approx([0.1] * 8, rel=subject.counter_rel)


# --------------------------------------------------------------------------- raw samples


def ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def test_read_raw_gives_each_series_own_samples_in_a_half_open_window(subject: Subject) -> None:
    write_fleet(subject)
    theirs = subject.projects[1]
    subject.write([gauge({"gpu": "0", "host": "a"}, [9, 9])], project=theirs)
    backend = subject.backend
    name = Matcher("__name__", MatchOp.EQ, GAUGE)
    start, end = ms(T0) - 60_000, ms(T0) + 60_000
    found = backend.read_raw(subject.project, [name, eq("host", "a")], start, end)
    assert [s.labels for s in found] == [
        {"__name__": GAUGE, "gpu": "0", "host": "a"},
        {"__name__": GAUGE, "gpu": "1", "host": "a"},
    ]
    assert [s.times_ms.tolist() for s in found] == [[ms(T0), ms(T0) + 10_000]] * 2
    assert [s.values.tolist() for s in found] == [[1, 2], [3, 4]]
    # (start, end]: the sample at start is out, the one at end in.
    (one,) = backend.read_raw(subject.project, [name, eq("gpu", "0")], ms(T0), ms(T0) + 10_000)
    assert one.times_ms.tolist() == [ms(T0) + 10_000]
    # Any matcher kind on the name; the count bounds the read.
    every = [Matcher("__name__", MatchOp.RE, "tl_.*")]
    assert len(backend.read_raw(subject.project, every, start, end)) == 4
    assert backend.count_raw(subject.project, every, start, end, 100) == 8
    assert backend.count_raw(subject.project, every, start, end, 3) == 4
    assert backend.read_raw(subject.project, [name], end, end + 60_000) == []
    assert backend.count_raw(subject.project, [name], end, end + 60_000, 10) == 0
    with pytest.raises(TooManySeries):
        backend.read_raw(subject.project, every, start, end, max_series=3)


def test_read_raw_of_two_names_with_one_label_set(subject: Subject) -> None:
    labels = {"host": "a"}
    subject.write(
        [
            SeriesBatch(GAUGE, labels, at(0, 10), [1, 2]),
            SeriesBatch(COUNTER, labels, at(0, 10), [5, 6], SeriesKind.COUNTER),
        ]
    )
    both = [Matcher("__name__", MatchOp.RE, f"{GAUGE}|{COUNTER}")]
    start, end = ms(T0) - 60_000, ms(T0) + 60_000
    assert subject.backend.count_raw(subject.project, both, start, end, 100) == 4
    found = subject.backend.read_raw(subject.project, both, start, end)
    assert sorted(s.labels["__name__"] for s in found) == sorted([GAUGE, COUNTER])


# --------------------------------------------------------------------------- unreachable


def test_an_unreachable_tsdb_is_unavailable() -> None:
    backend = PrometheusBackend(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    try:
        with pytest.raises(Unavailable):
            backend.find_series(1, GAUGE)
        with pytest.raises(Unavailable):
            backend.latest(1, GAUGE)
        with pytest.raises(Unavailable):
            backend.write(1, [gauge({"gpu": "0"}, [1.0])])
    finally:
        backend.close()
