"""Raw samples of many series at once, for engines that evaluate queries themselves (PromQL).

A read selects series by PromQL matchers (the metric as a ``__name__`` matcher, any matcher
kind; :func:`~tuneloop.storage.timeseries.query.series_conditions` builds the SQL) and returns
each series' samples in ``(start, end]`` as numpy arrays, times in milliseconds as Prometheus
counts them. Before a read, :func:`count_samples` tells how many samples it would load,
reading at most one index entry past a limit, so that an expression too large is refused
before anything is loaded.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import numpy as np
from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    FromClause,
    LargeBinary,
    Select,
    Table,
    exists,
    func,
    literal,
    select,
    true,
)
from sqlalchemy.sql.expression import type_coerce

from tuneloop.storage.models import Series, samples
from tuneloop.storage.timeseries.columns import Float64Array, Int64Array
from tuneloop.storage.timeseries.query import (
    METRIC_LABEL,
    TooManySeries,
    regex_errors,
    series_conditions,
)
from tuneloop.storage.timeseries.sample_source import (
    SampleArrays,
    any_chunked,
    compacted_inside,
    compacted_samples,
    flag_chunked,
    sample_rows,
    with_raw,
)
from tuneloop.storage.timeseries.types import Matcher, MatchOp
from tuneloop.storage.types import from_micros

_series = cast(Table, Series.__table__)
_POSTGRES_EPOCH_US = 946_684_800_000_000
"""PostgreSQL's binary timestamps count microseconds from 2000-01-01, not from 1970."""


@dataclass(frozen=True, slots=True)
class RawSeries:
    """One series' labels (``__name__`` included) and samples, oldest first."""

    labels: dict[str, str]
    times_ms: Int64Array
    values: Float64Array


def _conditions(
    dialect: str, project_id: int, matchers: Sequence[Matcher]
) -> list[ColumnElement[bool]]:
    # An equality on the name goes to the metric column, which the series index leads with.
    metric = next(
        (m.value for m in matchers if m.name == METRIC_LABEL and m.op is MatchOp.EQ), None
    )
    rest = [m for m in matchers if not (m.name == METRIC_LABEL and m.op is MatchOp.EQ)]
    return series_conditions(dialect, project_id, metric, rest)


def _sample_range(source: FromClause, start_ms: int, end_ms: int) -> list[ColumnElement[bool]]:
    return [
        source.c.ts > from_micros(start_ms * 1000),
        source.c.ts <= from_micros(end_ms * 1000),
    ]


def _compacted(
    connection: Connection, ids: Select[Any], start_ms: int, end_ms: int, chunked: bool = True
) -> SampleArrays | None:
    """The compacted samples in ``(start_ms, end_ms]``, ``None`` when no chunk overlaps."""
    bounds = (from_micros(start_ms * 1000), from_micros(end_ms * 1000))
    found = compacted_samples(connection, ids, [bounds], chunked=chunked)
    return None if found is None else found.take(found.micros > start_ms * 1000)


def count_samples(
    connection: Connection,
    project_id: int,
    matchers: Sequence[Matcher],
    start_ms: int,
    end_ms: int,
    limit: int,
) -> int:
    """Samples a :func:`read` of the same arguments would load, counted up to ``limit + 1``
    (an index-only scan that stops there, never a count of everything)."""
    ids = select(_series.c.id).where(*_conditions(connection.dialect.name, project_id, matchers))
    bounds = (from_micros(start_ms * 1000), from_micros(end_ms * 1000))
    with regex_errors():
        # Past the limit on whole chunks alone: refused without decoding anything.
        if compacted_inside(connection, ids, bounds) > limit:
            return limit + 1
        compacted = _compacted(connection, ids, start_ms, end_ms)
    in_range = [samples.c.series_id.in_(ids), *_sample_range(samples, start_ms, end_ms)]
    if compacted is None:
        bounded = select(samples.c.series_id).where(*in_range).limit(limit + 1).subquery("bounded")
        with regex_errors():
            return int(connection.execute(select(func.count()).select_from(bounded)).scalar_one())
    if len(compacted) > limit:
        return limit + 1
    # At most len(compacted) raw rows are late duplicates: reading that many more than the
    # limit tells whether the read passes it.
    keys = select(samples.c.series_id, _micros(connection.dialect.name, samples.c.ts))
    with regex_errors():
        rows = connection.execute(keys.where(*in_range).limit(limit + 1 + len(compacted))).all()
    raw = _arrays([row[0] for row in rows], [row[1] for row in rows], [0.0] * len(rows))
    return min(len(with_raw(compacted, raw)), limit + 1)


def read(
    connection: Connection,
    project_id: int,
    matchers: Sequence[Matcher],
    start_ms: int,
    end_ms: int,
    *,
    max_series: int | None = None,
) -> list[RawSeries]:
    """Every series of ``project_id`` that ``matchers`` select, with its samples in
    ``(start_ms, end_ms]``; series without one are left out. One statement for the series,
    one for their samples (and, when chunks hold some of them, one for the chunks, decoded
    here). :class:`TooManySeries` past ``max_series``, before any sample."""
    dialect = connection.dialect.name
    conditions = _conditions(dialect, project_id, matchers)
    bounds = (from_micros(start_ms * 1000), from_micros(end_ms * 1000))
    statement = flag_chunked(
        connection,
        select(_series.c.id, _series.c.metric, _series.c.labels).where(*conditions),
        [bounds],
    )
    if max_series is not None:
        statement = statement.limit(max_series + 1)
    with regex_errors():
        found = connection.execute(statement).all()
    if max_series is not None and len(found) > max_series:
        raise TooManySeries(max_series)
    if not found:
        return []
    ids = select(_series.c.id).where(*conditions)
    with regex_errors():
        compacted = _compacted(connection, ids, start_ms, end_ms, any_chunked(found))
    in_range = [samples.c.series_id.in_(ids), *_sample_range(samples, start_ms, end_ms)]
    info = {row.id: {**row.labels, METRIC_LABEL: row.metric} for row in found}
    if dialect == "postgresql":
        groups = _packed(connection, in_range)
        if compacted is None:
            out = [
                RawSeries(info[series_id], micros // 1000, values)
                for series_id, micros, values in groups
                if series_id in info  # created after the lookup: left for the next query
            ]
            return _by_labels(out)
        raw = _concatenated(list(groups))
        return _by_labels(_split(info, with_raw(compacted, raw)))
    rows = connection.execute(
        select(samples.c.series_id, _micros(dialect, samples.c.ts), samples.c.value)
        .where(*in_range)
        .order_by(samples.c.series_id, samples.c.ts)
    ).all()
    raw = _arrays([row[0] for row in rows], [row[1] for row in rows], [row[2] for row in rows])
    return _split(info, raw if compacted is None else with_raw(compacted, raw))


def _micros(dialect: str, ts: ColumnElement[Any]) -> ColumnElement[Any]:
    """``ts`` as integer microseconds since the epoch."""
    if dialect == "postgresql":
        return func.timestamptz_send(ts)  # bytes, turned into a number by :func:`_arrays`
    return type_coerce(ts, BigInteger)  # SQLite keeps integer microseconds


def _packed(
    connection: Connection, in_range: list[ColumnElement[bool]]
) -> Iterator[tuple[int, Int64Array, Float64Array]]:
    """Each series' (id, times in microseconds, values), oldest first. PostgreSQL packs each
    series' times and values into two byte strings of 8-byte big-endian numbers
    (``timestamptz_send``: microseconds since 2000, ``float8send``): one row per series
    instead of one per sample, read by numpy as they are, three times faster than rows on a
    week of samples."""
    empty = literal(b"", LargeBinary)
    statement = (
        select(
            samples.c.series_id,
            func.string_agg(func.timestamptz_send(samples.c.ts), empty, type_=LargeBinary),
            func.string_agg(func.float8send(samples.c.value), empty, type_=LargeBinary),
        )
        .where(*in_range)
        .group_by(samples.c.series_id)
    )
    with regex_errors():
        result = connection.execute(statement).all()
    for series_id, packed_times, packed_values in result:
        micros = np.frombuffer(packed_times, dtype=">i8").astype(np.int64) + _POSTGRES_EPOCH_US
        values = np.frombuffer(packed_values, dtype=">f8").astype(np.float64)
        # Both aggregates see the group's rows in one order, not necessarily time order.
        order = np.argsort(micros, kind="stable")
        yield int(series_id), micros[order], values[order]


def _concatenated(groups: Sequence[tuple[int, Int64Array, Float64Array]]) -> SampleArrays:
    if not groups:
        return _arrays([], [], [])
    return SampleArrays(
        np.concatenate([np.full(len(micros), series_id) for series_id, micros, _ in groups]),
        np.concatenate([micros for _, micros, _ in groups]),
        np.concatenate([values for _, _, values in groups]),
    )


def _arrays(
    series_ids: Sequence[int], micros: Sequence[Any], values: Sequence[float]
) -> SampleArrays:
    if micros and isinstance(micros[0], bytes):  # PostgreSQL's binary timestamps
        stamps = np.frombuffer(b"".join(micros), dtype=">i8").astype(np.int64) + _POSTGRES_EPOCH_US
    else:
        stamps = np.fromiter(micros, dtype=np.int64, count=len(micros))
    return SampleArrays(
        np.fromiter(series_ids, dtype=np.int64, count=len(series_ids)),
        stamps,
        np.fromiter(values, dtype=np.float64, count=len(values)),
    )


def _split(info: dict[int, dict[str, str]], found: SampleArrays) -> list[RawSeries]:
    """One :class:`RawSeries` per series of ``found`` (sorted by series and time) that
    ``info`` knows; a series created after the lookup is left for the next query."""
    if not len(found):
        return []
    bounds = np.flatnonzero(np.diff(found.series_ids)) + 1
    starts = np.concatenate(([0], bounds))
    stops = np.concatenate((bounds, [len(found)]))
    times = found.micros // 1000
    out: list[RawSeries] = []
    for start, stop in zip(starts.tolist(), stops.tolist(), strict=True):
        labels = info.get(int(found.series_ids[start]))
        if labels is not None:
            out.append(RawSeries(labels, times[start:stop], found.values[start:stop]))
    return out


def _by_labels(out: list[RawSeries]) -> list[RawSeries]:
    out.sort(key=lambda series: (series.labels[METRIC_LABEL], sorted(series.labels.items())))
    return out


def series_in_range(
    connection: Connection,
    project_id: int,
    matcher_sets: Sequence[Sequence[Matcher]],
    start: datetime | None,
    end: datetime | None,
    *,
    max_series: int,
) -> list[dict[str, str]]:
    """Label sets (``__name__`` included) of the series any of ``matcher_sets`` selects (every
    series of the project if there is none) that have a sample in ``[start, end]``, as
    Prometheus' ``/api/v1/series`` lists them. :class:`TooManySeries` past ``max_series``."""
    dialect = connection.dialect.name
    seen: dict[int, dict[str, str]] = {}
    for matchers in matcher_sets or [()]:
        conditions = _conditions(dialect, project_id, matchers)
        with regex_errors():
            has_samples = _with_samples(connection, conditions, start, end)
        statement = (
            select(_series.c.id, _series.c.metric, _series.c.labels)
            .where(*conditions, has_samples)
            .order_by(_series.c.metric, _series.c.id)
            .limit(max_series + 1)
        )
        with regex_errors():
            for row in connection.execute(statement):
                seen[row.id] = {METRIC_LABEL: row.metric, **row.labels}
        if len(seen) > max_series:
            raise TooManySeries(max_series)
    return list(seen.values())


def metric_kinds(connection: Connection, project_id: int) -> list[tuple[str, str]]:
    """Each metric of the project once, with its kind (gauge, counter), by name."""
    statement = (
        select(_series.c.metric, func.min(_series.c.kind))
        .where(_series.c.project_id == project_id)
        .group_by(_series.c.metric)
        .order_by(_series.c.metric)
    )
    return [(row[0], row[1]) for row in connection.execute(statement)]


def _with_samples(
    connection: Connection,
    conditions: list[ColumnElement[bool]],
    start: datetime | None,
    end: datetime | None,
) -> ColumnElement[bool]:
    """The series has a sample in ``[start, end]`` (either end open when ``None``)."""
    ids = select(_series.c.id).where(*conditions)
    source = sample_rows(connection, ids, [(start, end)], presence_only=True)
    in_range = [source.c.series_id == _series.c.id]
    if start is not None:
        in_range.append(source.c.ts >= start)
    if end is not None:
        in_range.append(source.c.ts <= end)
    return exists().where(*in_range)


def label_names(
    connection: Connection,
    project_id: int,
    matcher_sets: Sequence[Sequence[Matcher]],
    start: datetime | None,
    end: datetime | None,
) -> list[str]:
    """Label names (``__name__`` included) of the series any of ``matcher_sets`` selects
    (every series of the project if there is none) with a sample in ``[start, end]``, sorted:
    one ``DISTINCT`` in SQL, however many series there are."""
    dialect = connection.dialect.name
    names: set[str] = set()
    for matchers in matcher_sets or [()]:
        matching = _conditions(dialect, project_id, matchers)
        with regex_errors():
            conditions = [*matching, _with_samples(connection, matching, start, end)]
        if dialect == "postgresql":
            key: ColumnElement[Any] = func.jsonb_object_keys(_series.c.labels)
            statement = select(key).where(*conditions).distinct()
        else:
            pairs = func.json_each(_series.c.labels).table_valued("key", "value")
            joined = _series.join(pairs, true())
            statement = select(pairs.c.key).select_from(joined).where(*conditions)
            statement = statement.distinct()
        with regex_errors():
            names.update(str(name) for name in connection.execute(statement).scalars())
            found = connection.execute(select(_series.c.id).where(*conditions).limit(1)).first()
        if found is not None:
            names.add(METRIC_LABEL)
    return sorted(names)


def label_values(
    connection: Connection,
    project_id: int,
    name: str,
    matcher_sets: Sequence[Sequence[Matcher]],
    start: datetime | None,
    end: datetime | None,
) -> list[str]:
    """The values of label ``name`` (``__name__``: metric names) among the series any of
    ``matcher_sets`` selects with a sample in ``[start, end]``, sorted, empty left out."""
    dialect = connection.dialect.name
    value: ColumnElement[Any]
    if name == METRIC_LABEL:
        value = _series.c.metric
    elif dialect == "postgresql":
        value = _series.c.labels[name].as_string()
    else:
        pairs = func.json_each(_series.c.labels).table_valued("key", "value")
        value = select(pairs.c.value).where(pairs.c.key == name).scalar_subquery()
    values: set[str] = set()
    for matchers in matcher_sets or [()]:
        matching = _conditions(dialect, project_id, matchers)
        with regex_errors():
            conditions = [*matching, _with_samples(connection, matching, start, end)]
        statement = select(value).where(*conditions).distinct()
        with regex_errors():
            values.update(str(v) for v in connection.execute(statement).scalars() if v)
    return sorted(values)
