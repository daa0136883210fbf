"""Database locks: a named advisory lock excludes a second holder on PostgreSQL until the
first transaction ends; SQLite's write lock is taken up front, so a second writer waits."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import text

from tuneloop.storage import make_engine
from tuneloop.storage.locks import LockName, advisory_lock, hold_write_lock


@pytest.mark.postgres
def test_a_held_advisory_lock_is_refused_to_another_transaction_until_commit(
    postgres_server_url: str,
) -> None:
    engine = make_engine(postgres_server_url)
    try:
        with engine.connect() as first, engine.connect() as second:
            with first.begin():
                assert advisory_lock(first, LockName.ALERT_EVALUATION, 7)
                assert not advisory_lock(second, LockName.ALERT_EVALUATION, 7, wait=False)
                second.rollback()
                # Another key, or the same number under another name, is another lock.
                assert advisory_lock(second, LockName.ALERT_EVALUATION, 8, wait=False)
                assert advisory_lock(second, LockName.SERIES, 7, wait=False)
                second.rollback()
            assert advisory_lock(second, LockName.ALERT_EVALUATION, 7, wait=False)
            second.rollback()
    finally:
        engine.dispose()


def test_advisory_locks_are_no_ops_on_sqlite(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/locks.db")
    try:
        with engine.connect() as connection:
            assert advisory_lock(connection, LockName.MIGRATIONS, key=None)
    finally:
        engine.dispose()


def test_sqlite_write_lock_is_taken_before_the_first_write(tmp_path: Path) -> None:
    path = f"{tmp_path}/write.db"
    engine = make_engine(f"sqlite:///{path}")
    try:
        with engine.begin() as setup:
            setup.execute(text("CREATE TABLE t (x INTEGER)"))
        with engine.connect() as writer:
            hold_write_lock(writer)
            hold_write_lock(writer)  # held already: nothing more to do
            other = sqlite3.connect(path, timeout=0)
            try:
                with pytest.raises(sqlite3.OperationalError, match="locked"):
                    other.execute("INSERT INTO t VALUES (1)")
            finally:
                other.close()
            writer.rollback()
    finally:
        engine.dispose()
