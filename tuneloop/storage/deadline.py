"""Bounded reads: statements that stop after a time limit, or as soon as the caller cancels
them (the API cancels when its client goes away), on SQLite and PostgreSQL alike.

SQLite runs a progress handler every few thousand virtual-machine steps, which aborts the
statement once the deadline has passed or the read is cancelled; PostgreSQL gets
``statement_timeout`` for the transaction and, on cancel, a cancel request for the running
statement. Either way the statement fails with :class:`QueryInterrupted`.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, Final

from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from tuneloop.errors import InvalidInput

_PROGRESS_STEPS: Final = 10_000
"""SQLite VM steps between checks: well under a millisecond of work, so the check is cheap
and the stop prompt."""
_QUERY_CANCELED_SQLSTATE: Final = "57014"
_SET_TIMEOUT: Final = text("SELECT set_config('statement_timeout', :limit, true)")


class QueryInterrupted(InvalidInput):
    """A read ran past its time limit or was cancelled; ``str()`` says which, in one line."""


class Cancellation:
    """Cancels the bounded read in progress, and any later one, from another thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._interrupt: Callable[[], None] | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            interrupt = self._interrupt
        if interrupt is not None:
            interrupt()

    def _attach(self, interrupt: Callable[[], None] | None) -> None:
        with self._lock:
            self._interrupt = interrupt


@contextmanager
def bounded(
    connection: Connection, timeout_s: float, cancellation: Cancellation | None = None
) -> Iterator[None]:
    """Statements on ``connection`` inside this block stop ``timeout_s`` from now, or when
    ``cancellation`` is cancelled, with :class:`QueryInterrupted`."""
    cancellation = cancellation or Cancellation()
    if cancellation.cancelled:
        raise QueryInterrupted("the query was cancelled: its client went away")
    raw: Any = connection.connection.dbapi_connection
    dialect = connection.dialect.name
    try:
        if dialect == "sqlite":
            with _sqlite_limits(raw, timeout_s, cancellation):
                yield
        elif dialect == "postgresql":
            with _postgres_limits(connection, raw, timeout_s, cancellation):
                yield
        else:
            yield
    except DBAPIError as exc:
        if not _interrupted(exc.orig):
            raise
        if cancellation.cancelled:
            raise QueryInterrupted("the query was cancelled: its client went away") from None
        raise QueryInterrupted(
            f"the query ran past its {timeout_s:g} s limit: narrow the selector or the range"
        ) from None
    finally:
        cancellation._attach(None)


@contextmanager
def _sqlite_limits(
    raw: sqlite3.Connection, timeout_s: float, cancellation: Cancellation
) -> Iterator[None]:
    deadline = time.monotonic() + timeout_s

    def stop() -> int:
        return int(cancellation.cancelled or time.monotonic() > deadline)

    raw.set_progress_handler(stop, _PROGRESS_STEPS)
    cancellation._attach(raw.interrupt)
    try:
        yield
    finally:
        raw.set_progress_handler(None, 0)


@contextmanager
def _postgres_limits(
    connection: Connection, raw: Any, timeout_s: float, cancellation: Cancellation
) -> Iterator[None]:
    # Local to the transaction, and put back after: later statements of the request keep the
    # connection's own limit.
    before = connection.execute(text("SELECT current_setting('statement_timeout')")).scalar_one()
    connection.execute(_SET_TIMEOUT, {"limit": f"{max(1, round(timeout_s * 1000))}ms"})
    cancellation._attach(raw.cancel)  # psycopg: safe to call from another thread
    try:
        yield
    finally:
        cancellation._attach(None)
        # After an error the transaction is aborted and the setting ends with its rollback.
        with suppress(DBAPIError):
            connection.execute(_SET_TIMEOUT, {"limit": before})


def _interrupted(orig: BaseException | None) -> bool:
    if isinstance(orig, sqlite3.OperationalError):
        return str(orig) == "interrupted"
    return getattr(orig, "sqlstate", None) == _QUERY_CANCELED_SQLSTATE
