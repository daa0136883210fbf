"""Samples into PostgreSQL: ``COPY``, in psycopg's row mode for batches and in binary made whole
by numpy for blocks.

``samples`` is unique on ``(series_id, ts)``, so a plain ``COPY`` of a row already stored fails
as a whole. :func:`merge_samples` is the idempotent path: the same ``COPY`` into a session's
staging table, then one ``INSERT ... ON CONFLICT DO NOTHING`` into ``samples``: a batch written
twice (a spool replayed after a crash between the store's commit and the spool's ack) is
stored once."""

from __future__ import annotations

from collections import deque
from itertools import chain, repeat
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg import sql
from sqlalchemy import Connection, LargeBinary, func, literal, select

from tuneloop.storage.models import samples
from tuneloop.storage.timeseries.write_validation import SampleArrays, SeriesSamples

_TABLE = "samples"
_STAGING = "samples_staging"
_COPY_SQL = "COPY {} (series_id, ts, value) FROM STDIN (FORMAT BINARY)"
# Per session, created once per pooled connection; emptied by every commit or rollback, so a
# merge never sees another write's rows. Temporary: neither WAL nor catalog churn per write.
_STAGING_SQL = sql.SQL(
    "CREATE TEMPORARY TABLE IF NOT EXISTS {staging} (LIKE {table} INCLUDING DEFAULTS)"
    " ON COMMIT DELETE ROWS"
).format(staging=sql.Identifier(_STAGING), table=sql.Identifier(_TABLE))
_MERGE_SQL = sql.SQL(
    "INSERT INTO {table} (series_id, ts, value) SELECT series_id, ts, value FROM {staging}"
    " ON CONFLICT DO NOTHING"
).format(table=sql.Identifier(_TABLE), staging=sql.Identifier(_STAGING))
_COPY_TYPES = ["int8", "timestamptz", "float8"]
_POSTGRES_EPOCH_US = 946_684_800 * 1_000_000
"""2000-01-01 in Unix microseconds: the origin of PostgreSQL's binary timestamps."""
_BINARY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # signature, flags, no extension
_BINARY_TRAILER = b"\xff\xff"
# One row of ``samples`` in COPY's binary format, big-endian: the field count, then each
# field's length and value (int8 series_id, timestamptz ts, float8 value). Packed: 38 bytes.
_BINARY_ROW = np.dtype(
    [
        ("fields", ">i2"),
        ("id_size", ">i4"),
        ("id", ">i8"),
        ("ts_size", ">i4"),
        ("ts", ">i8"),
        ("value_size", ">i4"),
        ("value", ">f8"),
    ]
)


def copy_samples(
    connection: Connection,
    work: list[SeriesSamples],
    blocks: list[SampleArrays],
) -> None:
    """``COPY`` straight into ``samples``: the fast path. Raises
    ``psycopg.errors.UniqueViolation`` (and writes nothing) if one row is already stored."""
    _copy(_driver(connection), _TABLE, work, blocks)


def merge_samples(
    connection: Connection,
    work: list[SeriesSamples],
    blocks: list[SampleArrays],
) -> int:
    """Write the rows not stored yet, skip the others; return how many were inserted."""
    driver = _driver(connection)
    with driver.cursor() as cursor:
        cursor.execute(_STAGING_SQL)
    _copy(driver, _STAGING, work, blocks)
    with driver.cursor() as cursor:
        cursor.execute(_MERGE_SQL)
        return max(cursor.rowcount, 0)


def copy_arrays(connection: Connection, table: str, blocks: list[SampleArrays]) -> None:
    """``COPY`` blocks of (series_id, ts, value) arrays into ``table`` (``samples``' columns)."""
    _copy(_driver(connection), table, [], blocks)


def read_arrays(connection: Connection, *conditions: Any) -> SampleArrays:
    """The rows of ``samples`` meeting ``conditions`` as (series_id, micros, value) arrays
    sorted by series and time, each series' times and values packed by PostgreSQL into two
    byte strings (``timestamptz_send``, ``float8send``): no Python object per row."""
    empty = literal(b"", LargeBinary)
    statement = (
        select(
            samples.c.series_id,
            func.string_agg(func.timestamptz_send(samples.c.ts), empty, type_=LargeBinary),
            func.string_agg(func.float8send(samples.c.value), empty, type_=LargeBinary),
        )
        .where(*conditions)
        .group_by(samples.c.series_id)
        .order_by(samples.c.series_id)
    )
    ids, times, values = [], [], []
    for series_id, packed_times, packed_values in connection.execute(statement):
        micros = np.frombuffer(packed_times, dtype=">i8").astype(np.int64) + _POSTGRES_EPOCH_US
        # Both aggregates see the group's rows in one order, not necessarily time order.
        order = np.argsort(micros, kind="stable")
        times.append(micros[order])
        values.append(np.frombuffer(packed_values, dtype=">f8").astype(np.float64)[order])
        ids.append(np.full(len(micros), series_id, dtype=np.int64))
    if not ids:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64)
    return np.concatenate(ids), np.concatenate(times), np.concatenate(values)


def _driver(connection: Connection) -> psycopg.Connection[Any]:
    return cast("psycopg.Connection[Any]", connection.connection.driver_connection)


def _copy(
    driver: psycopg.Connection[Any],
    table: str,
    work: list[SeriesSamples],
    blocks: list[SampleArrays],
) -> None:
    statement = sql.SQL(_COPY_SQL).format(sql.Identifier(table))
    if work:
        with driver.cursor() as cursor, cursor.copy(statement) as copy:
            copy.set_types(_COPY_TYPES)
            ids, timestamps, values = zip(*work, strict=True)
            # zip/repeat build the row tuples in C, chain strings the batches together, and
            # deque(maxlen=0) drains map() without a Python-level loop, not even one per
            # batch (a collector's batches are often one sample each): the per-sample cost is
            # psycopg's C encoder and nothing else.
            rows = chain.from_iterable(map(zip, map(repeat, ids), timestamps, values))
            deque(map(copy.write_row, rows), maxlen=0)
    if blocks:
        # Blocks as COPY's binary format made whole by numpy: no Python object per sample.
        # A COPY of its own, since psycopg's row mode buffers rows that raw data would pass.
        with driver.cursor() as cursor, cursor.copy(statement) as copy:
            copy.write(_BINARY_SIGNATURE)
            for series_ids, micros, block_values in blocks:
                copy.write(_binary_rows(series_ids, micros, block_values))
            copy.write(_BINARY_TRAILER)


def _binary_rows(
    series_ids: npt.NDArray[np.int64],
    micros: npt.NDArray[np.int64],
    values: npt.NDArray[np.float64],
) -> bytes:
    rows = np.empty(len(values), dtype=_BINARY_ROW)
    rows["fields"] = 3
    rows["id_size"] = rows["ts_size"] = rows["value_size"] = 8
    rows["id"] = series_ids
    rows["ts"] = micros - _POSTGRES_EPOCH_US
    rows["value"] = values
    return rows.tobytes()
