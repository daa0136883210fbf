"""Migration 0010 removes the duplicate samples a crashed replay had stored (one row kept per
``(series_id, ts)``) and makes ``ix_samples_series_ts`` unique, on every partition, those
created later included; and back. Duplicates are written at revision 0009 the way the writer
then stored them, on real SQLite and real PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, inspect, text
from sqlalchemy.exc import IntegrityError

from tests.helpers import stored_totals
from tests.storage.test_writer import batch, make_project, stored
from tuneloop.storage import make_engine, migrate
from tuneloop.storage.timeseries.writer import SampleWriter

BOTH = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]
LATER = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)  # a partition that exists only after 0010


def unique_index(engine: Engine) -> bool:
    with engine.connect() as connection:
        (index,) = [
            index
            for index in inspect(connection).get_indexes("samples")
            if index["name"] == "ix_samples_series_ts"
        ]
    return bool(index["unique"])


def partitions_without_unique_index(engine: Engine) -> list[str]:
    """Partitions of ``samples`` with no unique index on (series_id, ts)."""
    with engine.connect() as connection:
        return list(
            connection.execute(
                text(
                    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                    " WHERE i.inhparent = 'samples'::regclass AND NOT EXISTS ("
                    "  SELECT 1 FROM pg_index x WHERE x.indrelid = c.oid AND x.indisunique"
                    "  AND pg_get_indexdef(x.indexrelid) LIKE '%(series_id, ts)%')"
                )
            ).scalars()
        )


@pytest.mark.parametrize("empty_database_url", BOTH, indirect=True)
def test_upgrade_keeps_one_row_per_series_and_time_and_makes_the_index_unique(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    migrate.upgrade(url, "0009")
    engine = make_engine(url)
    try:
        project = make_project(engine)
        writer = SampleWriter(engine)
        batches = [batch(gpu=str(gpu), count=5) for gpu in range(2)]
        writer.write(project, batches)
        writer.write(project, batches)  # the replay after a crash, as 0009 stored it
        writer.write(project, [batch(gpu="0", count=2)])  # three times for some
        assert stored_totals(engine)[:3:2] == (22, 10)
        distinct = sorted(set(stored(engine)))
        assert not unique_index(engine)

        migrate.upgrade(url, "0010")

        assert stored(engine) == distinct and len(distinct) == 10
        assert stored_totals(engine)[2] == 0
        assert unique_index(engine)
        writer.forget()
        result = writer.write(project, [*batches, batch(start=LATER)])
        assert (result.samples_written, result.samples_duplicate) == (13, 10)
        assert len(stored(engine)) == 13
        if engine.dialect.name == "postgresql":
            assert partitions_without_unique_index(engine) == []
    finally:
        engine.dispose()


@pytest.mark.parametrize("empty_database_url", BOTH, indirect=True)
def test_downgrade_makes_the_index_plain_again(empty_database_url: str) -> None:
    url = empty_database_url
    migrate.upgrade(url)
    engine = make_engine(url)
    try:
        project = make_project(engine)
        SampleWriter(engine).write(project, [batch(count=1, start=LATER - timedelta(days=1))])
        with pytest.raises(IntegrityError), engine.begin() as connection:
            connection.execute(text("INSERT INTO samples SELECT * FROM samples"))

        migrate.downgrade(url, "0009")

        assert not unique_index(engine)
        with engine.begin() as connection:
            connection.execute(text("INSERT INTO samples SELECT * FROM samples"))
        assert stored_totals(engine)[2] == 1
    finally:
        engine.dispose()
