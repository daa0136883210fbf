"""Late samples for a compacted span are read back at once and merged by the next pass; a
duplicate of a compacted sample is seen once, with the value stored first; a second pass over
nothing new does nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine

from tests.storage_compaction.fleet import (
    NOW,
    UTIL,
    T,
    counts,
    every_read,
    fleet,
    make_project,
    write,
)
from tuneloop.storage.timeseries import query
from tuneloop.storage.timeseries.compaction import compact
from tuneloop.storage.timeseries.store_backend import StoreBackend
from tuneloop.storage.timeseries.types import Aggregation, Matcher, MatchOp, SeriesBatch

GPU0 = {"Hostname": "h1", "UUID": "GPU-0", "gpu": "0", "modelName": "H100"}


def gpu0(engine: Engine, project: int) -> list[tuple[int, float]]:
    """GPU 0's utilization samples as (ms, value), and the sum of the hour as a range read."""
    start_ms = int((T - timedelta(minutes=1)).timestamp() * 1000)
    [series] = StoreBackend(engine).read_raw(
        project,
        [Matcher("__name__", MatchOp.EQ, UTIL), Matcher("gpu", MatchOp.EQ, "0")],
        start_ms,
        start_ms + 3_660_000,
    )
    return list(zip(series.times_ms.tolist(), series.values.tolist(), strict=True))


def hour_sum(engine: Engine, project: int) -> float:
    [series] = query.query_range(
        engine,
        project,
        UTIL,
        [Matcher("gpu", MatchOp.EQ, "0")],
        start=T,
        end=T + timedelta(hours=1),
        step_s=3600,
        aggregation=Aggregation.SUM,
        use_rollups=False,
    )
    return series.points[0][1]


def test_late_samples_are_read_back_then_merged(engine: Engine) -> None:
    project = make_project(engine)
    write(engine, project, fleet(hours=1))
    compact(engine, hot_window=timedelta(0), now=NOW, after_rollups=False)
    stored = gpu0(engine, project)
    total = hour_sum(engine, project)
    first_ms, first_value = stored[0]
    first_ts = T + timedelta(milliseconds=first_ms - int(T.timestamp() * 1000))

    late = T + timedelta(minutes=30, seconds=1)  # between two stored samples
    write(engine, project, [SeriesBatch(UTIL, GPU0, [late, first_ts], [55.0, first_value + 1])])
    expected = sorted([*stored, (int(late.timestamp() * 1000), 55.0)])
    assert gpu0(engine, project) == expected  # the duplicate is seen once, with its first value
    assert hour_sum(engine, project) == total + 55.0
    assert counts(engine)[0] == 2

    report = compact(engine, hot_window=timedelta(0), now=NOW, after_rollups=False)
    assert (report.chunks_written, report.samples_compacted, report.late_samples_merged) == (
        1,
        2,
        2,
    )
    assert counts(engine)[:2] == (0, 12)
    assert gpu0(engine, project) == expected
    assert hour_sum(engine, project) == total + 55.0
    latest = query.latest(engine, project, UTIL, [Matcher("gpu", MatchOp.EQ, "0")])
    assert latest[0].value == stored[-1][1]


def test_a_second_pass_does_nothing(engine: Engine) -> None:
    project = make_project(engine)
    write(engine, project, fleet(hours=2))
    first = compact(engine, hot_window=timedelta(0), now=NOW, after_rollups=False)
    before = every_read(engine, project)
    again = compact(engine, hot_window=timedelta(0), now=NOW, after_rollups=False)
    assert first.chunks_written == 24
    assert (again.chunks_written, again.samples_compacted, again.late_samples_merged) == (0, 0, 0)
    assert every_read(engine, project) == before


def test_latest_answers_from_a_chunk(engine: Engine) -> None:
    project = make_project(engine)
    write(engine, project, fleet(hours=1))
    before = query.latest(engine, project, None)
    compact(engine, hot_window=timedelta(0), now=NOW, after_rollups=False)
    assert query.latest(engine, project, None) == before
    assert query.latest(engine, project, None, since=T + timedelta(minutes=59, seconds=30)) == [
        sample for sample in before if sample.ts >= T + timedelta(minutes=59, seconds=30)
    ]
    with pytest.raises(query.TooManySeries):
        query.latest(engine, project, None, max_series=11)


def test_a_late_sample_joins_its_chunk_after_the_span_setting_changed(engine: Engine) -> None:
    project = make_project(engine)
    write(engine, project, fleet(hours=1))
    compact(engine, hot_window=timedelta(0), now=NOW, after_rollups=False)
    stored = gpu0(engine, project)
    late = T + timedelta(minutes=40, seconds=1)
    write(engine, project, [SeriesBatch(UTIL, GPU0, [late], [55.0])])

    report = compact(
        engine, hot_window=timedelta(0), now=NOW, after_rollups=False, span=timedelta(minutes=30)
    )

    assert (report.chunks_written, report.late_samples_merged) == (1, 1)
    assert counts(engine)[:2] == (0, 12)
    assert gpu0(engine, project) == sorted([*stored, (int(late.timestamp() * 1000), 55.0)])
