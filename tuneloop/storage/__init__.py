"""The storage layer every tuneloop component uses (PostgreSQL or SQLite, same behaviour)."""

from tuneloop.storage.engine import (
    DatabaseUnavailable,
    check_database,
    make_engine,
    session_factory,
    session_scope,
)

__all__ = [
    "DatabaseUnavailable",
    "check_database",
    "make_engine",
    "session_factory",
    "session_scope",
]
