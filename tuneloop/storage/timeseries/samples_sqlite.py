"""Samples into SQLite: every row through one prepared statement. ``samples`` is unique on
``(series_id, ts)``; a row already stored is skipped (``OR IGNORE``), so a batch written twice
is stored once, at the price of nothing measurable: the index is probed for the insert anyway."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta
from itertools import chain, repeat
from typing import cast

from sqlalchemy import Connection

from tuneloop.storage.timeseries.write_validation import EPOCH, SampleArrays, SeriesSamples

_SQLITE_INSERT = "INSERT OR IGNORE INTO samples (series_id, ts, value) VALUES (?, ?, ?)"
_MICROSECOND = timedelta(microseconds=1)


def insert_samples(
    connection: Connection,
    work: list[SeriesSamples],
    blocks: list[SampleArrays],
) -> int:
    """Insert the rows not stored yet; return how many were inserted."""
    driver = cast(sqlite3.Connection, connection.connection.driver_connection)
    rows = chain(
        chain.from_iterable(
            zip(repeat(series_id), map(_micros, timestamps), values)
            for series_id, timestamps, values in work
        ),
        chain.from_iterable(
            zip(series_ids.tolist(), micros.tolist(), values.tolist(), strict=True)
            for series_ids, micros, values in blocks
        ),
    )
    cursor = driver.cursor()
    try:
        # One executemany streams every row through one prepared statement, in the
        # transaction the engine opened (committed by the caller's ``begin()``).
        cursor.executemany(_SQLITE_INSERT, rows)
        return max(cursor.rowcount, 0)  # summed over the rows by executemany
    finally:
        cursor.close()


def insert_arrays(connection: Connection, statement: str, blocks: list[SampleArrays]) -> None:
    """Run ``statement``, an ``INSERT`` of (series_id, ts, value) with three ``?``, for every
    row of ``blocks``."""
    driver = cast(sqlite3.Connection, connection.connection.driver_connection)
    rows = chain.from_iterable(
        zip(series_ids.tolist(), micros.tolist(), values.tolist(), strict=True)
        for series_ids, micros, values in blocks
    )
    cursor = driver.cursor()
    try:
        cursor.executemany(statement, rows)
    finally:
        cursor.close()


def _micros(ts: datetime) -> int:
    # Exact integer microseconds, the representation UTCDateTime uses on SQLite.
    return (ts - EPOCH) // _MICROSECOND
