"""Writes batches into the tuneloop store, applying each project's own series cap.

Whether a failure is worth retrying is decided by the exception's class, never its message:
connection-level errors (the server is down, restarting, unreachable, or shedding load) become
:class:`SinkUnavailable`; everything else is left to propagate as permanent.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Sequence

import psycopg
from sqlalchemy import exc as sa_exc
from sqlalchemy import select

from collector.sinks.base import SinkUnavailable
from tuneloop.storage.models import Project
from tuneloop.storage.timeseries.columns import Batch, expand
from tuneloop.storage.timeseries.types import Rejection, RejectionCode, WriteResult
from tuneloop.storage.timeseries.writer import SampleWriter

LIMIT_TTL_S = 60.0
"""How long a project's series cap is cached: a change through the API applies within this."""

_RETRYABLE: tuple[type[BaseException], ...] = (
    # SQLAlchemy wraps driver errors raised through its own connection...
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.DisconnectionError,
    sa_exc.TimeoutError,  # pool checkout timed out
    # ...but the writer COPYs (PostgreSQL) and executemany's (SQLite) on the driver connection,
    # whose errors arrive unwrapped. psycopg's OperationalError covers "connection refused",
    # "server closed the connection", admin shutdown (57P01), "the database system is starting
    # up", deadlocks and serialization failures; sqlite3's covers "database is locked".
    psycopg.OperationalError,
    sqlite3.OperationalError,
    ConnectionError,
    TimeoutError,
)
# SQLite files every runtime error under OperationalError, "no such table" included; its
# primary result code tells the passing conditions (locked, busy, I/O, full) from the rest.
_SQLITE_RETRYABLE = frozenset(
    {
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_NOMEM,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PROTOCOL,
    }
)


def is_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` means "the store could not be reached; retrying later may succeed"."""
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    driver_error = exc.orig if isinstance(exc, sa_exc.DBAPIError) else exc
    if isinstance(driver_error, sqlite3.Error):
        code = getattr(driver_error, "sqlite_errorcode", None)
        if code is not None:
            return isinstance(driver_error, sqlite3.OperationalError) and (
                code & 0xFF in _SQLITE_RETRYABLE
            )
    return isinstance(exc, _RETRYABLE)


class StoreSink:
    """The pipeline's sink for the tuneloop store. Safe to share between threads."""

    def __init__(self, writer: SampleWriter, *, limit_ttl_s: float = LIMIT_TTL_S) -> None:
        self._writer = writer
        self._limit_ttl_s = limit_ttl_s
        # project id -> (exists, own series cap or None, monotonic time read)
        self._limits: dict[int, tuple[bool, int | None, float]] = {}
        self._lock = threading.Lock()

    def write(self, project_id: int, batches: Sequence[Batch]) -> WriteResult:
        try:
            exists, limit = self._project_limit(project_id)
            if not exists:
                return _unknown_project(project_id, batches)
            return self._writer.write(project_id, batches, max_series=limit)
        except Exception as exc:
            if is_unreachable(exc):
                raise SinkUnavailable(_first_line(exc)) from exc
            raise

    def _project_limit(self, project_id: int) -> tuple[bool, int | None]:
        now = time.monotonic()
        with self._lock:
            cached = self._limits.get(project_id)
        if cached is not None and now - cached[2] < self._limit_ttl_s:
            return cached[0], cached[1]
        with self._writer.engine.connect() as connection:
            row = connection.execute(
                select(Project.max_series).where(Project.id == project_id)
            ).first()
        exists, limit = row is not None, (row[0] if row is not None else None)
        with self._lock:
            self._limits[project_id] = (exists, limit, now)
        return exists, limit


def _unknown_project(project_id: int, batches: Sequence[Batch]) -> WriteResult:
    result = WriteResult()
    for batch in expand(batches):
        try:
            size = len(batch.values)
        except TypeError:
            size = 0
        result.rejected.append(
            Rejection(
                str(batch.metric),
                {},
                size,
                f"unknown project: project {project_id} does not exist (deleted?)",
                RejectionCode.UNKNOWN_PROJECT,
            )
        )
    return result


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
