"""Samples into PostgreSQL: ``COPY``, in psycopg's row mode for batches and in binary made whole
by numpy for blocks."""

from __future__ import annotations

from collections import deque
from itertools import chain, repeat
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import psycopg
from sqlalchemy import Connection

from tuneloop.storage.timeseries.write_validation import SampleArrays, SeriesSamples

_COPY_SQL = "COPY samples (series_id, ts, value) FROM STDIN (FORMAT BINARY)"
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
    driver = cast("psycopg.Connection[Any]", connection.connection.driver_connection)
    if work:
        with driver.cursor() as cursor, cursor.copy(_COPY_SQL) as copy:
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
        with driver.cursor() as cursor, cursor.copy(_COPY_SQL) as copy:
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
