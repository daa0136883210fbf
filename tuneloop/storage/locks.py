"""Database locks, in one place: advisory locks on PostgreSQL under named keys, and SQLite's
write lock taken up front.

Every advisory lock but :func:`session_lock`'s is transaction-level (released at commit or
rollback), and every one is two-keyed, a
namespace from :class:`LockName` and a key within it (a project id, or 0 for a lock of the
whole database), so the locks of different purposes never collide. SQLite has no advisory or
row locks: one writer at a time is its lock, and :func:`hold_write_lock` takes it before a
transaction reads what it is about to write.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, text
from sqlalchemy.orm import Session


class LockName(enum.IntEnum):
    """The namespaces of the advisory locks; each value spells its name in ASCII."""

    MIGRATIONS = 0x746C4D47  # "tlMG": one process migrates at a time (one-key form, below)
    PARTITIONS = 0x746C5054  # "tlPT": the time-series partitions' DDL
    ROLLUPS = 0x746C5255  # "tlRU": one rollup pass at a time, so upserts cannot deadlock
    COMPACTION = 0x746C434B  # "tlCK": one compaction pass at a time over the sample chunks
    SERIES = 0x746C5352  # "tlSR": a project's series creation, keyed by project id
    ALERT_EVALUATION = 0x616C7274  # "alrt": one evaluator per project, keyed by project id


def advisory_lock(
    connection: Connection | Session,
    name: LockName,
    key: int | None = 0,
    *,
    wait: bool = True,
) -> bool:
    """Hold the advisory lock ``(name, key)`` until the transaction ends; with ``wait=False``
    return at once whether it was free. ``key=None`` takes the one-key lock ``name``, as
    migrations always have. True, a no-op, on any database but PostgreSQL."""
    if _dialect(connection) != "postgresql":
        return True
    function = "pg_advisory_xact_lock" if wait else "pg_try_advisory_xact_lock"
    if key is None:
        statement, params = f"SELECT {function}(:name)", {"name": int(name)}
    else:
        statement, params = f"SELECT {function}(:name, :key)", {"name": int(name), "key": key}
    acquired = connection.execute(text(statement), params).scalar_one()
    # pg_advisory_xact_lock returns void: that it returned means it holds the lock.
    return True if wait else bool(acquired)


@contextmanager
def session_lock(connection: Connection, name: LockName, key: int = 0) -> Iterator[bool]:
    """Try the session-level advisory lock ``(name, key)`` for the ``with`` block, across the
    transactions run in it; yields whether it was free (always True but on PostgreSQL). For
    work that commits as it goes, where a transaction-level lock would end with the first
    commit. Call it outside a transaction."""
    if connection.dialect.name != "postgresql":
        yield True
        return
    params = {"name": int(name), "key": key}
    with connection.begin():
        acquired = bool(
            connection.execute(text("SELECT pg_try_advisory_lock(:name, :key)"), params).scalar()
        )
    try:
        yield acquired
    finally:
        if acquired:
            if connection.in_transaction():
                connection.rollback()
            with connection.begin():
                connection.execute(text("SELECT pg_advisory_unlock(:name, :key)"), params)


def hold_write_lock(connection: Connection | Session) -> None:
    """On SQLite, take the database's write lock now (waiting up to busy_timeout) rather than
    at the transaction's first write: a transaction that reads and then writes fails at once
    ("database is locked") whenever another connection committed in between, which a busy
    write pipeline does many times a second. A no-op elsewhere, and once a transaction holds
    the lock."""
    bind = connection.connection() if isinstance(connection, Session) else connection
    if bind.dialect.name != "sqlite":
        return
    driver = bind.connection.driver_connection
    # The sqlite3 driver opens a transaction at the first write, which takes the lock; one
    # already open has written, so it holds the lock already.
    if not getattr(driver, "in_transaction", False):
        bind.exec_driver_sql("BEGIN IMMEDIATE")


def _dialect(connection: Connection | Session) -> str:
    bind = connection.get_bind() if isinstance(connection, Session) else connection
    return bind.dialect.name
