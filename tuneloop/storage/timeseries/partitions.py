"""Daily (or ``partition_days``-wide) range partitions of ``samples`` and ``sample_chunks`` on
PostgreSQL.

Partitions are aligned to UTC midnight of epoch-day multiples of ``partition_days`` and named
``samples_pYYYYMMDD`` (``sample_chunks_pYYYYMMDD``) after their lower bound, so every process
computes the same layout, and a chunk (never wider than a day, aligned) always falls in the
partition its samples had.
Identifiers and bounds are built only from dates, and quoted by ``psycopg.sql``. There is no
default partition: a row without a partition fails loudly instead of piling up somewhere that
retention never drops. On SQLite every function here is a no-op.

Creating or dropping a partition locks ``samples`` exclusively: run these in short transactions
of their own, before (never after) writing samples in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import psycopg
from psycopg import sql
from sqlalchemy import Connection, text

from tuneloop.storage.locks import LockName, advisory_lock
from tuneloop.storage.types import to_micros

PARENT_TABLE = "samples"
NAME_PREFIX = "samples_p"
CHUNKS_TABLE = "sample_chunks"
CHUNKS_PREFIX = "sample_chunks_p"
_PREFIXES = {PARENT_TABLE: NAME_PREFIX, CHUNKS_TABLE: CHUNKS_PREFIX}

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DAY_US = 86_400 * 1_000_000
# Guards against a stray timestamp (year 1 or 9999) turning into thousands of DDL statements.
MAX_PARTITIONS_PER_CALL = 1_000

_BOUND_PATTERN = r"FROM \('([^']*)'\) TO \('([^']*)'\)"
_LIST_SQL = text(
    """
    SELECT c.relname AS name,
           (m.bounds[1])::timestamptz AS lower,
           (m.bounds[2])::timestamptz AS upper
    FROM pg_catalog.pg_inherits AS i
    JOIN pg_catalog.pg_class AS c ON c.oid = i.inhrelid
    CROSS JOIN LATERAL (
        SELECT regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid), :pattern) AS bounds
    ) AS m
    WHERE i.inhparent = to_regclass(:parent)
    ORDER BY lower NULLS FIRST, c.relname
    """
)


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition of ``samples``. ``lower``/``upper`` are ``None`` only for a partition this
    module did not create (``MINVALUE``/``MAXVALUE`` bounds or a default partition)."""

    name: str
    lower: datetime | None
    upper: datetime | None


def partition_start(ts: datetime, partition_days: int) -> datetime:
    """Lower bound of the partition holding ``ts`` (``ts`` must be timezone-aware)."""
    return _EPOCH + timedelta(days=partition_index(ts, partition_days) * partition_days)


def partition_index(ts: datetime, partition_days: int) -> int:
    """Number of the partition holding ``ts``, counted in ``partition_days`` from the epoch."""
    _check_days(partition_days)
    return to_micros(ts) // (_DAY_US * partition_days)


def partition_name(lower: datetime, parent: str = PARENT_TABLE) -> str:
    lower = lower.astimezone(UTC)
    # Zero-padded by hand: strftime's %Y does not pad years below 1000 on every platform.
    return f"{_PREFIXES[parent]}{lower.year:04d}{lower.month:02d}{lower.day:02d}"


def is_postgresql(connection: Connection) -> bool:
    return connection.dialect.name == "postgresql"


def ensure_partitions(
    connection: Connection,
    start: datetime,
    end: datetime,
    partition_days: int,
    parent: str = PARENT_TABLE,
) -> list[str]:
    """Create the missing partitions covering ``[start, end]``; return the names created.

    Safe under concurrent writers: a transaction-level advisory lock serializes the DDL and
    ``IF NOT EXISTS`` makes a repeat harmless. Runs in the caller's transaction.
    """
    # Arguments are checked on every backend so that misuse shows up in SQLite tests too.
    first, last = partition_index(start, partition_days), partition_index(end, partition_days)
    if last < first:
        raise ValueError(f"end {end.isoformat()} is before start {start.isoformat()}")
    if last - first >= MAX_PARTITIONS_PER_CALL:
        raise ValueError(
            f"[{start.isoformat()}, {end.isoformat()}] needs {last - first + 1} partitions, "
            f"more than {MAX_PARTITIONS_PER_CALL} in one call"
        )
    if not is_postgresql(connection):
        return []
    width = timedelta(days=partition_days)
    wanted = [_EPOCH + width * index for index in range(first, last + 1)]
    # Cheap unlocked check first: the common case is "all exist", which then takes no lock.
    if not _missing(connection, wanted, parent):
        return []
    _lock(connection)
    created = []
    for lower in _missing(connection, wanted, parent):
        _create(connection, lower, lower + width, parent)
        created.append(partition_name(lower, parent))
    return created


def ensure_chunk_partitions(connection: Connection, start: datetime, end: datetime) -> list[str]:
    """Create the ``sample_chunks`` partitions with the bounds of the ``samples`` partitions
    meeting ``[start, end)``, so a chunk lands beside its samples and retention drops both
    together whatever ``partition_days`` was when they were written. Runs in the caller's
    transaction; returns the names created."""
    if not is_postgresql(connection):
        return []
    wanted = [
        partition
        for partition in list_partitions(connection)
        if partition.lower is not None
        and partition.upper is not None
        and partition.lower < end
        and partition.upper > start
    ]
    existing = {partition.name for partition in list_partitions(connection, CHUNKS_TABLE)}
    missing = [p for p in wanted if partition_name(p.lower, CHUNKS_TABLE) not in existing]  # type: ignore[arg-type]
    if not missing:
        return []
    _lock(connection)
    created = []
    for partition in missing:
        assert partition.lower is not None and partition.upper is not None
        _create(connection, partition.lower, partition.upper, CHUNKS_TABLE)
        created.append(partition_name(partition.lower, CHUNKS_TABLE))
    return created


def list_partitions(connection: Connection, parent: str = PARENT_TABLE) -> list[PartitionInfo]:
    """Partitions of ``parent`` ordered by lower bound, read from the catalog."""
    if not is_postgresql(connection):
        return []
    rows = connection.execute(_LIST_SQL, {"pattern": _BOUND_PATTERN, "parent": parent})
    return [PartitionInfo(row.name, _utc(row.lower), _utc(row.upper)) for row in rows]


def drop_partitions_before(
    connection: Connection, cutoff: datetime, parent: str = PARENT_TABLE
) -> list[str]:
    """Drop the partitions whose upper bound is ``<= cutoff``; return their names.

    A partition straddling ``cutoff`` is kept whole: rows are never deleted one by one.
    """
    if cutoff.utcoffset() is None:
        raise ValueError("naive datetime: tuneloop timestamps must be timezone-aware")
    if not is_postgresql(connection):
        return []
    _lock(connection)
    dropped = []
    for partition in list_partitions(connection, parent):
        if partition.upper is not None and partition.upper <= cutoff:
            execute_composed(
                connection,
                sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(partition.name)),
            )
            dropped.append(partition.name)
    return dropped


def _utc(value: datetime | None) -> datetime | None:
    # psycopg returns the session TimeZone; tuneloop speaks UTC.
    return None if value is None else value.astimezone(UTC)


def _check_days(partition_days: int) -> None:
    if partition_days < 1:
        raise ValueError(f"partition_days must be >= 1, got {partition_days}")


def _missing(connection: Connection, wanted: list[datetime], parent: str) -> list[datetime]:
    existing = {partition.name for partition in list_partitions(connection, parent)}
    return [lower for lower in wanted if partition_name(lower, parent) not in existing]


def _lock(connection: Connection) -> None:
    advisory_lock(connection, LockName.PARTITIONS)


def _create(connection: Connection, lower: datetime, upper: datetime, parent: str) -> None:
    statement = sql.SQL(
        "CREATE TABLE IF NOT EXISTS {name} PARTITION OF {parent}"
        " FOR VALUES FROM ({lower}) TO ({upper})"
    ).format(
        name=sql.Identifier(partition_name(lower, parent)),
        parent=sql.Identifier(parent),
        # ISO text with an explicit +00:00 offset: the same instant whatever the session TimeZone.
        lower=sql.Literal(lower.astimezone(UTC).isoformat()),
        upper=sql.Literal(upper.astimezone(UTC).isoformat()),
    )
    execute_composed(connection, statement)


def execute_composed(connection: Connection, statement: sql.Composed) -> None:
    # DDL cannot take bind parameters; run the composed statement on the driver connection,
    # which shares the caller's transaction.
    driver = cast("psycopg.Connection[Any]", connection.connection.driver_connection)
    with driver.cursor() as cursor:
        cursor.execute(statement)
