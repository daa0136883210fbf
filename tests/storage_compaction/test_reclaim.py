"""PostgreSQL gives the disk back: a compaction pass truncates the ``samples`` partitions it
emptied, and every read answers as before; a partition that got a row meanwhile, even while
the pass waited for its lock, is kept whole; a busy partition is left to the next pass."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, Engine, func, insert, select, text

from tests.storage_compaction.fleet import NOW, T, counts, every_read, fleet, make_project, write
from tuneloop.storage.models import Series, samples
from tuneloop.storage.timeseries.compaction import compact
from tuneloop.storage.timeseries.partitions import ensure_partitions, partition_name
from tuneloop.storage.timeseries.reclaim import reclaim_partitions

pytestmark = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)

DAY = partition_name(T)
"""The fleet's partition: closed at ``NOW``."""
LATE = T + timedelta(minutes=30, seconds=1)


def size(engine: Engine, name: str = DAY) -> int:
    with engine.connect() as connection:
        found = connection.execute(
            text("SELECT pg_total_relation_size(to_regclass(:name))"), {"name": name}
        ).scalar_one()
    return int(found)


def empty_size(engine: Engine) -> int:
    """What a partition that never held a row takes."""
    future = datetime(2030, 1, 1, tzinfo=UTC)
    with engine.begin() as connection:
        ensure_partitions(connection, future, future, 1)
    return size(engine, partition_name(future))


def insert_late(connection: Connection) -> None:
    """A late sample for the first series, written in the caller's transaction."""
    first = connection.execute(select(func.min(Series.id))).scalar_one()
    connection.execute(insert(samples).values(series_id=first, ts=LATE, value=55.0))


def test_compacting_a_closed_day_truncates_its_partition(engine: Engine) -> None:
    project = make_project(engine)
    write(engine, project, fleet())
    before = every_read(engine, project)
    full = size(engine)
    lines: list[str] = []

    report = compact(
        engine, hot_window=timedelta(0), now=NOW, after_rollups=False, progress=lines.append
    )

    assert report.partitions_reclaimed == 1
    assert any(line.startswith(f"reclaimed {DAY}") for line in lines), lines
    assert size(engine) == empty_size(engine) < full
    assert every_read(engine, project) == before
    again = compact(engine, hot_window=timedelta(0), now=NOW, after_rollups=False)
    assert again.partitions_reclaimed == 0  # nothing left to give back: no lock taken
    with engine.begin() as connection:  # the truncated partition takes new rows as before
        insert_late(connection)
    assert counts(engine)[0] == 1


def test_a_sample_written_during_the_pass_keeps_its_partition(engine: Engine) -> None:
    project = make_project(engine)
    write(engine, project, fleet())
    lines: list[str] = []

    def progress(line: str) -> None:
        lines.append(line)
        if "series done" in line:  # every span compacted; the partition not reclaimed yet
            with engine.begin() as connection:
                insert_late(connection)

    report = compact(
        engine, hot_window=timedelta(0), now=NOW, after_rollups=False, progress=progress
    )

    assert report.partitions_reclaimed == 0
    assert f"{DAY} got samples during this pass: kept, the next pass compacts them" in lines
    assert counts(engine)[0] == 1 and size(engine) > empty_size(engine)
    report = compact(engine, hot_window=timedelta(0), now=NOW, after_rollups=False)
    assert (report.late_samples_merged, report.partitions_reclaimed) == (1, 1)
    assert size(engine) == empty_size(engine)


def test_a_row_committed_while_waiting_for_the_lock_keeps_the_partition(engine: Engine) -> None:
    write(engine, make_project(engine), fleet())
    # The fleet's hours compacted, its day not closed yet: an empty partition, not reclaimed.
    report = compact(
        engine, hot_window=timedelta(0), now=T + timedelta(hours=4), after_rollups=False
    )
    assert report.partitions_reclaimed == 0 and counts(engine)[0] == 0
    lines: list[str] = []
    reclaimed: list[str] = []

    with engine.connect() as writer, engine.connect() as watcher:
        writer.begin()
        insert_late(writer)  # not committed: the first look sees no row, the lock waits
        with engine.connect() as connection:
            thread = threading.Thread(
                target=lambda: reclaimed.extend(
                    reclaim_partitions(
                        connection, NOW, lines.append, lock_timeout=timedelta(seconds=60)
                    )
                )
            )
            thread.start()
            waiting = text(
                "SELECT count(*) FROM pg_locks WHERE relation = to_regclass(:name) AND NOT granted"
            )
            deadline = time.monotonic() + 30
            while not watcher.execute(waiting, {"name": DAY}).scalar_one():
                watcher.rollback()
                assert time.monotonic() < deadline, "the reclaim never waited for the lock"
                time.sleep(0.01)
            writer.commit()
            thread.join(timeout=60)

    assert reclaimed == []
    assert lines == [f"{DAY} got samples during this pass: kept, the next pass compacts them"]
    assert counts(engine)[0] == 1


def test_a_busy_partition_is_left_to_the_next_pass(engine: Engine) -> None:
    project = make_project(engine)
    write(engine, project, fleet())
    before = every_read(engine, project)
    lines: list[str] = []

    with engine.connect() as reader:
        reader.begin()
        reader.execute(text(f'LOCK TABLE "{DAY}" IN ACCESS SHARE MODE'))  # a long read
        report = compact(
            engine, hot_window=timedelta(0), now=NOW, after_rollups=False, progress=lines.append
        )
        reader.rollback()

    assert report.partitions_reclaimed == 0
    assert f"{DAY} is in use: not reclaimed now, the next pass retries" in lines
    assert size(engine) > empty_size(engine)
    assert every_read(engine, project) == before
    retry = compact(engine, hot_window=timedelta(0), now=NOW, after_rollups=False)
    assert retry.partitions_reclaimed == 1 and size(engine) == empty_size(engine)
