"""Giving the disk back after compaction.

PostgreSQL: compaction deletes the rows it compacted, but a plain ``VACUUM`` never shrinks the
``(series_id, ts)`` index and truncates the heap only when it gets its lock at once, and new
rows go to today's partition: the space would stay taken until retention dropped the partition.
So a ``samples`` partition entirely before the compaction cutoff that holds no row any more is
``TRUNCATE``\\ d, which gives its files back at once. The check and the truncation run in one
transaction under the partition's ``ACCESS EXCLUSIVE`` lock: a row that arrived meanwhile keeps
the partition whole, and a crash at any point leaves it either whole or empty.

SQLite reuses the pages freed by compaction for new rows, so the file stops growing, but it
shrinks only when rebuilt by ``VACUUM`` (``auto_vacuum`` is off, SQLite's default), which
:func:`vacuum_sqlite` runs on demand (``tuneloop store compact --vacuum``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, cast

import psycopg
from psycopg import errors, sql
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import OperationalError

from tuneloop.storage.timeseries.partitions import execute_composed, list_partitions

RECLAIM_LOCK_TIMEOUT = timedelta(seconds=2)
"""How long to wait for a partition's lock. Longer than PostgreSQL's default
``deadlock_timeout`` (1 s), after which an autovacuum holding the partition, likely right after
compaction's deletes, cancels itself for the waiter; short enough that readers queued behind the
request wait little. A busy partition is left to the next pass."""

_SIZE_SQL = text(
    """
    SELECT pg_total_relation_size(r) AS total,
           (SELECT count(*) FROM pg_catalog.pg_index WHERE indrelid = r)
               * current_setting('block_size')::bigint AS empty
    FROM to_regclass(:name) AS r
    """
)
"""A partition's bytes, and what it holds empty: a metapage per (btree) index, no heap."""


def reclaim_partitions(
    connection: Connection,
    before: datetime,
    say: Callable[[str], None],
    *,
    lock_timeout: timedelta = RECLAIM_LOCK_TIMEOUT,
) -> list[str]:
    """Truncate every ``samples`` partition ending at or before ``before`` that takes more than
    its empty size and holds no row; return the names truncated. Call it outside a transaction,
    once compaction has compacted everything before ``before``. A no-op on SQLite."""
    if connection.dialect.name != "postgresql":
        return []
    reclaimed = []
    with connection.begin():
        candidates = [
            p.name for p in list_partitions(connection) if p.upper is not None and p.upper <= before
        ]
    for name in candidates:
        with connection.begin():
            total, empty = connection.execute(_SIZE_SQL, {"name": name}).one()
            # Unlocked first: the common cases (already empty, or late rows) take no lock. On
            # a partition just emptied this reads its dead heap once (a sequential scan, far
            # cheaper than the compaction that preceded it) and prunes its pages, so the same
            # check under the lock is quick and readers wait little.
            truncated = total > empty and not _has_rows(connection, name)
        if total <= empty:
            continue
        try:
            if truncated:
                with connection.begin():
                    truncated = _truncate_if_empty(connection, name, lock_timeout)
        except (OperationalError, errors.LockNotAvailable) as exc:
            if not isinstance(getattr(exc, "orig", exc), errors.LockNotAvailable):
                raise
            say(f"{name} is in use: not reclaimed now, the next pass retries")
            continue
        if truncated:
            reclaimed.append(name)
            say(f"reclaimed {name}: {(total - empty) / (1 << 20):,.1f} MiB given back")
        else:
            # Rows in a partition compaction has passed were written during the pass (late
            # samples, or a series created meanwhile): the next pass compacts them, then
            # reclaims the partition. Never truncated with a row in it.
            say(f"{name} got samples during this pass: kept, the next pass compacts them")
    return reclaimed


def _truncate_if_empty(connection: Connection, name: str, lock_timeout: timedelta) -> bool:
    milliseconds = max(1, int(lock_timeout / timedelta(milliseconds=1)))
    connection.execute(
        text("SELECT set_config('lock_timeout', :value, true)"), {"value": f"{milliseconds}ms"}
    )
    table = sql.Identifier(name)
    execute_composed(connection, sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(table))
    # Again under the lock: a late sample committed since the first look keeps the partition.
    if _has_rows(connection, name):
        return False
    # TRUNCATE is not MVCC-safe: a REPEATABLE READ transaction whose snapshot predates this
    # pass would see the partition empty rather than its old rows. tuneloop's readers are
    # single READ COMMITTED statements, and the rows live on in the chunks (docs/storage.md).
    execute_composed(connection, sql.SQL("TRUNCATE TABLE {}").format(table))
    return True


def _has_rows(connection: Connection, name: str) -> bool:
    driver = cast("psycopg.Connection[Any]", connection.connection.driver_connection)
    statement = sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(sql.Identifier(name))
    with driver.cursor() as cursor:
        row = cursor.execute(statement).fetchone()
    return bool(row and row[0])


def vacuum_sqlite(engine: Engine, say: Callable[[str], None]) -> int:
    """Rebuild a SQLite file without its free pages (``VACUUM``: it rewrites the whole file and
    blocks writers meanwhile), then checkpoint the WAL so the file itself shrinks; return the
    bytes given back. A no-op elsewhere."""
    if engine.dialect.name != "sqlite":
        return 0
    # VACUUM cannot run in a transaction.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        before = _sqlite_bytes(connection)
        say(f"vacuuming: rewriting {before / (1 << 20):,.1f} MiB")
        connection.exec_driver_sql("VACUUM")
        # In WAL mode the rebuilt pages go to the WAL: the file shrinks at the checkpoint.
        connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        freed = before - _sqlite_bytes(connection)
    say(f"vacuumed: {freed / (1 << 20):,.1f} MiB given back")
    return freed


def _sqlite_bytes(connection: Connection) -> int:
    pages = connection.exec_driver_sql("PRAGMA page_count").scalar_one()
    return int(pages) * int(connection.exec_driver_sql("PRAGMA page_size").scalar_one())
