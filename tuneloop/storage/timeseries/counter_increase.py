"""A counter's per-minute increase in ``samples_1m.increase``, on PostgreSQL: what the Cost
dashboard's ``tuneloop_gpu_usage`` reads for energy over spans that compaction has turned into
chunks (pcodec has no SQL decoder, so the function cannot pair the compacted samples itself).

A minute's increase is the growth over every pair of consecutive samples of the series whose
later sample lies in the minute, the earlier one possibly in an earlier minute; a decrease is a
reset and counts the new value (``tuneloop.cost.counter_growth``'s rule). The first sample of a
series has no pair. Minutes of the series with samples get a value (0.0 when nothing grew);
every other row, and every series whose metric is not in :data:`INCREASE_METRICS`, stays NULL.

The 1-minute rollup pass writes it with the rows it (re)computes, in its upsert
(:func:`increase_minutes` joined to the minute rows), reading raw rows, which compaction never
touches before that pass has run; the sample before the pass's first minute is the ``last`` of
the series' latest 1-minute row before it. Migration 0015 fills it for the rows that existed
before (:func:`update_increase`), reading through :func:`.sample_source.sample_rows` (chunks
too).
SQLite has no stored functions, and the API reads samples: the column stays NULL there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import cast

from sqlalchemy import (
    Connection,
    DateTime,
    FromClause,
    Interval,
    Subquery,
    Table,
    case,
    func,
    literal,
    select,
    true,
    union_all,
    update,
)

from tuneloop.storage.models import Series, samples, samples_1m
from tuneloop.storage.timeseries.sample_source import sample_rows
from tuneloop.storage.types import UTCDateTime

INCREASE_METRICS = ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",)
"""The counters whose per-minute increase is kept: those a SQL function reads."""

_series = cast(Table, Series.__table__)
_DAY = timedelta(days=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def update_increase(
    connection: Connection,
    begin: datetime,
    end: datetime,
    *,
    source: FromClause = samples,
    series_ids: Sequence[int] | None = None,
) -> int:
    """Set ``increase`` on the 1-minute rows in ``[begin, end)`` of the counters (of
    ``series_ids`` when given) from the samples of ``source`` (``samples``, or what
    :func:`.sample_source.sample_rows` gives); return the rows changed. PostgreSQL only (a
    no-op elsewhere). ``begin`` must be a whole minute."""
    if connection.dialect.name != "postgresql":
        return 0
    minutes = increase_minutes(begin, end, source=source, series_ids=series_ids)
    statement = (
        update(samples_1m)
        .where(
            samples_1m.c.series_id == minutes.c.series_id,
            samples_1m.c.bucket == minutes.c.bucket,
            # A recompute that finds the same figure rewrites no row.
            samples_1m.c.increase.is_distinct_from(minutes.c.increase),
        )
        .values(increase=minutes.c.increase)
    )
    result = connection.execute(statement)
    return max(result.rowcount, 0)


def increase_minutes(
    begin: datetime,
    end: datetime,
    *,
    source: FromClause = samples,
    series_ids: Sequence[int] | None = None,
) -> Subquery:
    """(series_id, bucket, increase) of the counters' minutes in ``[begin, end)`` that have
    samples in ``source``, in PostgreSQL's SQL. ``begin`` must be a whole minute."""
    counters = select(_series.c.id).where(_series.c.metric.in_(INCREASE_METRICS))
    if series_ids is not None:
        counters = counters.where(_series.c.id.in_(list(series_ids)))
    ids = counters.subquery("counters")
    start, stop = literal(begin, UTCDateTime()), literal(end, UTCDateTime())
    raw = select(source.c.series_id, source.c.ts, source.c.value).where(
        source.c.series_id.in_(select(ids.c.id)), source.c.ts >= start, source.c.ts < stop
    )
    # The sample before the first minute: the last of the latest 1-minute row before it (one
    # probe of the primary key per counter; the raw row may be compacted by now).
    before = (
        select(samples_1m.c.last_ts, samples_1m.c.last)
        .where(samples_1m.c.series_id == ids.c.id, samples_1m.c.bucket < start)
        .order_by(samples_1m.c.bucket.desc())
        .limit(1)
        .lateral("before")
    )
    anchors = select(ids.c.id, before.c.last_ts, before.c.last).select_from(
        ids.join(before, true())
    )
    points = union_all(raw, anchors).subquery("points")
    previous = func.lag(points.c.value).over(partition_by=points.c.series_id, order_by=points.c.ts)
    paired = select(
        points.c.series_id, points.c.ts, points.c.value, previous.label("previous")
    ).subquery("paired")
    growth = case(
        (paired.c.value >= paired.c.previous, paired.c.value - paired.c.previous),
        else_=paired.c.value,
    )
    bucket = func.date_bin(
        literal(timedelta(minutes=1), Interval()),
        paired.c.ts,
        literal(_EPOCH, DateTime(timezone=True)),
    )
    minutes = (
        select(
            paired.c.series_id,
            bucket.label("bucket"),
            func.coalesce(func.sum(growth).filter(paired.c.previous.is_not(None)), 0.0).label(
                "increase"
            ),
        )
        .where(paired.c.ts >= start)
        .group_by(paired.c.series_id, bucket)
        .subquery("minutes")
    )
    return minutes


def fill_increase(
    connection: Connection,
    until: datetime,
    *,
    batch_series: int = 100,
    progress: Callable[[str], None] | None = None,
) -> int:
    """Fill ``increase`` for the counters' 1-minute rows before ``until`` (the 1-minute
    watermark) that have none, from every sample the store holds (rows and chunks), a day of a
    batch of series per statement, in the caller's transaction; return the rows filled.
    PostgreSQL only. A minute whose samples retention has deleted keeps NULL (nothing to
    compute it from)."""
    if connection.dialect.name != "postgresql":
        return 0
    say = progress or (lambda _line: None)
    ids = list(
        connection.execute(
            select(_series.c.id)
            .where(_series.c.metric.in_(INCREASE_METRICS))
            .order_by(_series.c.id)
        ).scalars()
    )
    filled = 0
    for first in range(0, len(ids), batch_series):
        batch = ids[first : first + batch_series]
        day = _first_unfilled(connection, batch, until)
        while day is not None and day < until:
            stop = min(day + _DAY, until)
            source = sample_rows(connection, batch, [(day, stop)])
            filled += update_increase(connection, day, stop, source=source, series_ids=batch)
            day = stop
        say(f"counter increase: {first + len(batch)} of {len(ids)} series, {filled} minutes")
    return filled


def _first_unfilled(
    connection: Connection, batch: Sequence[int], until: datetime
) -> datetime | None:
    """The day start of the batch's oldest 1-minute row without an increase."""
    oldest = connection.execute(
        select(func.min(samples_1m.c.bucket)).where(
            samples_1m.c.series_id.in_(batch),
            samples_1m.c.bucket < until,
            samples_1m.c.increase.is_(None),
        )
    ).scalar()
    if oldest is None:
        return None
    day: datetime = oldest - (oldest - _EPOCH) % _DAY
    return day
