"""Retention forgets chunks with their samples (PostgreSQL: by dropping the chunks' partition,
never deleting a row), and migration 0013 takes a store written before it to one whose
compaction keeps every answer."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine, func, inspect, select

from tests.storage_compaction.fleet import NOW, T, counts, every_read, fleet, make_project, write
from tuneloop.storage import make_engine, migrate
from tuneloop.storage.models import sample_chunks
from tuneloop.storage.timeseries.compaction import compact
from tuneloop.storage.timeseries.partitions import CHUNKS_TABLE, list_partitions
from tuneloop.storage.timeseries.retention import apply_retention


def test_retention_forgets_old_chunks_with_their_samples(engine: Engine) -> None:
    project = make_project(engine)
    old, recent = fleet(start=T - timedelta(days=3), hours=2), fleet(start=T, hours=2)
    write(engine, project, [*old, *recent])
    compact(engine, hot_window=timedelta(0), now=NOW, after_rollups=False)
    assert counts(engine)[:2] == (0, 48)
    with engine.connect() as connection:
        chunk_partitions = [p.name for p in list_partitions(connection, CHUNKS_TABLE)]

    result = apply_retention(
        engine,
        now=T + timedelta(hours=1),
        retention_days=2,
        rollup_retention_days=30,
        partition_days=1,
    )

    assert counts(engine)[:2] == (0, 24)
    with engine.connect() as connection:
        first = connection.execute(select(func.min(sample_chunks.c.start_ts))).scalar_one()
        left = [p.name for p in list_partitions(connection, CHUNKS_TABLE)]
    assert first == T
    if engine.dialect.name == "postgresql":
        assert chunk_partitions == ["sample_chunks_p20261117", "sample_chunks_p20261120"]
        assert result.dropped_chunk_partitions == ["sample_chunks_p20261117"]
        assert left == ["sample_chunks_p20261120"]
    else:
        assert result.chunks_deleted == 24


@pytest.mark.parametrize("empty_database_url", ["sqlite", "postgresql"], indirect=True)
def test_the_migration_converts_a_populated_store(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url, "0012")
    engine = make_engine(empty_database_url)
    try:
        project = make_project(engine)
        write(engine, project, fleet(hours=2))

        migrate.upgrade(empty_database_url)
        before = every_read(engine, project)  # no chunk yet: the reads of revision 0012

        assert "sample_chunks" in inspect(engine).get_table_names()
        migrate.check_up_to_date(empty_database_url)
        lines: list[str] = []
        report = compact(
            engine,
            hot_window=timedelta(0),
            now=NOW,
            after_rollups=False,
            batch_series=5,
            progress=lines.append,
        )
        assert report.chunks_written == 24 and counts(engine)[0] == 0
        assert [line for line in lines if "series done" in line] == [
            f"5 series done: {report.samples_compacted * 5 // 12} samples in 10 chunks so far",
            f"10 series done: {report.samples_compacted * 10 // 12} samples in 20 chunks so far",
            f"12 series done: {report.samples_compacted} samples in 24 chunks so far",
        ]
        assert every_read(engine, project) == before
    finally:
        engine.dispose()
