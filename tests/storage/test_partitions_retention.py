"""Partitions of ``samples`` (PostgreSQL; no-ops on SQLite) and retention on both backends,
which must keep exactly the same rows."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import Engine, func, insert, select, text

from tuneloop.storage.models import ROLLUP_TABLES, Project, Series, samples
from tuneloop.storage.timeseries.partitions import (
    PartitionInfo,
    drop_partitions_before,
    ensure_partitions,
    list_partitions,
    partition_name,
    partition_start,
)
from tuneloop.storage.timeseries.retention import apply_retention, samples_cutoff
from tuneloop.storage.timeseries.types import SeriesBatch
from tuneloop.storage.timeseries.writer import SampleWriter

DAY0 = datetime(2024, 2, 27, tzinfo=UTC)  # 2024 is a leap year: the span crosses Feb 29.
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


def make_project(engine: Engine) -> int:
    with engine.begin() as connection:
        key = connection.execute(insert(Project).values(name="p")).inserted_primary_key
    assert key is not None
    return int(key[0])


def hourly(start: datetime, hours: int, gpu: str = "0") -> SeriesBatch:
    stamps = [start + HOUR * i for i in range(hours)]
    return SeriesBatch("DCGM_FI_DEV_POWER_USAGE", {"gpu": gpu}, stamps, [300.0] * hours)


def partitions(engine: Engine) -> list[PartitionInfo]:
    with engine.connect() as connection:
        return list_partitions(connection)


def names(engine: Engine) -> list[str]:
    return [partition.name for partition in partitions(engine)]


def rows_per_partition(engine: Engine) -> dict[str, int]:
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT tableoid::regclass::text AS name, count(*) AS n FROM samples GROUP BY 1")
        )
        return {row.name: row.n for row in rows}


def sample_count(engine: Engine, before: datetime | None = None) -> int:
    query = select(func.count()).select_from(samples)
    if before is not None:
        query = query.where(samples.c.ts < before)
    with engine.connect() as connection:
        return connection.execute(query).scalar_one()


def is_postgres(engine: Engine) -> bool:
    return engine.dialect.name == "postgresql"


# ------------------------------------------------------------------ layout (pure)


def test_partitions_align_to_epoch_day_multiples() -> None:
    ts = datetime(2024, 3, 1, 17, 30, tzinfo=UTC)
    assert partition_start(ts, 1) == datetime(2024, 3, 1, tzinfo=UTC)
    # 2024-03-01 is epoch day 19783 = 7 * 2826 + 1, so its week began the day before.
    assert partition_start(ts, 7) == datetime(2024, 2, 29, tzinfo=UTC)
    assert partition_start(datetime(1969, 12, 31, 23, tzinfo=UTC), 1) == datetime(
        1969, 12, 31, tzinfo=UTC
    )
    later = datetime(2024, 3, 2, 1, tzinfo=timezone(timedelta(hours=5)))  # 2024-03-01 20:00 UTC
    assert partition_start(later, 1) == datetime(2024, 3, 1, tzinfo=UTC)
    assert partition_name(datetime(2024, 3, 1, tzinfo=UTC)) == "samples_p20240301"
    assert partition_name(datetime(999, 1, 2, tzinfo=UTC)) == "samples_p09990102"


def test_retention_cutoff_is_a_partition_boundary() -> None:
    now = datetime(2024, 3, 10, 15, tzinfo=UTC)
    assert samples_cutoff(now, 2, 1) == datetime(2024, 3, 8, tzinfo=UTC)
    assert samples_cutoff(now, 2, 7) == partition_start(now - 2 * DAY, 7)
    with pytest.raises(ValueError, match="retention_days"):
        samples_cutoff(now, 0, 1)


# ------------------------------------------------------------------ partitions


def test_partitions_are_created_on_demand_across_a_day_boundary(engine: Engine) -> None:
    project = make_project(engine)
    midnight = DAY0 + DAY
    before, after = midnight - timedelta(microseconds=1), midnight
    writer = SampleWriter(engine)
    writer.write(project, [SeriesBatch("m", {}, [before], [1.0])])
    assert names(engine) == (["samples_p20240227"] if is_postgres(engine) else [])
    writer.write(project, [SeriesBatch("m", {}, [after], [2.0])])
    assert sample_count(engine) == 2
    if is_postgres(engine):
        assert partitions(engine) == [
            PartitionInfo("samples_p20240227", DAY0, DAY0 + DAY),
            PartitionInfo("samples_p20240228", DAY0 + DAY, DAY0 + 2 * DAY),
        ]
        assert rows_per_partition(engine) == {"samples_p20240227": 1, "samples_p20240228": 1}


def test_a_write_spanning_three_days_lands_in_three_partitions(engine: Engine) -> None:
    project = make_project(engine)
    result = SampleWriter(engine).write(project, [hourly(DAY0, 72)])
    assert result.samples_written == 72
    if is_postgres(engine):
        expected = ["samples_p20240227", "samples_p20240228", "samples_p20240229"]
        assert names(engine) == expected
        assert rows_per_partition(engine) == dict.fromkeys(expected, 24)
    else:
        assert names(engine) == []


def test_a_stray_old_sample_creates_only_its_own_partition(engine: Engine) -> None:
    project = make_project(engine)
    stamps = [DAY0 - 400 * DAY, DAY0]
    SampleWriter(engine).write(project, [SeriesBatch("m", {}, stamps, [1.0, 2.0])])
    if is_postgres(engine):
        assert names(engine) == ["samples_p20230123", "samples_p20240227"]


def test_week_wide_partitions(engine: Engine) -> None:
    project = make_project(engine)
    SampleWriter(engine, partition_days=7).write(project, [hourly(DAY0, 24 * 3)])
    if is_postgres(engine):
        lower = partition_start(DAY0, 7)
        assert partitions(engine) == [
            PartitionInfo(partition_name(lower), lower, lower + 7 * DAY),
            PartitionInfo(partition_name(lower + 7 * DAY), lower + 7 * DAY, lower + 14 * DAY),
        ]


def test_ensure_partitions_is_idempotent_and_safe_in_parallel(engine: Engine) -> None:
    created: list[list[str]] = []
    barrier = threading.Barrier(4)

    def run() -> None:
        barrier.wait()
        with engine.begin() as connection:
            created.append(ensure_partitions(connection, DAY0, DAY0 + 2 * DAY, 1))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = ["samples_p20240227", "samples_p20240228", "samples_p20240229"]
    if is_postgres(engine):
        assert sorted(name for names_ in created for name in names_) == expected
        assert names(engine) == expected
    else:
        assert created == [[], [], [], []]
    with engine.begin() as connection:
        assert ensure_partitions(connection, DAY0, DAY0 + 2 * DAY, 1) == []
        with pytest.raises(ValueError, match="before start"):
            ensure_partitions(connection, DAY0 + DAY, DAY0, 1)


def test_drop_partitions_before_drops_only_partitions_wholly_before(engine: Engine) -> None:
    with engine.begin() as connection:
        ensure_partitions(connection, DAY0, DAY0 + 3 * DAY, 1)
    with engine.begin() as connection:
        # Mid-partition cutoff: the partition holding it stays whole.
        dropped = drop_partitions_before(connection, DAY0 + DAY + 12 * HOUR)
    if not is_postgres(engine):
        assert dropped == []
        return
    assert dropped == ["samples_p20240227"]
    with engine.begin() as connection:
        # A cutoff exactly on a boundary drops the partition ending there.
        assert drop_partitions_before(connection, DAY0 + 2 * DAY) == ["samples_p20240228"]
        assert drop_partitions_before(connection, DAY0 + 2 * DAY) == []
    assert names(engine) == ["samples_p20240229", "samples_p20240301"]


# ------------------------------------------------------------------ retention


def fill_five_days(engine: Engine) -> int:
    project = make_project(engine)
    SampleWriter(engine).write(project, [hourly(DAY0, 24 * 5, gpu) for gpu in ("0", "1")])
    return project


def insert_rollups(engine: Engine, buckets: list[datetime]) -> None:
    with engine.begin() as connection:
        for table in ROLLUP_TABLES.values():
            connection.execute(
                insert(table),
                [
                    {
                        "series_id": 1,
                        "bucket": bucket,
                        "count": 1,
                        "sum": 1.0,
                        "min": 1.0,
                        "max": 1.0,
                        "last": 1.0,
                        "last_ts": bucket,
                    }
                    for bucket in buckets
                ],
            )


def test_retention_drops_old_partitions_and_nothing_else(engine: Engine) -> None:
    fill_five_days(engine)
    now = DAY0 + 4 * DAY + 15 * HOUR
    insert_rollups(engine, [now - 11 * DAY, now - 10 * DAY, now - 10 * DAY + HOUR, now])
    cutoff = DAY0 + 2 * DAY  # now - 2 days = DAY0 + 2 days 15:00, floored to midnight
    kept_before = sample_count(engine) - sample_count(engine, before=cutoff)
    kept_per_partition = rows_per_partition(engine) if is_postgres(engine) else {}

    result = apply_retention(
        engine, now=now, retention_days=2, rollup_retention_days=10, partition_days=1
    )

    assert result.samples_cutoff == cutoff
    assert result.rollup_cutoff == now - 10 * DAY
    assert sample_count(engine) == kept_before == 2 * 24 * 3
    assert sample_count(engine, before=cutoff) == 0
    assert result.rollup_rows_deleted == {"samples_1m": 1, "samples_1h": 1}
    if is_postgres(engine):
        gone = ["samples_p20240227", "samples_p20240228"]
        assert result.dropped_partitions == gone
        assert result.samples_deleted == 0
        assert names(engine) == ["samples_p20240229", "samples_p20240301", "samples_p20240302"]
        assert rows_per_partition(engine) == {
            name: n for name, n in kept_per_partition.items() if name not in gone
        }
    else:
        assert (result.dropped_partitions, result.samples_deleted) == ([], 2 * 24 * 2)
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(Series)).scalar_one() == 2
    again = apply_retention(
        engine, now=now, retention_days=2, rollup_retention_days=10, partition_days=1
    )
    assert (again.dropped_partitions, again.samples_deleted) == ([], 0)
    assert again.rollup_rows_deleted == {"samples_1m": 0, "samples_1h": 0}


def test_a_writer_recreates_a_partition_dropped_under_it(engine: Engine) -> None:
    project = make_project(engine)
    writer = SampleWriter(engine)
    writer.write(project, [hourly(DAY0, 2)])
    apply_retention(
        engine, now=DAY0 + 5 * DAY, retention_days=1, rollup_retention_days=1, partition_days=1
    )
    assert sample_count(engine) == 0
    # The writer still believes the partition exists; the write must not be lost.
    assert writer.write(project, [hourly(DAY0, 2)]).samples_written == 2
    assert sample_count(engine) == 2
