"""Downsampled rollups of raw samples: ``samples_1m`` from ``samples``, ``samples_1h`` from
``samples_1m``.

A rollup row holds (count, sum, min, max, last, last_ts) of one series over one bucket: enough to
derive avg/min/max/sum/count/last over any coarser, aligned step. ``update_rollups`` is a
reconcile pass: it reads each resolution's watermark from ``rollup_state``, aggregates the buckets
that became complete since (in SQL, ``INSERT ... SELECT ... GROUP BY ... ON CONFLICT DO UPDATE``),
and advances the watermark in the same transaction as each chunk of buckets, so a restart neither
redoes a committed chunk nor skips one.

Watermark semantics: every bucket starting before ``watermark`` has been rolled up. The 1-minute
level recomputes ``lateness_s`` before its watermark on every pass, so a sample that arrives up
to about twice ``lateness_s`` late is still reflected. The 1-hour level only reads 1-minute rows
that no later pass will recompute, so it never needs a recompute window of its own.

Samples written further behind the watermark than that (a backfill) are not rolled up, and range
queries that use rollups will not see them. Deleting the ``rollup_state`` rows makes the next pass
rebuild every rollup from the oldest sample (in bounded chunks, as always).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    DateTime,
    Engine,
    Float,
    FromClause,
    Integer,
    Interval,
    Select,
    Subquery,
    Table,
    func,
    literal,
    select,
    text,
    type_coerce,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY

from tuneloop.storage.locks import LockName, advisory_lock
from tuneloop.storage.models import ROLLUP_TABLES, RollupState, Series, samples
from tuneloop.storage.timeseries.counter_increase import increase_minutes
from tuneloop.storage.types import UTCDateTime, from_micros, to_micros

MINUTE_S = 60
HOUR_S = 3600

PARTIAL_FIELDS = ("count", "sum", "min", "max", "last", "last_ts")
"""The columns of a rollup row, in table order after (series_id, bucket)."""

DEFAULT_CHUNK = timedelta(hours=6)
DEFAULT_LATENESS_S = 120
"""How late a sample may arrive and still be rolled up: the 1-minute pass recomputes this much
before its watermark (compaction leaves that margin raw)."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_series = cast(Table, Series.__table__)
_state = cast(Table, RollupState.__table__)


# --------------------------------------------------------------------------- SQL building blocks


def time_bucket(ts: ColumnElement[Any], width_s: int, dialect: str) -> ColumnElement[datetime]:
    """Start of the ``width_s``-second bucket holding ``ts``, aligned to the Unix epoch (as
    Grafana's ``$__timeGroup``)."""
    if dialect == "postgresql":
        stride = literal(timedelta(seconds=width_s), Interval())
        origin = literal(_EPOCH, DateTime(timezone=True))
        return type_coerce(func.date_bin(stride, ts, origin), UTCDateTime())
    # SQLite stores integer microseconds; the double modulo floors negative times correctly.
    micros = type_coerce(ts, BigInteger())
    width = literal(width_s * 1_000_000, BigInteger())
    return type_coerce(micros - (micros % width + width) % width, UTCDateTime())


def last_by_ts(ts: ColumnElement[Any], value: ColumnElement[Any], dialect: str) -> Any:
    """Aggregate: the value with the greatest timestamp in the group."""
    if dialect == "postgresql":
        values = func.array_agg(
            postgresql.aggregate_order_by(value, ts.desc()), type_=ARRAY(Float(precision=53))
        )
        return values[1]
    return func.tl_last(ts, value, type_=Float(precision=53))


def partial_rows(
    source: FromClause,
    width_s: int,
    dialect: str,
    fields: Sequence[str],
    *conditions: ColumnElement[bool],
) -> Select[Any]:
    """Rows of ``source`` (``samples`` or a rollup table) in the common partial shape
    (series_id, bucket, *fields), with ``bucket`` at ``width_s``. A raw sample is a partial of
    one sample, so raw and rollup rows can be merged by one ``GROUP BY``."""
    if "ts" in source.c:  # ``samples`` or the samples a read sees (sample_source)
        ts, value = source.c.ts, source.c.value
        raw: dict[str, ColumnElement[Any]] = {
            "count": literal(1, Integer()),
            "sum": value,
            "min": value,
            "max": value,
            "last": value,
            "last_ts": ts,
        }
        columns = [raw[field].label(field) for field in fields]
    else:
        ts = source.c.bucket
        columns = [source.c[field].label(field) for field in fields]
    bucket = time_bucket(ts, width_s, dialect).label("bucket")
    return select(source.c.series_id, bucket, *columns).where(*conditions)


def merge(rows: Subquery, field: str, dialect: str) -> Any:
    """Aggregate that merges the partials of ``field`` within a group."""
    column = rows.c[field]
    if field in ("count", "sum"):
        return func.sum(column)
    if field == "min":
        return func.min(column)
    if field in ("max", "last_ts"):
        return func.max(column)
    if field == "last":
        return last_by_ts(rows.c.last_ts, column, dialect)
    raise ValueError(f"unknown partial field {field!r}")


def read_watermarks(connection: Connection) -> dict[int, datetime]:
    """Watermark of each rollup resolution that has one (seconds -> first incomplete bucket)."""
    rows = connection.execute(select(_state.c.resolution_s, _state.c.watermark))
    return {int(row.resolution_s): row.watermark for row in rows}


def floor_time(value: datetime, width_s: int) -> datetime:
    """``value`` rounded down to an epoch multiple of ``width_s`` seconds."""
    width = width_s * 1_000_000
    return from_micros(to_micros(value) // width * width)


def ceil_time(value: datetime, width_s: int) -> datetime:
    width = width_s * 1_000_000
    return from_micros(-(-to_micros(value) // width) * width)


# --------------------------------------------------------------------------- update pass


@dataclass(frozen=True, slots=True)
class _Level:
    resolution_s: int
    source: Table
    """``samples`` or the next finer rollup table."""


_LEVELS = (_Level(MINUTE_S, samples), _Level(HOUR_S, ROLLUP_TABLES[MINUTE_S]))


def update_rollups(
    engine: Engine,
    *,
    now: datetime,
    lateness_s: int = DEFAULT_LATENESS_S,
    chunk: timedelta = DEFAULT_CHUNK,
) -> dict[int, int]:
    """Bring every rollup up to date with the samples complete at ``now``; return the rows
    upserted per resolution.

    A 1-minute bucket is complete once its end is ``<= now - lateness_s``. Each transaction
    covers at most ``chunk`` of raw data (``chunk`` x 60 of 1-minute rows for the hourly level),
    so a long backlog is worked off in bounded steps, each committed with its watermark.
    """
    if now.tzinfo is None:
        raise ValueError("naive datetime: tuneloop timestamps must be timezone-aware")
    if lateness_s < 0:
        raise ValueError(f"lateness_s must be >= 0, got {lateness_s}")
    if chunk < timedelta(minutes=1):
        raise ValueError(f"chunk must be at least one minute, got {chunk}")
    lateness = timedelta(seconds=lateness_s)
    minute, hour = _LEVELS
    upserted = {
        MINUTE_S: _run_level(engine, minute, floor_time(now - lateness, MINUTE_S), lateness, chunk)
    }
    with engine.connect() as connection:
        minute_mark = read_watermarks(connection).get(MINUTE_S)
    # 1-minute rows before (watermark - lateness) are final: no later pass recomputes them.
    hour_end = None if minute_mark is None else floor_time(minute_mark - lateness, HOUR_S)
    upserted[HOUR_S] = (
        0 if hour_end is None else _run_level(engine, hour, hour_end, timedelta(0), chunk * 60)
    )
    if upserted[HOUR_S]:
        vacuum(engine, ROLLUP_TABLES[HOUR_S])
    return upserted


def vacuum(engine: Engine, table: Table) -> None:
    """Mark the pages just written all-visible on PostgreSQL, so that reads the table's
    covering index can answer stay index-only (``samples_1h``: the dashboards' week-long
    panels).

    Autovacuum would get there only after a fifth of the table is new: weeks of hourly rows
    at the rollups' retention. The hourly level only inserts, so a pass finds the hour of new
    pages (and what retention deleted) and skips the rest of the table through the visibility
    map: about a millisecond for 1,000 series, on 7 days of rows as on 90. ``SKIP_LOCKED``: a
    vacuum already running on the table will do.
    """
    if engine.dialect.name != "postgresql":
        return
    # VACUUM cannot run inside a transaction block.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text(f"VACUUM (SKIP_LOCKED) {table.name}"))


def _run_level(
    engine: Engine, level: _Level, end: datetime, recompute: timedelta, chunk: timedelta
) -> int:
    begin = _pass_begin(engine, level, recompute)
    if begin is None:
        return 0
    width = timedelta(seconds=level.resolution_s)
    step = max(chunk // width * width, width)
    total = 0
    cursor = begin
    while cursor < end:
        stop = min(cursor + step, end)
        with engine.begin() as connection:
            _lock(connection)
            total += _upsert_buckets(connection, level, cursor, stop)
            _advance_watermark(connection, level.resolution_s, stop)
        cursor = stop
    return total


def _pass_begin(engine: Engine, level: _Level, recompute: timedelta) -> datetime | None:
    """Where this pass starts: ``recompute`` before the watermark, or the first data ever."""
    with engine.connect() as connection:
        watermark = read_watermarks(connection).get(level.resolution_s)
        if watermark is not None:
            return floor_time(watermark - recompute, level.resolution_s)
        first = _first_timestamp(connection, level.source)
    return None if first is None else floor_time(first, level.resolution_s)


def _first_timestamp(connection: Connection, source: Table) -> datetime | None:
    # One index probe per series on (series_id, ts): min(ts) over the whole table would scan
    # every partition, since no index leads with ts.
    ts = source.c.ts if source is samples else source.c.bucket
    first = (
        select(ts)
        .where(source.c.series_id == _series.c.id)
        .order_by(ts)
        .limit(1)
        .correlate(_series)
        .scalar_subquery()
    )
    statement = select(func.min(first)).select_from(_series)
    value: datetime | None = connection.execute(statement).scalar()
    return value


def _upsert_buckets(connection: Connection, level: _Level, begin: datetime, end: datetime) -> int:
    dialect = connection.dialect.name
    table = ROLLUP_TABLES[level.resolution_s]
    source = level.source
    ts = source.c.ts if source is samples else source.c.bucket
    # Joining series lets the planner walk the (series_id, ts) index per series instead of
    # scanning a whole partition for a few minutes of data; it also skips orphaned samples.
    rows = (
        partial_rows(source, level.resolution_s, dialect, PARTIAL_FIELDS, ts >= begin, ts < end)
        .join_from(source, _series, _series.c.id == source.c.series_id)
        .subquery("rows")
    )
    merged = select(
        rows.c.series_id,
        rows.c.bucket,
        *(merge(rows, field, dialect) for field in PARTIAL_FIELDS),
    ).group_by(rows.c.series_id, rows.c.bucket)
    fields = list(PARTIAL_FIELDS)
    if source is samples and dialect == "postgresql":
        # The energy counter's per-minute increase, which the Cost dashboard reads once the
        # samples are compacted: from the raw rows, still all there (compaction waits for us),
        # written with the row itself rather than by an UPDATE after it (a second version of
        # each counter row, and a second statement reading its samples).
        merged, fields = (
            _with_increase(merged.subquery("merged"), begin, end),
            [*fields, "increase"],
        )
    insert = _dialect_insert(dialect, table).from_select(["series_id", "bucket", *fields], merged)
    statement = insert.on_conflict_do_update(
        index_elements=[table.c.series_id, table.c.bucket],
        set_={field: insert.excluded[field] for field in fields},
    )
    # SQLAlchemy reports rowcount of an INSERT only when asked to keep it.
    result = connection.execute(statement.execution_options(preserve_rowcount=True))
    return max(result.rowcount, 0)


def _with_increase(merged: Subquery, begin: datetime, end: datetime) -> Select[Any]:
    """``merged``'s rows and their ``increase``: NULL but for the counters' minutes."""
    minutes = increase_minutes(begin, end)
    return select(*merged.c, minutes.c.increase).join_from(
        merged,
        minutes,
        (minutes.c.series_id == merged.c.series_id) & (minutes.c.bucket == merged.c.bucket),
        isouter=True,
    )


def _advance_watermark(connection: Connection, resolution_s: int, watermark: datetime) -> None:
    # Only forward: a recompute pass behind the watermark, or a concurrent pass, never moves it
    # back.
    insert = _dialect_insert(connection.dialect.name, _state).values(
        resolution_s=resolution_s, watermark=watermark
    )
    connection.execute(
        insert.on_conflict_do_update(
            index_elements=[_state.c.resolution_s],
            set_={"watermark": insert.excluded.watermark},
            where=_state.c.watermark < insert.excluded.watermark,
        )
    )


def _dialect_insert(dialect: str, table: Table) -> Any:
    if dialect == "postgresql":
        return postgresql.insert(table)
    if dialect == "sqlite":
        return sqlite.insert(table)
    raise NotImplementedError(f"rollups support PostgreSQL and SQLite, not {dialect}")


def _lock(connection: Connection) -> None:
    advisory_lock(connection, LockName.ROLLUPS)
