"""The samples a read sees: raw rows of ``samples`` and the decoded rows of ``sample_chunks``.

Every read of samples takes its table from :func:`sample_rows`. When no compacted chunk of the
series read overlaps the range (the common case: the tuner, actuators and alerts read the hot
window, which is never compacted) it is ``samples`` itself, so the statement is exactly the one
the store ran before chunks existed; the price is one probe of the chunks' primary key. A read
that looks its series up first adds that probe to its lookup (:func:`flag_chunked`) instead
of running it as a statement of its own, which cost a short read a third of its time or more
(BENCHMARKS.md, "Reads over compacted data"). When chunks overlap, reads that aggregate in
SQL get them decoded here (pcodec has no SQL decoder) into a per-connection
temporary table, ``COPY`` on PostgreSQL and one ``executemany`` on SQLite, and the read selects
``raw UNION ALL decoded`` with the columns (series_id, ts, value) of ``samples``. A raw row
whose (series_id, ts) a chunk already holds is a late duplicate, which ``ON CONFLICT DO
NOTHING`` would have dropped: the chunk's value, stored first, is the one seen.

The temporary table is emptied before every fill (not at commit: a read on an autocommit
connection runs its fill and its select in transactions of their own), so use one source per
statement (a read that needs several time ranges passes them all in one call).

Reads that return samples as they are rather than aggregate them in SQL (the raw reads of
:mod:`.raw`) skip the temporary table: :func:`compacted_samples` decodes the chunks into numpy
arrays and :func:`with_raw` merges them with the raw rows the read selected from ``samples``,
under the same rule for late duplicates. At 100 series x 1 hour that is a third of the time
of the temporary table (BENCHMARKS.md, "Reads over compacted data").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

import numpy as np
from sqlalchemy import (
    BigInteger,
    Column,
    ColumnElement,
    Connection,
    Float,
    FromClause,
    MetaData,
    PrimaryKeyConstraint,
    Select,
    Table,
    and_,
    delete,
    exists,
    false,
    func,
    literal,
    or_,
    select,
    text,
    union_all,
)

from tuneloop.storage.models import Series, sample_chunks, samples
from tuneloop.storage.timeseries.chunk_codec import decode_chunk
from tuneloop.storage.timeseries.columns import Float64Array, Int64Array
from tuneloop.storage.timeseries.samples_postgres import copy_arrays
from tuneloop.storage.timeseries.samples_sqlite import insert_arrays
from tuneloop.storage.types import UTCDateTime, from_micros, to_micros

MAX_CHUNK_SPAN = timedelta(days=1)
"""No chunk is wider: bounds the probe of the chunks' (series_id, start_ts) key."""

TimeRange = tuple[datetime | None, datetime | None]
"""Inclusive bounds of a read, either open when ``None``; the read applies its exact bounds."""

Ids = Select[Any] | Sequence[int]

CHUNKED = "chunked"
"""The column :func:`flag_chunked` adds to a series lookup."""
_series = cast(Table, Series.__table__)
_HAS_CHUNKS = "tuneloop.sample_chunks"
_TEMP_NAME = "tl_chunk_samples"
_temp = Table(
    _TEMP_NAME,
    MetaData(),
    Column("series_id", BigInteger, nullable=False),
    Column("ts", UTCDateTime(), nullable=False),
    Column("value", Float(precision=53), nullable=False),
    PrimaryKeyConstraint("series_id", "ts"),
    prefixes=["TEMPORARY"],
)
_SQLITE_INSERT = "INSERT INTO tl_chunk_samples (series_id, ts, value) VALUES (?, ?, ?)"
_CREATE = {
    "postgresql": f"CREATE TEMPORARY TABLE IF NOT EXISTS {_TEMP_NAME} (series_id int8 NOT NULL,"
    " ts timestamptz NOT NULL, value float8 NOT NULL, PRIMARY KEY (series_id, ts))",
    "sqlite": f"CREATE TEMPORARY TABLE IF NOT EXISTS {_TEMP_NAME} (series_id INTEGER NOT NULL,"
    " ts INTEGER NOT NULL, value REAL NOT NULL, PRIMARY KEY (series_id, ts))",
}


def sample_rows(
    connection: Connection,
    ids: Ids,
    ranges: Sequence[TimeRange],
    *,
    presence_only: bool = False,
    chunked: bool = True,
) -> FromClause:
    """A selectable with the columns of ``samples`` holding every sample of the series ``ids``
    selects within ``ranges``: ``samples`` itself unless a chunk overlaps them.

    ``presence_only``: the read only asks whether a series has a sample in the range (one
    range), so a chunk wholly inside it stands for its samples as one row at its start, value
    0, without being decoded; only the chunks at the range's edges are. ``chunked=False``: the
    read's series lookup found no chunk in the ranges (:func:`any_chunked`), so no probe."""
    if not chunked or not has_chunks_table(connection):
        return samples
    wanted = [sample_chunks.c.series_id.in_(ids), overlapping(ranges)]
    if presence_only:
        if len(ranges) != 1:
            raise ValueError("presence_only reads take one range")
        inside = _inside(ranges[0])
        if (
            connection.execute(select(sample_chunks.c.series_id).where(*wanted).limit(1)).first()
            is None
        ):
            return samples
        wanted.append(~inside)
    chunks = connection.execute(
        select(
            sample_chunks.c.series_id,
            sample_chunks.c.ts_blob,
            sample_chunks.c.values_blob,
        ).where(*wanted)
    ).all()
    if not chunks and not presence_only:
        return samples
    _fill(connection, chunks, ranges)
    duplicate = exists().where(_temp.c.series_id == samples.c.series_id, _temp.c.ts == samples.c.ts)
    raw = select(samples.c.series_id, samples.c.ts, samples.c.value).where(
        samples.c.series_id.in_(ids), _within(samples.c.ts, ranges), ~duplicate
    )
    branches = [raw, select(_temp.c.series_id, _temp.c.ts, _temp.c.value)]
    if presence_only:
        whole = select(
            sample_chunks.c.series_id,
            sample_chunks.c.start_ts,
            literal(0.0, Float(precision=53)),
        ).where(sample_chunks.c.series_id.in_(ids), overlapping(ranges), inside)
        branches.append(whole)
    return union_all(*branches).subquery("chunked_samples")


@dataclass(frozen=True, slots=True)
class SampleArrays:
    """Samples as three parallel arrays: series ids, times in microseconds, values."""

    series_ids: Int64Array
    micros: Int64Array
    values: Float64Array

    def __len__(self) -> int:
        return len(self.micros)

    def take(self, which: Any) -> SampleArrays:
        """The samples an index array or boolean mask selects."""
        return SampleArrays(self.series_ids[which], self.micros[which], self.values[which])


def compacted_samples(
    connection: Connection, ids: Ids, ranges: Sequence[TimeRange], *, chunked: bool = True
) -> SampleArrays | None:
    """The samples the chunks of the series ``ids`` selects hold within ``ranges`` (inclusive
    bounds), decoded, sorted by series and time; ``None`` when no chunk overlaps the ranges
    (one probe of the chunks' key, none with ``chunked=False`` as in :func:`sample_rows`), and
    the read takes ``samples`` alone, as before chunks existed. Merge them with the read's raw
    rows by :func:`with_raw`."""
    if not chunked or not has_chunks_table(connection):
        return None
    found = connection.execute(
        select(
            sample_chunks.c.series_id,
            sample_chunks.c.start_ts,
            sample_chunks.c.ts_blob,
            sample_chunks.c.values_blob,
        ).where(sample_chunks.c.series_id.in_(ids), overlapping(ranges))
    ).all()
    if not found:
        return None
    chunks = sorted(found, key=lambda chunk: (chunk[0], chunk[1]))
    series_parts, micros_parts, value_parts = [], [], []
    for series_id, _, ts_blob, values_blob in chunks:
        micros, values = decode_chunk(ts_blob, values_blob)
        keep = _mask(micros, ranges)
        series_parts.append(np.full(int(keep.sum()), series_id, dtype=np.int64))
        micros_parts.append(micros[keep])
        value_parts.append(values[keep])
    decoded = SampleArrays(
        np.concatenate(series_parts), np.concatenate(micros_parts), np.concatenate(value_parts)
    )
    # Chunks in (series, start) order decode in sample order, unless a series' chunks of two
    # widths share time (a store that went on with wider chunks on the same day,
    # chunk_widths.py): their samples never coincide but interleave, so sort then.
    same_series = decoded.series_ids[1:] == decoded.series_ids[:-1]
    if np.any(same_series & (decoded.micros[1:] < decoded.micros[:-1])):
        decoded = decoded.take(np.lexsort((decoded.micros, decoded.series_ids)))
    return decoded


def with_raw(compacted: SampleArrays, raw: SampleArrays) -> SampleArrays:
    """The samples a read sees: ``compacted`` (from :func:`compacted_samples`) and the raw
    rows ``raw`` the read selected from ``samples`` over the same ranges, sorted by series and
    time. A raw row at a (series_id, ts) that a chunk holds is a late duplicate and is left
    out: the chunk's value, stored first, is the one seen."""
    if not len(raw):
        return compacted
    both = SampleArrays(
        np.concatenate((compacted.series_ids, raw.series_ids)),
        np.concatenate((compacted.micros, raw.micros)),
        np.concatenate((compacted.values, raw.values)),
    )
    from_raw = np.repeat(np.array([False, True]), [len(compacted), len(raw)])
    # Sorted by series, time, then origin: a chunk's sample comes before its raw duplicate.
    order = np.lexsort((from_raw, both.micros, both.series_ids))
    ordered = both.take(order)
    duplicate = np.zeros(len(ordered), dtype=bool)
    duplicate[1:] = (ordered.series_ids[1:] == ordered.series_ids[:-1]) & (
        ordered.micros[1:] == ordered.micros[:-1]
    )
    return ordered.take(~duplicate)


def flag_chunked(
    connection: Connection, lookup: Select[Any], ranges: Sequence[TimeRange]
) -> Select[Any]:
    """``lookup``, a select of ``series`` rows, with a column :data:`CHUNKED`: whether a chunk
    of the row's series overlaps ``ranges`` (an index probe per series, in the lookup's own
    statement). Pass :func:`any_chunked` of its rows as ``chunked`` to the read's source."""
    if not has_chunks_table(connection):
        return lookup.add_columns(literal(False).label(CHUNKED))
    overlaps = []
    for start, end in ranges:
        # A chunk meets [start, end] if, among those starting by ``end``, the latest to end
        # ends after ``start``: the latest to *start* is not enough, as a wider chunk of the
        # same day may span it (chunk_widths.py). The chunks that started in the day before
        # ``start`` are a few index entries a series now that chunks are wide.
        latest = select(func.max(sample_chunks.c.end_ts)).where(
            sample_chunks.c.series_id == _series.c.id
        )
        if end is not None:
            latest = latest.where(sample_chunks.c.start_ts <= end)
        if start is not None:  # keeps PostgreSQL's older partitions out of the scan
            latest = latest.where(sample_chunks.c.start_ts > start - MAX_CHUNK_SPAN)
        end_ts = latest.scalar_subquery()
        overlaps.append(end_ts.is_not(None) if start is None else end_ts > start)
    return lookup.add_columns((or_(*overlaps) if overlaps else false()).label(CHUNKED))


def any_chunked(rows: Sequence[Any]) -> bool:
    """Whether any row of a :func:`flag_chunked` lookup has a chunk in the read's ranges."""
    return any(row._mapping[CHUNKED] for row in rows)


def has_chunks_table(connection: Connection) -> bool:
    """Whether the store is at migration 0013 or later. Remembered per database connection
    once true, so only a store not migrated yet (a process started before ``tuneloop db
    upgrade``, or a test at an older revision) pays a catalog lookup per read: such a store
    holds no chunks, and its reads stay those of before."""
    info = connection.connection.info
    if info.get(_HAS_CHUNKS):
        return True
    if connection.dialect.name == "postgresql":
        found = connection.execute(text("SELECT to_regclass('sample_chunks') IS NOT NULL"))
    else:
        found = connection.execute(
            text("SELECT count(*) > 0 FROM sqlite_master WHERE name = 'sample_chunks'")
        )
    info[_HAS_CHUNKS] = bool(found.scalar())
    return bool(info[_HAS_CHUNKS])


def compacted_inside(connection: Connection, ids: Ids, bounds: TimeRange) -> int:
    """Samples held by the chunks of ``ids`` that lie wholly inside the inclusive ``bounds``:
    a lower bound of what a read of the range finds, summed from the chunks' counts."""
    if not has_chunks_table(connection):
        return 0
    total = connection.execute(
        select(func.coalesce(func.sum(sample_chunks.c.sample_count), 0)).where(
            sample_chunks.c.series_id.in_(ids), overlapping([bounds]), _inside(bounds)
        )
    ).scalar_one()
    return int(total)


def _inside(bounds: TimeRange) -> ColumnElement[bool]:
    """Chunks whose whole span lies in the inclusive ``bounds``."""
    start, end = bounds
    parts = [sample_chunks.c.start_ts >= start] if start is not None else []
    if end is not None:
        parts.append(sample_chunks.c.end_ts <= end)
    return and_(*parts) if parts else sample_chunks.c.start_ts.is_not(None)


def newest_in_chunks(
    connection: Connection, ids: Ids, since: datetime | None
) -> dict[int, tuple[datetime, float]]:
    """series id -> (time, value) of the newest compacted sample at or after ``since``, for the
    series ``ids`` selects; empty (one probe of the chunks' key) when no chunk qualifies."""
    if not has_chunks_table(connection):
        return {}
    newest = select(sample_chunks.c.series_id, func.max(sample_chunks.c.start_ts).label("start"))
    newest = newest.where(sample_chunks.c.series_id.in_(ids), overlapping([(since, None)]))
    last = newest.group_by(sample_chunks.c.series_id).subquery("last_chunks")
    # The latest chunk to start, and any wider one of the same day spanning its start
    # (chunk_widths.py): the newest sample is in one of them.
    rows = connection.execute(
        select(sample_chunks.c.series_id, sample_chunks.c.ts_blob, sample_chunks.c.values_blob)
        .join(
            last,
            and_(
                last.c.series_id == sample_chunks.c.series_id,
                sample_chunks.c.start_ts <= last.c.start,
                sample_chunks.c.end_ts > last.c.start,
            ),
        )
        .where(overlapping([(since, None)]))
    ).all()
    found: dict[int, tuple[datetime, float]] = {}
    for series_id, ts_blob, values_blob in rows:
        micros, values = decode_chunk(ts_blob, values_blob)
        if not len(micros) or (since is not None and micros[-1] < to_micros(since)):
            continue
        when = from_micros(int(micros[-1]))
        if int(series_id) not in found or when > found[int(series_id)][0]:
            found[int(series_id)] = (when, float(values[-1]))
    return found


def overlapping(ranges: Sequence[TimeRange]) -> ColumnElement[bool]:
    """Chunks with a span that meets one of ``ranges`` (``end_ts`` is the span's exclusive end)."""
    conditions = []
    for start, end in ranges:
        parts: list[ColumnElement[bool]] = []
        if start is not None:
            parts += [
                sample_chunks.c.end_ts > start,
                sample_chunks.c.start_ts > start - MAX_CHUNK_SPAN,
            ]
        if end is not None:
            parts.append(sample_chunks.c.start_ts <= end)
        conditions.append(and_(*parts) if parts else sample_chunks.c.start_ts.is_not(None))
    return or_(*conditions) if conditions else false()


def _within(ts: ColumnElement[Any], ranges: Sequence[TimeRange]) -> ColumnElement[bool]:
    conditions = []
    for start, end in ranges:
        parts = [ts >= start] if start is not None else []
        if end is not None:
            parts.append(ts <= end)
        conditions.append(and_(*parts) if parts else ts.is_not(None))
    return or_(*conditions)


def _fill(connection: Connection, chunks: Sequence[Any], ranges: Sequence[TimeRange]) -> None:
    """Decode ``chunks`` into the temporary table, keeping only samples inside ``ranges``."""
    dialect = connection.dialect.name
    connection.execute(text(_CREATE[dialect]))
    connection.execute(delete(_temp))
    blocks = []
    for series_id, ts_blob, values_blob in chunks:
        micros, values = decode_chunk(ts_blob, values_blob)
        keep = _mask(micros, ranges)
        if keep.any():
            micros, values = micros[keep], values[keep]
            blocks.append((np.full(len(micros), series_id, dtype=np.int64), micros, values))
    if not blocks:
        return
    if dialect == "postgresql":
        copy_arrays(connection, _TEMP_NAME, blocks)
    else:
        insert_arrays(connection, _SQLITE_INSERT, blocks)


def _mask(micros: Any, ranges: Sequence[TimeRange]) -> Any:
    keep = np.zeros(len(micros), dtype=bool)
    for start, end in ranges:
        inside = np.ones(len(micros), dtype=bool)
        if start is not None:
            inside &= micros >= to_micros(start)
        if end is not None:
            inside &= micros <= to_micros(end)
        keep |= inside
    return keep
