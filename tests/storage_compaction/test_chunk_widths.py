"""A series' chunks are widened until one holds about ``min_samples``: the width from the
series' rate, the spans of that width compacted only once closed (the rest stay rows, read as
before), and a later pass over the same day choosing the same width."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine, select

from tests.storage_compaction.fleet import NOW, T, counts, every_read, fleet, make_project, write
from tuneloop.storage.models import sample_chunks
from tuneloop.storage.timeseries import raw
from tuneloop.storage.timeseries.chunk_widths import candidate_widths, chunk_width
from tuneloop.storage.timeseries.compaction import compact
from tuneloop.storage.timeseries.store_backend import StoreBackend
from tuneloop.storage.timeseries.types import Matcher, MatchOp

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


def test_the_candidates_are_the_multiples_of_the_span_that_divide_a_day() -> None:
    assert candidate_widths(HOUR) == [HOUR * k for k in (1, 2, 3, 4, 6, 8, 12, 24)]
    assert candidate_widths(timedelta(hours=8)) == [timedelta(hours=8), DAY]
    assert candidate_widths(DAY) == [DAY]
    with pytest.raises(ValueError, match="divide a day"):
        candidate_widths(timedelta(hours=5))


def test_the_width_is_the_narrowest_that_holds_min_samples() -> None:
    # A sample every 15 s: 240 an hour.
    assert chunk_width(240, HOUR, HOUR, 1) == HOUR
    assert chunk_width(240, HOUR, HOUR, 240) == HOUR
    assert chunk_width(240, HOUR, HOUR, 241) == 2 * HOUR
    assert chunk_width(240, HOUR, HOUR, 2000) == 12 * HOUR  # 8.3 hours: 12 divides a day
    assert chunk_width(240 * 24, DAY, HOUR, 2000) == 12 * HOUR  # the same rate over a day
    assert chunk_width(900, HOUR, HOUR, 2000) == 3 * HOUR  # a step every 4 s
    assert chunk_width(3, DAY, HOUR, 2000) == DAY  # sparse: a day at most
    assert chunk_width(0, DAY, HOUR, 2000) == DAY
    with pytest.raises(ValueError, match="min_samples"):
        chunk_width(240, HOUR, HOUR, 0)
    with pytest.raises(ValueError, match="covered"):
        chunk_width(240, timedelta(0), HOUR, 10)


def spans(engine: Engine) -> set[tuple[int, int]]:
    """Every chunk's (start, end) as hours after midnight of T's day."""
    midnight = T.replace(hour=0)
    with engine.connect() as connection:
        rows = connection.execute(select(sample_chunks.c.start_ts, sample_chunks.c.end_ts))
        return {((start - midnight) // HOUR, (end - midnight) // HOUR) for start, end in rows}


def test_spans_not_closed_stay_rows_until_they_close(engine: Engine) -> None:
    # 12 series, 240 samples an hour from 09:00 to 15:00.
    project = make_project(engine)
    write(engine, project, fleet(hours=6))
    before = every_read(engine, project)
    total = counts(engine)[0]

    def run(now: object) -> tuple[int, int, int]:
        report = compact(
            engine, hot_window=timedelta(0), now=now, after_rollups=False, min_samples=300
        )
        return report.chunks_written, report.samples_compacted, report.late_samples_merged

    # At 13:00: 960 samples in 13 hours, 74 an hour: 6-hour chunks, only [06:00, 12:00) closed.
    assert run(T + timedelta(hours=4)) == (12, 12 * 720, 0)
    assert spans(engine) == {(6, 12)}
    assert counts(engine) == (total - 12 * 720, 12, 12 * 720)
    assert every_read(engine, project) == before

    # The day closed: 1,440 samples (chunks' and rows') in 24 hours, 60 an hour: 6 hours again.
    assert run(NOW) == (12, 12 * 720, 0)
    assert spans(engine) == {(6, 12), (12, 18)}
    assert counts(engine) == (0, 24, total)
    assert every_read(engine, project) == before
    assert run(NOW) == (0, 0, 0)


def test_a_series_too_sparse_for_any_closed_span_keeps_its_rows(engine: Engine) -> None:
    project = make_project(engine)
    write(engine, project, fleet(hours=3))
    before = every_read(engine, project)
    total = counts(engine)[0]

    report = compact(
        engine,
        hot_window=timedelta(0),
        now=T + timedelta(hours=3),
        min_samples=1000,
        after_rollups=False,
    )

    assert (report.chunks_written, counts(engine)) == (0, (total, 0, 0))
    report = compact(
        engine, hot_window=timedelta(0), now=NOW, min_samples=1000, after_rollups=False
    )
    assert (report.chunks_written, spans(engine), counts(engine)) == (12, {(0, 24)}, (0, 12, total))
    assert every_read(engine, project) == before


def test_a_late_sample_joins_a_widened_chunk(engine: Engine) -> None:
    project = make_project(engine)
    write(engine, project, fleet(hours=3))
    compact(engine, hot_window=timedelta(0), now=NOW, min_samples=240, after_rollups=False)
    assert spans(engine) == {(8, 16)}  # 720 samples in a day: 30 an hour, 8 hours
    # An hour more of every series, 7 s after each stored sample: 960 in the day, 40 an hour,
    # 6-hour spans now; but every late sample lies in a stored chunk, which takes it in.
    late = fleet(start=T + timedelta(hours=1, seconds=7), hours=1, seed=9)
    write(engine, project, late)
    expected = every_read(engine, project)

    report = compact(engine, hot_window=timedelta(0), now=NOW, min_samples=240, after_rollups=False)

    assert (report.chunks_written, report.late_samples_merged) == (12, 12 * 240)
    assert spans(engine) == {(8, 16)}
    assert counts(engine)[:2] == (0, 12)
    assert every_read(engine, project) == expected


def test_a_store_of_one_hour_chunks_goes_on_with_wider_ones(engine: Engine) -> None:
    # One-hour chunks until 10:00 (as written before widening), then 12-hour spans: the span
    # [00:00, 12:00) takes in the stored chunk at 00:00 if any and overlaps the others' time,
    # never their samples.
    project = make_project(engine)
    write(engine, project, fleet(start=T.replace(hour=0), hours=15))
    before = every_read(engine, project), after_the_hourly_chunks(engine, project)
    total = counts(engine)[0]
    hourly = compact(
        engine, hot_window=timedelta(0), now=T.replace(hour=10), min_samples=1, after_rollups=False
    )
    assert hourly.chunks_written == 12 * 10

    # 3,600 samples in the day, 150 an hour: 1,500 need 10 hours, so 12-hour spans.
    report = compact(
        engine, hot_window=timedelta(0), now=NOW, min_samples=1500, after_rollups=False
    )

    assert report.samples_compacted == total - 12 * 10 * 240
    assert spans(engine) == {(hour, hour + 1) for hour in range(1, 10)} | {(0, 12), (12, 24)}
    assert counts(engine) == (0, 12 * 11, total)
    assert (every_read(engine, project), after_the_hourly_chunks(engine, project)) == before
    again = compact(engine, hot_window=timedelta(0), now=NOW, min_samples=1500, after_rollups=False)
    assert again.chunks_written == 0


def after_the_hourly_chunks(engine: Engine, project: int) -> object:
    """A read that only the wide chunk [00:00, 12:00) answers though an hourly chunk starts
    after its start: 10:20 to 10:40."""
    start_ms = int(T.replace(hour=10, minute=20).timestamp() * 1000)
    everything = [Matcher("__name__", MatchOp.RE, ".+")]
    with engine.connect() as connection:
        return [
            (s.labels, s.times_ms.tolist(), s.values.tolist())
            for s in raw.read(connection, project, everything, start_ms, start_ms + 20 * 60_000)
        ]


def test_the_newest_sample_of_a_wide_chunk_spanning_an_hourly_one(engine: Engine) -> None:
    project = make_project(engine)
    write(engine, project, fleet(start=T.replace(hour=0), hours=12))
    compact(
        engine, hot_window=timedelta(0), now=T.replace(hour=10), min_samples=1, after_rollups=False
    )
    compact(engine, hot_window=timedelta(0), now=NOW, min_samples=1500, after_rollups=False)
    assert (9, 10) in spans(engine)
    assert any(low == 0 and high >= 12 for low, high in spans(engine)), spans(engine)

    newest = StoreBackend(engine).latest(project, None, since=T.replace(hour=9))

    # The latest chunk to start is [09:00, 10:00); the newest samples are in the wide one.
    assert len(newest) == 12 and all(point.ts.hour == 11 for point in newest), newest
