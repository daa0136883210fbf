"""Compaction: closed chunk spans of raw samples become one ``sample_chunks`` row each.

A span (aligned to the epoch; ``chunk_span_s`` wide, or a multiple of it for a series that
needs more to fill a chunk of ``chunk_min_samples``: :mod:`.chunk_widths`; every width divides a
day) is compacted once it ends before both
``now - hot_window`` and the 1-minute rollup's watermark less the rollups' lateness margin: the
rollups and PostgreSQL's dashboard functions, which read raw rows only after that watermark,
never need a chunk. Work goes by batches of series and by day (never across a partition), each
unit one transaction that inserts the chunks and deletes exactly the raw rows they hold, so a
process killed at any point loses and duplicates nothing, and a second pass finds nothing left.

Late samples, raw rows inside a span that already has a chunk, are merged into it by the next
pass: decoded, merged (on an equal timestamp the chunk's value stays, as ``ON CONFLICT DO
NOTHING`` keeps the first stored), encoded again and written back in the same kind of
transaction. Readers see them in the meantime (:mod:`.sample_source`).

A pass ends by truncating, on PostgreSQL, the ``samples`` partitions before its cutoff that it
emptied (:mod:`.reclaim`): deleted rows alone give no disk back there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

import numpy as np
from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Table,
    delete,
    func,
    insert,
    select,
    tuple_,
)
from sqlalchemy.sql.expression import type_coerce

from tuneloop.settings import get_settings
from tuneloop.storage.locks import LockName, hold_write_lock, session_lock
from tuneloop.storage.models import Series, sample_chunks, samples
from tuneloop.storage.timeseries.chunk_assembly import (
    ChunkKey,
    DecodedChunk,
    Layout,
    StoredChunk,
    chunk_keys,
    chunk_rows,
    chunk_starts,
    floor_to,
    per_sample,
    series_edges,
)
from tuneloop.storage.timeseries.chunk_codec import decode_chunk
from tuneloop.storage.timeseries.partitions import ensure_chunk_partitions
from tuneloop.storage.timeseries.reclaim import reclaim_partitions
from tuneloop.storage.timeseries.rollups import DEFAULT_LATENESS_S, MINUTE_S, read_watermarks
from tuneloop.storage.timeseries.samples_postgres import read_arrays
from tuneloop.storage.types import from_micros, to_micros, utcnow

_series = cast(Table, Series.__table__)
_DAY = timedelta(days=1)


@dataclass(frozen=True)
class CompactionReport:
    chunks_written: int
    samples_compacted: int
    late_samples_merged: int
    seconds: float
    partitions_reclaimed: int = 0
    """PostgreSQL: emptied ``samples`` partitions truncated (:mod:`.reclaim`)."""


@dataclass
class _Totals:
    chunks: int = 0
    samples: int = 0
    late: int = 0


def compact(
    bind: Engine | Connection,
    *,
    hot_window: timedelta | None = None,
    now: datetime | None = None,
    batch_series: int = 500,
    progress: Callable[[str], None] | None = None,
    after_rollups: bool = True,
    span: timedelta | None = None,
    min_samples: int | None = None,
) -> CompactionReport:
    """Compact every closed chunk span older than ``now - hot_window`` (the setting
    ``compact_after_s`` when ``None``) and, with ``after_rollups``, than the 1-minute rollup's
    watermark (nothing while the rollups have never run). ``after_rollups=False`` is for a store
    whose rollups are not used; ``span`` overrides the setting ``chunk_span_s`` (the narrowest
    chunk) and ``min_samples`` ``chunk_min_samples`` (a series' chunks are widened until one holds
    that many at its rate: :mod:`.chunk_widths`; 1 keeps every chunk ``span`` wide). One pass at a
    time (a second returns at once, having done nothing). On PostgreSQL it then truncates the
    ``samples`` partitions wholly before the cutoff that it left without a row (:mod:`.reclaim`).
    Idempotent; safe to interrupt. A ``Connection`` given must not be in a transaction: each
    unit commits on it."""
    began = time.monotonic()
    settings = get_settings()
    hot = timedelta(seconds=settings.compact_after_s) if hot_window is None else hot_window
    width = timedelta(seconds=settings.chunk_span_s) if span is None else span
    least = settings.chunk_min_samples if min_samples is None else min_samples
    if hot < timedelta(0):
        raise ValueError(f"hot_window must not be negative, got {hot}")
    if batch_series < 1:
        raise ValueError(f"batch_series must be >= 1, got {batch_series}")
    if width < timedelta(minutes=1) or _DAY % width:
        raise ValueError(f"a chunk span must divide a day, got {width}")
    if least < 1:
        raise ValueError(f"min_samples must be >= 1, got {least}")
    now = utcnow() if now is None else now
    if now.tzinfo is None:
        raise ValueError("naive datetime: tuneloop timestamps must be timezone-aware")
    say = progress or (lambda _line: None)
    totals = _Totals()
    reclaimed = 0
    with _connected(bind) as connection, session_lock(connection, LockName.COMPACTION) as free:
        cutoff = _cutoff(connection, now - hot, width, after_rollups)
        if not free:
            say("another compaction is running: nothing done")
        elif cutoff is None:
            say("nothing to compact: the 1-minute rollups have not run yet")
        else:
            say(
                f"compacting samples before {cutoff.isoformat()} in chunks of {width} or wider"
                f" (about {least} samples a chunk)"
            )
            _run(connection, cutoff, Layout(width, least), batch_series, totals, say)
            # Every day wholly before the cutoff is compacted now (each chunk width divides a
            # day; only the cutoff's own day may keep rows of spans not closed yet): give back
            # what it held.
            reclaimed = len(reclaim_partitions(connection, cutoff, say))
    report = CompactionReport(
        totals.chunks, totals.samples, totals.late, time.monotonic() - began, reclaimed
    )
    say(
        f"done: {report.samples_compacted} samples into {report.chunks_written} chunks "
        f"({report.late_samples_merged} late samples merged; partitions reclaimed: {reclaimed}"
        f") in {report.seconds:.1f} s"
    )
    return report


@contextmanager
def _connected(bind: Engine | Connection) -> Iterator[Connection]:
    """The connection to work on: the caller's (which must not be in a transaction: each unit
    commits on it), or one of the engine's."""
    if isinstance(bind, Connection):
        yield bind
        return
    with bind.connect() as connection:
        yield connection


def _cutoff(
    connection: Connection, hot_edge: datetime, width: timedelta, after_rollups: bool
) -> datetime | None:
    edge = hot_edge
    if after_rollups:
        watermark = read_watermarks(connection).get(MINUTE_S)
        _end(connection)
        if watermark is None:
            return None
        edge = min(edge, watermark - timedelta(seconds=DEFAULT_LATENESS_S))
    return floor_to(edge, width)


def _run(
    connection: Connection,
    cutoff: datetime,
    layout: Layout,
    batch_series: int,
    totals: _Totals,
    say: Callable[[str], None],
) -> None:
    done = 0
    for batch in _series_batches(connection, batch_series):
        day = _oldest(connection, batch, None, cutoff)
        while day is not None:
            stop = min(day + _DAY, cutoff)
            _ensure_partitions(connection, day, stop)
            _compact_unit(connection, batch, day, stop, layout, totals)
            # The next day that has raw samples: a gap of months costs one probe, not a loop.
            day = _oldest(connection, batch, stop, cutoff)
        done += len(batch)
        say(f"{done} series done: {totals.samples} samples in {totals.chunks} chunks so far")


def _series_batches(connection: Connection, size: int) -> Iterator[list[int]]:
    after = -(2**63)
    while True:
        ids = list(
            connection.execute(
                select(_series.c.id).where(_series.c.id > after).order_by(_series.c.id).limit(size)
            ).scalars()
        )
        _end(connection)
        if not ids:
            return
        yield ids
        after = ids[-1]


def _oldest(
    connection: Connection, batch: Sequence[int], after: datetime | None, cutoff: datetime
) -> datetime | None:
    """Day start of the oldest raw sample of the batch in ``[after, cutoff)``: one index probe
    per series, never a scan."""
    bounds = (
        [samples.c.ts < cutoff] if after is None else [samples.c.ts >= after, samples.c.ts < cutoff]
    )
    first = (
        select(samples.c.ts)
        .where(samples.c.series_id == _series.c.id, *bounds)
        .order_by(samples.c.ts)
        .limit(1)
        .correlate(_series)
        .scalar_subquery()
    )
    rows = connection.execute(select(first).where(_series.c.id.in_(batch))).scalars().all()
    _end(connection)
    found = [ts for ts in rows if ts is not None]
    return floor_to(min(found), _DAY) if found else None


def _ensure_partitions(connection: Connection, start: datetime, end: datetime) -> None:
    # DDL in a short transaction of its own, before the unit writes (partitions.py's rule).
    if connection.dialect.name == "postgresql":
        with connection.begin():
            ensure_chunk_partitions(connection, start, end)


def _compact_unit(
    connection: Connection,
    batch: Sequence[int],
    start: datetime,
    stop: datetime,
    layout: Layout,
    totals: _Totals,
) -> None:
    """One transaction: the raw rows of ``batch`` in ``[start, stop)`` into chunks, each series'
    as wide as :mod:`.chunk_widths` says; rows of a span of that width not closed by ``stop``
    stay raw for a later pass."""
    with connection.begin():
        if connection.dialect.name == "postgresql":
            # The deletes then see only the rows this unit read: a sample written meanwhile
            # stays raw for the next pass instead of being deleted unread.
            connection.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        hold_write_lock(connection)
        counts = _raw_counts(connection, batch, start, stop)
        if not counts:
            return
        stored = _stored(connection, batch, start, stop)
        # Only the rows of closed spans are read (and then deleted): a series' span wider than
        # the base one stays rows, unread, until it closes; passes run every minute.
        edges = series_edges(counts, stored, start, stop, layout)
        by_edge: dict[int, list[int]] = {}
        for series_id, (_width, edge) in edges.items():
            if edge > to_micros(start):
                by_edge.setdefault(edge, []).append(series_id)
        if not by_edge:
            return
        # One statement per edge, each a range search of the (series_id, ts) key per series.
        reads = [
            (
                samples.c.series_id.in_(group),
                samples.c.ts >= start,
                samples.c.ts < from_micros(edge),
            )
            for edge, group in sorted(by_edge.items())
        ]
        parts = [_raw(connection, read) for read in reads]
        # Each part is sorted by (series_id, ts) and holds its series whole.
        order = np.argsort(np.concatenate([part[0] for part in parts]), kind="stable")
        ids, micros, values = (np.concatenate([part[i] for part in parts])[order] for i in range(3))
        if not len(ids):
            return
        width_us = per_sample(ids, {series_id: width for series_id, (width, _) in edges.items()})
        spans = chunk_starts(ids, micros, width_us, stored)
        merging = {key for key in chunk_keys(ids, spans) if key in stored}
        existing = _decoded(connection, merging)
        rows, late = chunk_rows(ids, micros, values, spans, width_us, existing)
        if merging:
            connection.execute(
                delete(sample_chunks).where(
                    tuple_(sample_chunks.c.series_id, sample_chunks.c.start_ts).in_(sorted(merging))
                )
            )
        connection.execute(insert(sample_chunks), rows)
        for read in reads:  # exactly the rows read, which are all chunked
            connection.execute(delete(samples).where(*read))
    totals.chunks += len(rows)
    totals.samples += len(ids)
    totals.late += late


def _raw_counts(
    connection: Connection, batch: Sequence[int], start: datetime, stop: datetime
) -> dict[int, int]:
    """Raw rows per series of ``batch`` in ``[start, stop)``: the key's index alone."""
    rows = connection.execute(
        select(samples.c.series_id, func.count())
        .where(samples.c.series_id.in_(batch), samples.c.ts >= start, samples.c.ts < stop)
        .group_by(samples.c.series_id)
    )
    return {int(series_id): int(count) for series_id, count in rows}


def _raw(connection: Connection, conditions: Sequence[Any]) -> tuple[Any, Any, Any]:
    """The unit's raw samples as arrays sorted by (series_id, ts)."""
    if connection.dialect.name == "postgresql":
        return read_arrays(connection, *conditions)
    micros = type_coerce(samples.c.ts, BigInteger())  # SQLite keeps integer microseconds
    result = connection.execute(
        select(samples.c.series_id, micros, samples.c.value)
        .where(*conditions)
        .order_by(samples.c.series_id, samples.c.ts)
    )
    # The driver's plain tuples: no Row object per sample (the columns need no conversion).
    rows = result.cursor.fetchall() if result.cursor is not None else []
    count = len(rows)
    ids = np.fromiter((row[0] for row in rows), dtype=np.int64, count=count)
    times = np.fromiter((row[1] for row in rows), dtype=np.int64, count=count)
    values = np.fromiter((row[2] for row in rows), dtype=np.float64, count=count)
    return ids, times, values


def _stored(
    connection: Connection, batch: Sequence[int], start: datetime, stop: datetime
) -> dict[ChunkKey, StoredChunk]:
    """The unit's stored chunks, without their blobs (only those merged into get decoded)."""
    rows = connection.execute(
        select(
            sample_chunks.c.series_id,
            sample_chunks.c.start_ts,
            sample_chunks.c.end_ts,
            sample_chunks.c.sample_count,
        ).where(
            sample_chunks.c.series_id.in_(batch),
            sample_chunks.c.start_ts >= start,
            sample_chunks.c.start_ts < stop,
        )
    )
    return {
        (int(row[0]), row[1]): StoredChunk(to_micros(row[1]), to_micros(row[2]), int(row[3]))
        for row in rows
    }


def _decoded(connection: Connection, keys: set[ChunkKey]) -> dict[ChunkKey, DecodedChunk]:
    if not keys:
        return {}
    rows = connection.execute(
        select(
            sample_chunks.c.series_id,
            sample_chunks.c.start_ts,
            sample_chunks.c.end_ts,
            sample_chunks.c.ts_blob,
            sample_chunks.c.values_blob,
        ).where(tuple_(sample_chunks.c.series_id, sample_chunks.c.start_ts).in_(sorted(keys)))
    )
    return {(row[0], row[1]): DecodedChunk(row[2], *decode_chunk(row[3], row[4])) for row in rows}


def _end(connection: Connection) -> None:
    # Reads between units end their implicit transaction, so no snapshot is held across units.
    if connection.in_transaction():
        connection.commit()
