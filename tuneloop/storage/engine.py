"""Engines and sessions: the one way every component reaches the store."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from tuneloop import regex
from tuneloop.errors import Unavailable


class DatabaseUnavailable(Unavailable):
    """The database cannot be reached; ``str()`` is a one-line explanation for people."""


class _Quantile:
    """SQLite aggregate ``tl_quantile(value, q)``: linear interpolation, as PostgreSQL's
    ``percentile_cont``, so both backends return the same number."""

    def __init__(self) -> None:
        self.values: list[float] = []
        self.q = 0.5

    def step(self, value: float | None, q: float) -> None:
        if value is not None:
            self.values.append(value)
            self.q = q

    def finalize(self) -> float | None:
        return quantile(sorted(self.values), self.q)


class _Last:
    """SQLite aggregate ``tl_last(ts, value)``: the value with the greatest timestamp."""

    def __init__(self) -> None:
        self.ts: Any = None
        self.value: float | None = None

    def step(self, ts: Any, value: float | None) -> None:
        if self.ts is None or ts >= self.ts:
            self.ts, self.value = ts, value

    def finalize(self) -> float | None:
        return self.value


def quantile(sorted_values: list[float], q: float) -> float | None:
    """Linear-interpolated quantile of already sorted values (``percentile_cont``)."""
    if not sorted_values:
        return None
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def _regexp(pattern: str, value: str | None) -> bool:
    # RE2, anchored like PromQL label matchers: linear in the value, whatever the pattern.
    return value is not None and regex.fullmatch(pattern, value)


def _on_sqlite_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets the API read while collectors write; NORMAL is durable across app crashes.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()
    dbapi_connection.create_aggregate("tl_quantile", 2, _Quantile)  # type: ignore[arg-type]
    dbapi_connection.create_aggregate("tl_last", 2, _Last)  # type: ignore[arg-type]
    dbapi_connection.create_function("regexp", 2, _regexp, deterministic=True)


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine for ``url`` (already resolved, see ``Settings.resolved_database_url``)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, **kwargs)
        event.listen(engine, "connect", _on_sqlite_connect)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("connect_args", {"connect_timeout": 5})
    return create_engine(url, **kwargs)


def check_database(engine: Engine) -> None:
    """Raise :class:`DatabaseUnavailable` unless a trivial query succeeds."""
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        orig = getattr(exc, "orig", None)
        reason = str(orig if orig is not None else exc)
        first_line = reason.strip().splitlines()[0] if reason.strip() else type(exc).__name__
        raise DatabaseUnavailable(
            f"cannot reach the database at {engine.url.render_as_string(hide_password=True)}: "
            f"{first_line}"
        ) from None


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
