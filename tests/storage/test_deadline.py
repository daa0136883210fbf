"""Bounded reads on real SQLite and PostgreSQL: a statement stops at its time limit or when
cancelled from another thread, the connection stays usable, and later statements keep the
connection's own limits."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import Engine, text

from tuneloop.storage.deadline import Cancellation, QueryInterrupted, bounded

SQLITE_SLOW = (
    "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 1000000000) "
    "SELECT count(*) FROM c"
)


def slow_statement(engine: Engine) -> str:
    return "SELECT pg_sleep(30)" if engine.dialect.name == "postgresql" else SQLITE_SLOW


def test_a_statement_stops_at_its_time_limit(engine: Engine) -> None:
    with engine.connect() as connection:
        start = time.monotonic()
        with (
            pytest.raises(QueryInterrupted, match=r"ran past its 0\.2 s limit"),
            bounded(connection, 0.2),
        ):
            connection.execute(text(slow_statement(engine))).all()
        assert time.monotonic() - start < 5
        connection.rollback()
        with bounded(connection, 5):
            assert connection.execute(text("SELECT 1")).scalar() == 1


def test_a_cancelled_statement_stops_at_once(engine: Engine) -> None:
    cancellation = Cancellation()
    with engine.connect() as connection:
        timer = threading.Timer(0.2, cancellation.cancel)
        timer.start()
        start = time.monotonic()
        with (
            pytest.raises(QueryInterrupted, match="client went away"),
            bounded(connection, 60, cancellation),
        ):
            connection.execute(text(slow_statement(engine))).all()
        assert time.monotonic() - start < 5
        timer.join()
        connection.rollback()
        # Once cancelled, later reads under the same cancellation do not start.
        with (
            pytest.raises(QueryInterrupted, match="client went away"),
            bounded(connection, 60, cancellation),
        ):
            connection.execute(text("SELECT 1"))


def test_the_limit_ends_with_the_block(engine: Engine) -> None:
    with engine.connect() as connection:
        if engine.dialect.name == "postgresql":
            before = connection.execute(text("SHOW statement_timeout")).scalar()
            with bounded(connection, 7):
                assert connection.execute(text("SHOW statement_timeout")).scalar() == "7s"
            assert connection.execute(text("SHOW statement_timeout")).scalar() == before
        else:
            with bounded(connection, 0.05):
                connection.execute(text("SELECT 1")).all()
            time.sleep(0.1)  # past the old deadline: no handler is left to stop this one
            assert connection.execute(text("SELECT count(*) FROM (SELECT 1)")).scalar() == 1
            assert len(connection.execute(text(SQLITE_SLOW.replace("1000000000", "100000"))).all())
