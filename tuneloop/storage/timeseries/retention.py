"""Retention: forget raw samples, their compacted chunks and rollups older than their
configured age.

Raw samples are cut at a partition boundary on both backends, so PostgreSQL (which drops whole
partitions, never deleting rows one by one) and SQLite (which deletes rows) keep exactly the same
data. A chunk never straddles a partition (its span divides a day), so the chunks' partitions,
which share the samples' bounds, go with them. Rollup rows are cut at
``now - rollup_retention_days`` exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Engine, delete

from tuneloop.storage.models import ROLLUP_TABLES, sample_chunks, samples
from tuneloop.storage.timeseries.partitions import (
    CHUNKS_TABLE,
    drop_partitions_before,
    partition_start,
)


@dataclass(slots=True)
class RetentionResult:
    samples_cutoff: datetime
    """Raw samples before this instant are gone (a partition boundary)."""
    rollup_cutoff: datetime
    dropped_partitions: list[str] = field(default_factory=list)
    """PostgreSQL: the partitions of ``samples`` dropped. Always empty on SQLite."""
    dropped_chunk_partitions: list[str] = field(default_factory=list)
    """PostgreSQL: the partitions of ``sample_chunks`` dropped. Always empty on SQLite."""
    samples_deleted: int = 0
    """SQLite: raw rows deleted. Always 0 on PostgreSQL, where partitions are dropped instead."""
    chunks_deleted: int = 0
    """SQLite: chunk rows deleted. Always 0 on PostgreSQL."""
    rollup_rows_deleted: dict[str, int] = field(default_factory=dict)
    """Rows deleted per rollup table name."""


def samples_cutoff(now: datetime, retention_days: int, partition_days: int) -> datetime:
    """The partition boundary at or before ``now - retention_days``: everything older goes.

    Rounding down keeps a little more than ``retention_days``, never less.
    """
    if retention_days < 1:
        raise ValueError(f"retention_days must be >= 1, got {retention_days}")
    return partition_start(now - timedelta(days=retention_days), partition_days)


def apply_retention(
    engine: Engine,
    *,
    now: datetime,
    retention_days: int,
    rollup_retention_days: int,
    partition_days: int,
) -> RetentionResult:
    """Drop raw samples and rollup rows past their retention. Idempotent."""
    if rollup_retention_days < 1:
        raise ValueError(f"rollup_retention_days must be >= 1, got {rollup_retention_days}")
    result = RetentionResult(
        samples_cutoff=samples_cutoff(now, retention_days, partition_days),
        rollup_cutoff=now - timedelta(days=rollup_retention_days),
    )
    # Raw samples in a transaction of their own: dropping a partition locks ``samples``
    # exclusively, and that lock should not wait on the rollup deletes.
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            cutoff = result.samples_cutoff
            result.dropped_partitions = drop_partitions_before(connection, cutoff)
            result.dropped_chunk_partitions = drop_partitions_before(
                connection, cutoff, CHUNKS_TABLE
            )
        else:
            deleted = connection.execute(
                delete(samples).where(samples.c.ts < result.samples_cutoff)
            )
            result.samples_deleted = deleted.rowcount
            deleted = connection.execute(
                delete(sample_chunks).where(sample_chunks.c.start_ts < result.samples_cutoff)
            )
            result.chunks_deleted = deleted.rowcount
    with engine.begin() as connection:
        for table in ROLLUP_TABLES.values():
            deleted = connection.execute(delete(table).where(table.c.bucket < result.rollup_cutoff))
            result.rollup_rows_deleted[table.name] = deleted.rowcount
    return result
