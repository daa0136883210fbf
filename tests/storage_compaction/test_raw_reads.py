"""Raw reads over compacted samples (``read_raw``, ``count_raw``), which decode chunks into
numpy and merge them with raw rows: the same answers, bit for bit, as before compaction at the
edges of a range, across chunks and raw rows, with late duplicates, NaN and stale markers, and
when nothing is in the range."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import numpy as np
from sqlalchemy import Engine, select, update

from tests.storage_compaction.fleet import NOW, UTIL, T, counts, make_project, write
from tuneloop.storage.models import Series, samples
from tuneloop.storage.timeseries.compaction import compact
from tuneloop.storage.timeseries.sample_source import SampleArrays, with_raw
from tuneloop.storage.timeseries.store_backend import StoreBackend
from tuneloop.storage.timeseries.types import Matcher, MatchOp, SeriesBatch, fingerprint

STALE = np.array([0x7FF0000000000002], dtype=np.uint64).view(np.float64)[0]
"""Prometheus' stale marker: a NaN with its own payload."""
LABELS = [{"Hostname": "h1", "gpu": gpu} for gpu in ("0", "1")]
UTIL_ONLY = [Matcher("__name__", MatchOp.EQ, UTIL)]


def ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def stamps(start: datetime, count: int) -> list[datetime]:
    return [start + timedelta(seconds=15 * i, milliseconds=7 * i) for i in range(count)]


def hours_of(engine: Engine, project: int, hours: int, values: list[float] | None = None) -> None:
    times = stamps(T, hours * 240)
    for n, labels in enumerate(LABELS):
        written = values or [float((i * 7 + n) % 101) for i in range(len(times))]
        write(engine, project, [SeriesBatch(UTIL, labels, times, written)])


def answer(engine: Engine, project: int, start_ms: int, end_ms: int) -> list[tuple]:
    """Each series' labels, times and value bits: NaN payloads and -0.0 compared exactly."""
    found = StoreBackend(engine).read_raw(project, UTIL_ONLY, start_ms, end_ms)
    return [
        (s.labels, s.times_ms.tolist(), s.values.view(np.uint64).tolist())
        for s in sorted(found, key=lambda s: s.labels["gpu"])
    ]


def count(engine: Engine, project: int, start_ms: int, end_ms: int, limit: int = 10**6) -> int:
    return StoreBackend(engine).count_raw(project, UTIL_ONLY, start_ms, end_ms, limit)


def compact_all(engine: Engine, now: datetime = NOW) -> None:
    compact(engine, hot_window=timedelta(0), now=now, after_rollups=False)


def test_range_edges_inside_a_chunk_keep_the_half_open_window(engine: Engine) -> None:
    project = make_project(engine)
    hours_of(engine, project, 2)
    times = stamps(T, 480)
    # (start, end]: the sample at start is left out, the one at end kept, both inside a span.
    windows = [(ms(times[10]), ms(times[200])), (ms(times[10]) + 1, ms(times[200]) - 1)]
    windows.append((ms(times[100]), ms(times[400])))  # across the two chunks
    before = [answer(engine, project, *w) for w in windows]
    counted = [count(engine, project, *w) for w in windows]
    compact_all(engine)
    assert counts(engine)[:2] == (0, 4)
    assert [answer(engine, project, *w) for w in windows] == before
    assert [count(engine, project, *w) for w in windows] == counted
    first = before[0][0][1]
    assert (first[0], first[-1], len(first)) == (ms(times[11]), ms(times[200]), 190)


def test_a_range_over_chunks_and_raw_rows(engine: Engine) -> None:
    project = make_project(engine)
    hours_of(engine, project, 3)
    window = (ms(T + timedelta(minutes=30)), ms(T + timedelta(hours=2, minutes=40)))
    before = answer(engine, project, *window)
    # Only the first hour is compacted: the range reads a chunk, then raw rows.
    compact_all(engine, now=T + timedelta(hours=1, minutes=1))
    assert counts(engine)[:2] == (2 * 480, 2)
    assert answer(engine, project, *window) == before
    assert count(engine, project, *window) == sum(len(s[1]) for s in before)
    assert count(engine, project, *window, limit=10) == 11


def test_a_late_duplicate_inside_a_chunk_is_seen_once_with_the_chunks_value(
    engine: Engine,
) -> None:
    project = make_project(engine)
    hours_of(engine, project, 1)
    compact_all(engine)
    times = stamps(T, 240)
    window = (ms(T) - 1, ms(T + timedelta(hours=1)))
    before = answer(engine, project, *window)
    late = times[5] + timedelta(seconds=1)
    write(engine, project, [SeriesBatch(UTIL, LABELS[0], [times[5], late], [1000.0, 55.0])])
    assert counts(engine)[0] == 2
    after = answer(engine, project, *window)
    _, got_ms, got_bits = after[0]
    expected = sorted([*zip(before[0][1], before[0][2], strict=True), (ms(late), _bits(55.0))])
    assert list(zip(got_ms, got_bits, strict=True)) == expected
    assert after[1] == before[1]
    assert count(engine, project, *window) == 2 * 240 + 1
    assert count(engine, project, *window, limit=2 * 240) == 2 * 240 + 1


def test_nan_stale_markers_infinities_and_negative_zero_read_back_bit_for_bit(
    engine: Engine,
) -> None:
    project = make_project(engine)
    values = [float(i) for i in range(240)]
    values[5], values[6] = math.inf, -0.0
    hours_of(engine, project, 1, values)
    # The writer drops NaN; a PostgreSQL store can still hold some (rows from before that
    # rule). SQLite keeps NaN as NULL, which ``samples`` refuses.
    nan_too = engine.dialect.name == "postgresql"
    times = stamps(T, 240)
    with engine.begin() as connection:
        series_id = connection.execute(
            select(Series.id).where(Series.fingerprint == fingerprint(UTIL, LABELS[0]))
        ).scalar_one()
        for at, value in ((times[3], math.nan), (times[4], STALE)) if nan_too else ():
            connection.execute(
                update(samples)
                .where(samples.c.series_id == series_id, samples.c.ts == at)
                .values(value=value)
            )
    window = (ms(T) - 1, ms(T + timedelta(hours=1)))
    before = answer(engine, project, *window)
    compact_all(engine)
    after = answer(engine, project, *window)
    assert after == before
    nans = np.array(after[0][2][3:5], dtype=np.uint64).view(np.float64)
    assert np.isnan(nans).all() == nan_too
    # SQLite gives -0.0 back as 0.0, rows or chunks alike.
    assert after[0][2][5:7] == [_bits(math.inf), _bits(-0.0 if nan_too else 0.0)]


def test_a_range_with_nothing_in_it_is_empty(engine: Engine) -> None:
    project = make_project(engine)
    hours_of(engine, project, 1)
    compact_all(engine)
    times = stamps(T, 240)
    gap = (ms(times[20]), ms(times[21]) - 1)  # inside a chunk, between two samples
    after_all = (ms(T + timedelta(hours=2)), ms(T + timedelta(hours=3)))
    for window in (gap, after_all):
        assert answer(engine, project, *window) == []
        assert count(engine, project, *window) == 0


def test_with_raw_keeps_the_compacted_sample_of_a_duplicate_and_sorts() -> None:
    compacted = SampleArrays(
        np.array([1, 1, 2], dtype=np.int64),
        np.array([10, 20, 10], dtype=np.int64),
        np.array([1.0, 2.0, 3.0]),
    )
    raw = SampleArrays(
        np.array([2, 1, 1], dtype=np.int64),
        np.array([5, 20, 30], dtype=np.int64),
        np.array([9.0, 99.0, 4.0]),
    )
    merged = with_raw(compacted, raw)
    assert merged.series_ids.tolist() == [1, 1, 1, 2, 2]
    assert merged.micros.tolist() == [10, 20, 30, 5, 10]
    assert merged.values.tolist() == [1.0, 2.0, 4.0, 9.0, 3.0]
    empty = SampleArrays(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0))
    assert with_raw(compacted, empty) is compacted
    assert len(with_raw(empty, raw)) == 3


def _bits(value: float) -> int:
    return int(np.array([value], dtype=np.float64).view(np.uint64)[0])
