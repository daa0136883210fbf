"""Series rows: looking up the ids of a project's series and creating the missing ones under
the per-project lock that enforces the series cap."""

from __future__ import annotations

import json
from typing import cast

from sqlalchemy import Connection, Table, func, select, text
from sqlalchemy.dialects import sqlite

from tuneloop.storage.locks import LockName, advisory_lock, hold_write_lock
from tuneloop.storage.models import Series
from tuneloop.storage.timeseries.types import WriteResult
from tuneloop.storage.timeseries.write_validation import Accepted
from tuneloop.storage.types import utcnow

_SERIES: Table = cast(Table, Series.__table__)
_LOOKUP_CHUNK = 1_000
# PostgreSQL: the series travel as one JSON document parameter rather than one placeholder per
# value, so the statement stays short and fixed whatever their number. psycopg re-parses a long
# statement on every call and escapes text arrays element by element in Python: for 1,000
# series either cost more than COPYing 100,000 samples; json.dumps and the server's parser don't.
# ``= ANY(ARRAY(...))`` keeps the lookup an index scan of (project_id, fingerprint) at any size.
_PG_LOOKUP = text(
    """
    SELECT fingerprint, id FROM series
    WHERE project_id = :project_id
      AND fingerprint = ANY(ARRAY(SELECT jsonb_array_elements_text(CAST(:fingerprints AS jsonb))))
    """
)
_PG_INSERT = text(
    """
    INSERT INTO series (project_id, metric, labels, fingerprint, kind, created_at)
    SELECT :project_id, t.metric, t.labels, t.fingerprint, t.kind, :created_at
    FROM jsonb_to_recordset(CAST(:rows AS jsonb))
         AS t(metric text, labels jsonb, fingerprint text, kind text)
    ON CONFLICT (project_id, fingerprint) DO NOTHING
    RETURNING fingerprint, id
    """
)


def lookup_series(
    connection: Connection, project_id: int, fingerprints: list[str]
) -> dict[str, int]:
    if connection.dialect.name == "postgresql":
        rows = connection.execute(
            _PG_LOOKUP, {"project_id": project_id, "fingerprints": json.dumps(fingerprints)}
        )
        return {row.fingerprint: row.id for row in rows}
    found: dict[str, int] = {}
    for start in range(0, len(fingerprints), _LOOKUP_CHUNK):
        chunk = fingerprints[start : start + _LOOKUP_CHUNK]
        rows = connection.execute(
            select(_SERIES.c.fingerprint, _SERIES.c.id).where(
                _SERIES.c.project_id == project_id, _SERIES.c.fingerprint.in_(chunk)
            )
        )
        found.update((row.fingerprint, row.id) for row in rows)
    return found


def create_series(
    connection: Connection, project_id: int, new: list[Accepted], cap: int, result: WriteResult
) -> dict[str, int]:
    """Create as many of ``new`` as the cap allows, in order; return the ids of those that
    now exist (created here or, meanwhile, by another writer)."""
    _lock_project(connection, project_id)
    found = lookup_series(connection, project_id, [item.fingerprint for item in new])
    new = [item for item in new if item.fingerprint not in found]
    existing = connection.execute(
        select(func.count()).select_from(_SERIES).where(_SERIES.c.project_id == project_id)
    ).scalar_one()
    allowed = new[: max(cap - existing, 0)]
    if not allowed:
        return found
    created = _insert_series(connection, project_id, allowed)
    result.series_created += len(created)
    found |= created
    conflicted = [item.fingerprint for item in allowed if item.fingerprint not in found]
    if conflicted:
        found |= lookup_series(connection, project_id, conflicted)
    return found


def _insert_series(
    connection: Connection, project_id: int, items: list[Accepted]
) -> dict[str, int]:
    """Insert ``items`` as series (a row that exists already is skipped); return the ids of
    the rows inserted, by fingerprint."""
    if connection.dialect.name == "postgresql":
        document = json.dumps(
            [
                {
                    "metric": item.metric,
                    "labels": dict(item.labels),
                    "fingerprint": item.fingerprint,
                    "kind": item.kind.value,
                }
                for item in items
            ]
        )
        rows = connection.execute(
            _PG_INSERT, {"project_id": project_id, "created_at": utcnow(), "rows": document}
        )
    else:
        statement = (
            sqlite.insert(_SERIES)
            .on_conflict_do_nothing(index_elements=["project_id", "fingerprint"])
            .returning(_SERIES.c.fingerprint, _SERIES.c.id)
        )
        params = [
            {
                "project_id": project_id,
                "metric": item.metric,
                "labels": dict(item.labels),
                "fingerprint": item.fingerprint,
                "kind": item.kind.value,
            }
            for item in items
        ]
        rows = connection.execute(statement, params)
    return {row.fingerprint: row.id for row in rows}


def _lock_project(connection: Connection, project_id: int) -> None:
    """Serialize series creation of one project until this transaction ends, so that counting
    and inserting cannot interleave with another writer's and overshoot the cap."""
    advisory_lock(connection, LockName.SERIES, project_id)
    hold_write_lock(connection)  # SQLite: one writer at a time, before we count
