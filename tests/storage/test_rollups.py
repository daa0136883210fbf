"""Rollups on real SQLite and real PostgreSQL: rows equal to raw aggregates, queries that give the
same answer with and without them, idempotent and restartable passes, late samples."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, delete, insert, select, text

from tuneloop.storage import make_engine
from tuneloop.storage.models import ROLLUP_TABLES, Project, samples
from tuneloop.storage.timeseries.query import query_range
from tuneloop.storage.timeseries.rollups import floor_time, read_watermarks, update_rollups
from tuneloop.storage.timeseries.types import Aggregation, SeriesBatch
from tuneloop.storage.timeseries.writer import SampleWriter

METRIC = "DCGM_FI_DEV_POWER_USAGE"
# 22:30 to 01:30 UTC: crosses midnight, so PostgreSQL spreads it over two partitions.
T0 = datetime(2024, 3, 1, 22, 30, 0, tzinfo=UTC)
SPAN = timedelta(hours=3)
END = T0 + SPAN
GPUS = 3
MERGEABLE = [agg for agg in Aggregation if agg is not Aggregation.QUANTILE]

RollupRow = tuple[int, datetime, int, float, float, float, float, datetime]


def make_project(engine: Engine) -> int:
    with engine.begin() as connection:
        key = connection.execute(insert(Project).values(name="p")).inserted_primary_key
    assert key is not None
    return int(key[0])


def sample_times(gpu: int) -> list[datetime]:
    # Every 10 s with a per-series jitter, so buckets hold samples at uneven offsets.
    return [T0 + timedelta(seconds=10 * i + (gpu * 3 + i * 7) % 10) for i in range(1080)]


def write_fixture(engine: Engine) -> int:
    project = make_project(engine)
    batches = [
        SeriesBatch(
            METRIC,
            {"gpu": str(gpu)},
            sample_times(gpu),
            [((i * 37 + gpu * 11) % 101) / 7 for i in range(1080)],
        )
        for gpu in range(GPUS)
    ]
    assert not SampleWriter(engine).write(project, batches).rejected
    return project


def write_one(engine: Engine, project: int, gpu: int, ts: datetime, value: float) -> None:
    batch = SeriesBatch(METRIC, {"gpu": str(gpu)}, [ts], [value])
    assert not SampleWriter(engine).write(project, [batch]).rejected


def rollup_rows(engine: Engine, resolution_s: int) -> list[RollupRow]:
    table = ROLLUP_TABLES[resolution_s]
    with engine.connect() as connection:
        rows = connection.execute(select(table).order_by(table.c.series_id, table.c.bucket))
        return [tuple(row) for row in rows]


def expected_rows(engine: Engine, resolution_s: int, before: datetime) -> list[RollupRow]:
    """The rollup computed in Python from the raw samples: the test's oracle."""
    groups: dict[tuple[int, datetime], list[tuple[datetime, float]]] = defaultdict(list)
    with engine.connect() as connection:
        for series_id, ts, value in connection.execute(select(samples)):
            bucket = floor_time(ts, resolution_s)
            if bucket + timedelta(seconds=resolution_s) <= before:
                groups[series_id, bucket].append((ts, value))
    rows = []
    for (series_id, bucket), points in sorted(groups.items()):
        values = [value for _, value in points]
        last_ts, last = max(points)
        rows.append(
            (series_id, bucket, len(values), sum(values), min(values), max(values), last, last_ts)
        )
    return rows


def assert_rows_equal(actual: list[RollupRow], expected: list[RollupRow]) -> None:
    # Exact: ids, buckets, counts and last_ts; to float tolerance: sum, min, max, last.
    assert [(*row[:3], row[7]) for row in actual] == [(*row[:3], row[7]) for row in expected]
    for got, want in zip(actual, expected, strict=True):
        assert got[3:7] == pytest.approx(want[3:7]), got


def results(engine: Engine, project: int, *, use_rollups: bool, **kwargs: Any) -> list[Any]:
    found = query_range(engine, project, METRIC, use_rollups=use_rollups, **kwargs)
    return [(dict(series.series.labels), series.points) for series in found]


def assert_same_with_and_without_rollups(engine: Engine, project: int) -> None:
    start, end = T0 + timedelta(seconds=17), END + timedelta(seconds=5)
    for step_s in (60, 300, 3600, 7200):
        for aggregation in MERGEABLE:
            query = {"start": start, "end": end, "step_s": step_s, "aggregation": aggregation}
            raw = results(engine, project, use_rollups=False, **query)
            rolled = results(engine, project, use_rollups=True, **query)
            assert [labels for labels, _ in rolled] == [labels for labels, _ in raw]
            for (_, got), (_, want) in zip(rolled, raw, strict=True):
                assert [ts for ts, _ in got] == [ts for ts, _ in want], (step_s, aggregation)
                assert [v for _, v in got] == pytest.approx([v for _, v in want]), (
                    step_s,
                    aggregation,
                )


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("chunk", [timedelta(hours=6), timedelta(minutes=7)])
def test_rollup_rows_equal_raw_aggregates(engine: Engine, chunk: timedelta) -> None:
    write_fixture(engine)
    now = END + timedelta(hours=2)

    upserted = update_rollups(engine, now=now, chunk=chunk)

    # Minutes are complete 120 s (the lateness) after they end; hours once their minutes
    # are final, which is another lateness after the minute watermark.
    watermarks = {
        60: floor_time(now - timedelta(seconds=120), 60),
        3600: floor_time(now - timedelta(seconds=240), 3600),
    }
    minutes = expected_rows(engine, 60, watermarks[60])
    hours = expected_rows(engine, 3600, watermarks[3600])
    assert upserted == {60: len(minutes), 3600: len(hours)}
    assert_rows_equal(rollup_rows(engine, 60), minutes)
    assert_rows_equal(rollup_rows(engine, 3600), hours)
    with engine.connect() as connection:
        assert read_watermarks(connection) == watermarks


@pytest.mark.parametrize("rolled_up_to", [END + timedelta(hours=1), T0 + timedelta(minutes=100)])
def test_queries_give_the_same_answer_with_and_without_rollups(
    engine: Engine, rolled_up_to: datetime
) -> None:
    # Rolled up to the end, or only part way (hourly rollup, then minutes, then raw samples).
    project = write_fixture(engine)
    update_rollups(engine, now=rolled_up_to)

    assert_same_with_and_without_rollups(engine, project)


def test_queries_read_the_rollups(engine: Engine) -> None:
    project = write_fixture(engine)
    update_rollups(engine, now=END + timedelta(hours=1))
    query: dict[str, Any] = {
        "start": T0 + timedelta(seconds=17),
        "end": END,
        "step_s": 600,
        "aggregation": Aggregation.AVG,
    }
    before = results(engine, project, use_rollups=False, **query)

    # Raw samples the rollups cover are gone; only the unaligned head must stay raw.
    with engine.begin() as connection:
        connection.execute(delete(samples).where(samples.c.ts >= T0 + timedelta(minutes=1)))

    after = results(engine, project, use_rollups=True, **query)
    assert [labels for labels, _ in after] == [labels for labels, _ in before]
    for (_, got), (_, want) in zip(after, before, strict=True):
        assert got == [(ts, pytest.approx(value)) for ts, value in want]


def test_rerun_is_idempotent(engine: Engine) -> None:
    write_fixture(engine)
    now = END + timedelta(hours=1)
    update_rollups(engine, now=now)
    first = rollup_rows(engine, 60), rollup_rows(engine, 3600)

    again = update_rollups(engine, now=now)

    assert (rollup_rows(engine, 60), rollup_rows(engine, 3600)) == first
    # Only the recompute window before the minute watermark is read again.
    assert again == {60: 0, 3600: 0}


def test_only_complete_buckets_are_rolled_up(engine: Engine) -> None:
    write_fixture(engine)
    hour = datetime(2024, 3, 1, 22, tzinfo=UTC)

    # 23:01:30 - 120 s: minutes before 22:59 are complete; 22:57 and 22:58 may still change,
    # so the hour 22:00-23:00 is not final.
    update_rollups(engine, now=datetime(2024, 3, 1, 23, 1, 30, tzinfo=UTC), lateness_s=120)
    watermark = datetime(2024, 3, 1, 22, 59, tzinfo=UTC)
    assert max(row[1] for row in rollup_rows(engine, 60)) == watermark - timedelta(minutes=1)
    assert_rows_equal(rollup_rows(engine, 60), expected_rows(engine, 60, watermark))
    assert rollup_rows(engine, 3600) == []

    update_rollups(engine, now=datetime(2024, 3, 1, 23, 3, 59, tzinfo=UTC), lateness_s=120)
    assert rollup_rows(engine, 3600) == []
    update_rollups(engine, now=datetime(2024, 3, 1, 23, 4, tzinfo=UTC), lateness_s=120)
    assert_rows_equal(rollup_rows(engine, 3600), expected_rows(engine, 3600, hour.replace(hour=23)))


def test_late_sample_within_lateness_is_picked_up(engine: Engine) -> None:
    project = write_fixture(engine)
    now = T0 + timedelta(minutes=90)
    update_rollups(engine, now=now)
    watermark = floor_time(now - timedelta(seconds=120), 60)

    # Arrives after its bucket was rolled up, but within the lateness before the watermark.
    write_one(engine, project, 0, watermark - timedelta(seconds=0.5), 1000.0)
    update_rollups(engine, now=now + timedelta(seconds=30))

    assert_rows_equal(rollup_rows(engine, 60), expected_rows(engine, 60, watermark))
    assert max(row[5] for row in rollup_rows(engine, 60)) == 1000.0
    assert_same_with_and_without_rollups(engine, project)


def test_late_minute_reaches_the_hourly_rollup(engine: Engine) -> None:
    project = write_fixture(engine)
    # 00:01:30: minutes are rolled up to 23:59, the hour 23:00 not yet (23:57-23:58 may change).
    update_rollups(engine, now=datetime(2024, 3, 2, 0, 1, 30, tzinfo=UTC))
    write_one(engine, project, 1, datetime(2024, 3, 1, 23, 58, 30, 500_000, tzinfo=UTC), 1000.0)
    update_rollups(engine, now=datetime(2024, 3, 2, 0, 5, tzinfo=UTC))

    hour = datetime(2024, 3, 1, 23, tzinfo=UTC)
    (rolled,) = [row for row in rollup_rows(engine, 3600) if row[1] == hour and row[5] == 1000]
    (wanted,) = [
        row for row in expected_rows(engine, 3600, END) if row[1] == hour and row[5] == 1000
    ]
    assert_rows_equal([rolled], [wanted])


def test_a_new_engine_continues_from_the_stored_watermark(
    engine: Engine, database_url: str
) -> None:
    write_fixture(engine)
    update_rollups(engine, now=T0 + timedelta(minutes=75))
    with engine.connect() as connection:
        watermarks = read_watermarks(connection)
    engine.dispose()

    restarted = make_engine(database_url)
    try:
        with restarted.connect() as connection:
            assert read_watermarks(connection) == watermarks
        later = update_rollups(restarted, now=END + timedelta(hours=1))
    finally:
        restarted.dispose()

    # Nothing repeated but the recompute window (the lateness before the old watermark),
    # nothing lost: the result is the same as one pass over everything.
    minutes = expected_rows(engine, 60, END)
    redone = watermarks[60] - timedelta(seconds=120)
    assert later[60] == len([row for row in minutes if row[1] >= redone])
    assert_rows_equal(rollup_rows(engine, 60), minutes)


def test_hourly_rollups_are_read_from_the_index_alone(engine: Engine) -> None:
    write_fixture(engine)
    update_rollups(engine, now=END + timedelta(hours=1))
    if engine.dialect.name != "postgresql":
        return  # SQLite has no visibility map nor INCLUDE: nothing to check
    with engine.begin() as connection:
        # What a large table gets: one range scan per series (tuneloop_series reads these).
        connection.execute(text("SET LOCAL enable_seqscan = off"))
        connection.execute(text("SET LOCAL enable_bitmapscan = off"))
        (plan,) = connection.execute(
            text(
                "EXPLAIN (ANALYZE, FORMAT JSON) "
                "SELECT bucket, count, sum, min, max FROM samples_1h "
                "WHERE series_id = (SELECT min(series_id) FROM samples_1h) AND bucket >= :t0"
            ),
            {"t0": T0},
        ).scalar_one()
    scan = plan["Plan"]
    assert (scan["Node Type"], scan["Index Name"]) == ("Index Only Scan", "pk_samples_1h")
    assert scan["Actual Rows"] == 3 and scan["Heap Fetches"] == 0  # the pass vacuumed it


def test_empty_store_stores_no_watermark(engine: Engine) -> None:
    assert update_rollups(engine, now=END) == {60: 0, 3600: 0}
    with engine.connect() as connection:
        assert read_watermarks(connection) == {}


def test_bad_arguments_raise_value_error(engine: Engine) -> None:
    with pytest.raises(ValueError, match="naive datetime"):
        update_rollups(engine, now=datetime(2024, 3, 1))
    with pytest.raises(ValueError, match="lateness_s must be >= 0"):
        update_rollups(engine, now=END, lateness_s=-1)
    with pytest.raises(ValueError, match="chunk must be at least one minute"):
        update_rollups(engine, now=END, chunk=timedelta(seconds=30))
