"""Read side of the time-series store: series lookup, range queries and latest values.

Every aggregation runs in SQL, on PostgreSQL and SQLite alike. A range query reads the rollup
tables for the part of the range they cover completely (up to their watermark) and raw samples
for the rest, and merges the partial aggregates of both in one ``GROUP BY``, so the answer does
not depend on which source served which minute.

Regular expressions are RE2 (:mod:`tuneloop.regex`), fully anchored as PromQL matchers are:
SQLite matches with RE2 itself (linear time); PostgreSQL runs its own ``~`` on a pattern RE2
has accepted first, so both backends take the same language.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    Boolean,
    ColumnElement,
    Connection,
    Engine,
    Float,
    FromClause,
    Row,
    Select,
    Subquery,
    Table,
    func,
    literal_column,
    not_,
    select,
    true,
    union_all,
)
from sqlalchemy.exc import DBAPIError

from tuneloop.regex import InvalidRegex, compile_anchored, postgres_pattern
from tuneloop.storage.models import ROLLUP_TABLES, Series, samples
from tuneloop.storage.timeseries.query_checks import (
    MAX_POINTS_PER_SERIES as MAX_POINTS_PER_SERIES,
)
from tuneloop.storage.timeseries.query_checks import check_aware, check_query
from tuneloop.storage.timeseries.range_plan import Segment, plan_segments, rollup_tiers
from tuneloop.storage.timeseries.rollups import (
    merge,
    partial_rows,
    time_bucket,
)
from tuneloop.storage.timeseries.sample_source import (
    TimeRange,
    any_chunked,
    flag_chunked,
    newest_in_chunks,
    sample_rows,
)
from tuneloop.storage.timeseries.types import (
    Aggregation,
    LatestSample,
    Matcher,
    MatchOp,
    RangeSeries,
    SeriesInfo,
    SeriesKind,
)

METRIC_LABEL = "__name__"
"""Matcher name that matches the metric name instead of a label, as in PromQL."""

Bind = Engine | Connection

_series = cast(Table, Series.__table__)
_INVALID_REGEX_SQLSTATE = "2201B"

# Partial fields each aggregation needs from raw samples and rollup rows alike.
_NEEDED: dict[Aggregation, tuple[str, ...]] = {
    Aggregation.AVG: ("sum", "count"),
    Aggregation.MIN: ("min",),
    Aggregation.MAX: ("max",),
    Aggregation.SUM: ("sum",),
    Aggregation.COUNT: ("count",),
    Aggregation.LAST: ("last", "last_ts"),
}


class TooManySeries(ValueError):
    """A selector matches more series than the caller allows in one answer."""

    def __init__(self, max_series: int) -> None:
        super().__init__(
            f"the selector matches more than {max_series} series; narrow it with more matchers"
        )
        self.max_series = max_series


# --------------------------------------------------------------------------- series


def find_series(
    bind: Bind,
    project_id: int,
    metric: str | None,
    matchers: Sequence[Matcher] = (),
    *,
    max_series: int | None = None,
) -> list[SeriesInfo]:
    """Series of ``project_id`` named ``metric`` (any name if ``None``) whose labels satisfy
    every matcher. Ordered by metric, then id. Raises :class:`TooManySeries` if more than
    ``max_series`` match (reading at most one more than that)."""
    with use_connection(bind) as connection:
        conditions = series_conditions(connection.dialect.name, project_id, metric, matchers)
        rows = _capped_rows(connection, _lookup(conditions), max_series)
    return [_series_info(row) for row in rows]


def _lookup(conditions: list[ColumnElement[bool]]) -> Select[Any]:
    return (
        select(_series.c.id, _series.c.metric, _series.c.labels, _series.c.kind)
        .where(*conditions)
        .order_by(_series.c.metric, _series.c.id)
    )


def _capped_rows(
    connection: Connection, statement: Select[Any], max_series: int | None
) -> Sequence[Row[Any]]:
    """The rows of ``statement`` (one per series); :class:`TooManySeries` past
    ``max_series``, found by reading one row more, never all of them."""
    if max_series is not None:
        statement = statement.limit(max_series + 1)
    with regex_errors():
        rows = connection.execute(statement).all()
    if max_series is not None and len(rows) > max_series:
        raise TooManySeries(max_series)
    return rows


def matched_series(
    connection: Connection,
    project_id: int,
    metric: str | None,
    matchers: Sequence[Matcher],
    max_series: int | None,
    ranges: Sequence[TimeRange] = (),
) -> tuple[list[SeriesInfo], Select[Any], bool]:
    """What a read of samples covers: the matching series (:class:`TooManySeries` before any
    sample is read), the statement of their ids that the sample read selects with, and
    whether a chunk of theirs overlaps ``ranges`` (:func:`flag_chunked`: ``sample_rows``'s
    ``chunked``)."""
    conditions = series_conditions(connection.dialect.name, project_id, metric, matchers)
    lookup = (
        flag_chunked(connection, _lookup(conditions), ranges) if ranges else _lookup(conditions)
    )
    rows = _capped_rows(connection, lookup, max_series)
    ids = select(_series.c.id).where(*conditions)
    return [_series_info(row) for row in rows], ids, bool(ranges) and any_chunked(rows)


def series_conditions(
    dialect: str, project_id: int, metric: str | None, matchers: Sequence[Matcher]
) -> list[ColumnElement[bool]]:
    """WHERE conditions on ``series`` for a selector. Every value and label name is bound."""
    conditions: list[ColumnElement[bool]] = [_series.c.project_id == project_id]
    if metric is not None:
        conditions.append(_series.c.metric == metric)
    conditions.extend(_matcher_condition(dialect, matcher) for matcher in matchers)
    return conditions


def _matcher_condition(dialect: str, matcher: Matcher) -> ColumnElement[bool]:
    value = _label_value(dialect, matcher.name)
    op = MatchOp(matcher.op)
    if op is MatchOp.EQ:
        return value == matcher.value
    if op is MatchOp.NE:
        return value != matcher.value
    matches = _regex_match(dialect, value, matcher)
    return matches if op is MatchOp.RE else not_(matches)


def _label_value(dialect: str, name: str) -> ColumnElement[str]:
    if name == METRIC_LABEL:
        return cast(ColumnElement[str], _series.c.metric)
    if not name:
        raise ValueError("a matcher needs a label name")
    if dialect == "sqlite" and '"' in name:
        # SQLite's JSON path $."name" cannot escape a quote: look the key up in json_each.
        pairs = func.json_each(_series.c.labels).table_valued("key", "value")
        value: ColumnElement[Any] = (
            select(pairs.c.value).where(pairs.c.key == name).scalar_subquery()
        )
    else:
        value = _series.c.labels[name].as_string()
    # A missing label matches as the empty string, as in PromQL.
    return func.coalesce(value, "")


def _regex_match(dialect: str, value: ColumnElement[str], matcher: Matcher) -> ColumnElement[bool]:
    # RE2 checks the pattern on both backends, so both accept the same language.
    try:
        if dialect == "postgresql":
            return value.regexp_match(postgres_pattern(matcher.value))
        compile_anchored(matcher.value)
    except InvalidRegex as exc:
        raise InvalidRegex(exc.pattern, exc.reason, f" for label {matcher.name!r}") from None
    # The engine registers regexp(pattern, value) with RE2's full match: already anchored.
    return func.regexp(matcher.value, value, type_=Boolean())


@contextmanager
def regex_errors() -> Iterator[None]:
    # A pattern Python accepts can still be one PostgreSQL's ARE engine rejects.
    try:
        yield
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) == _INVALID_REGEX_SQLSTATE:
            raise ValueError(f"invalid regular expression for PostgreSQL: {exc.orig}") from None
        raise


def _series_info(row: Row[*tuple[Any, ...]]) -> SeriesInfo:
    return SeriesInfo(
        id=row.id, metric=row.metric, labels=dict(row.labels), kind=SeriesKind(row.kind)
    )


@contextmanager
def use_connection(bind: Bind) -> Iterator[Connection]:
    if isinstance(bind, Connection):
        yield bind
    else:
        with bind.connect() as connection:
            yield connection


# --------------------------------------------------------------------------- range queries


def query_range(
    bind: Bind,
    project_id: int,
    metric: str | None,
    matchers: Sequence[Matcher] = (),
    *,
    start: datetime,
    end: datetime,
    step_s: int,
    aggregation: Aggregation,
    q: float | None = None,
    use_rollups: bool = True,
    max_series: int | None = None,
) -> list[RangeSeries]:
    """Samples in ``[start, end)`` of each matching series, aggregated into buckets of
    ``step_s`` seconds aligned to epoch multiples of ``step_s`` (the first bucket may start
    before ``start``; it aggregates only samples from ``start`` on). Series without samples in
    the range are left out; points are sorted by bucket start. Raises :class:`TooManySeries`,
    before reading any sample, if more than ``max_series`` series match."""
    aggregation = Aggregation(aggregation)
    check_query(start, end, step_s, aggregation, q)
    with use_connection(bind) as connection:
        dialect = connection.dialect.name
        if aggregation is Aggregation.QUANTILE:
            raw: list[TimeRange] = [(start, end)]
        else:
            tiers = rollup_tiers(connection, step_s) if use_rollups else []
            segments = plan_segments(start, end, tiers)
            raw = [(s.start, s.end) for s in segments if s.width_s is None]
        matching, ids, chunked = matched_series(
            connection, project_id, metric, matchers, max_series, raw
        )
        found = {info.id: info for info in matching}
        if not found:
            return []
        source = sample_rows(connection, ids, raw, chunked=chunked) if raw else samples
        if aggregation is Aggregation.QUANTILE:
            assert q is not None
            statement = _quantile_statement(dialect, source, ids, start, end, step_s, q)
        else:
            statement = _merged_statement(dialect, source, ids, segments, step_s, aggregation)
        with regex_errors():
            rows = connection.execute(statement).all()
    return _range_series(found, rows)


def _merged_statement(
    dialect: str,
    source: FromClause,
    ids: Select[Any],
    segments: list[Segment],
    step_s: int,
    aggregation: Aggregation,
) -> Select[Any]:
    fields = _NEEDED[aggregation]
    # One branch per segment: a plain time range per branch lets each index scan bound it.
    branches = [_branch(dialect, source, ids, segment, step_s, fields) for segment in segments]
    rows = (branches[0] if len(branches) == 1 else union_all(*branches)).subquery("rows")
    return _grouped(rows, _value(rows, aggregation, dialect))


def _branch(
    dialect: str,
    source: FromClause,
    ids: Select[Any],
    segment: Segment,
    step_s: int,
    fields: Sequence[str],
) -> Select[Any]:
    table: FromClause
    if segment.width_s is None:
        table, ts = source, source.c.ts
    else:
        table = ROLLUP_TABLES[segment.width_s]
        ts = table.c.bucket
    return partial_rows(
        table,
        step_s,
        dialect,
        fields,
        table.c.series_id.in_(ids),
        ts >= segment.start,
        ts < segment.end,
    )


def _value(rows: Subquery, aggregation: Aggregation, dialect: str) -> ColumnElement[Any]:
    if aggregation is Aggregation.AVG:
        # Total sum over total count, so partials from both sources weigh by their samples.
        return cast(ColumnElement[Any], merge(rows, "sum", dialect) / merge(rows, "count", dialect))
    field = {
        Aggregation.MIN: "min",
        Aggregation.MAX: "max",
        Aggregation.SUM: "sum",
        Aggregation.COUNT: "count",
        Aggregation.LAST: "last",
    }[aggregation]
    return cast(ColumnElement[Any], merge(rows, field, dialect))


def _quantile_statement(
    dialect: str,
    source: FromClause,
    ids: Select[Any],
    start: datetime,
    end: datetime,
    step_s: int,
    q: float,
) -> Select[Any]:
    # Quantiles cannot be merged from partials: always raw samples.
    rows = (
        select(
            source.c.series_id,
            time_bucket(source.c.ts, step_s, dialect).label("bucket"),
            source.c.value,
        )
        .where(source.c.series_id.in_(ids), source.c.ts >= start, source.c.ts < end)
        .subquery("rows")
    )
    value = rows.c.value
    if dialect == "postgresql":
        quantile: ColumnElement[Any] = func.percentile_cont(float(q)).within_group(value)
    else:
        quantile = func.tl_quantile(value, float(q), type_=Float(precision=53))
    return _grouped(rows, quantile)


def _grouped(rows: Subquery, value: ColumnElement[Any]) -> Select[Any]:
    return (
        select(rows.c.series_id, rows.c.bucket, value.label("value"))
        .group_by(rows.c.series_id, rows.c.bucket)
        .order_by(rows.c.series_id, rows.c.bucket)
    )


def _range_series(
    found: dict[int, SeriesInfo], rows: Sequence[Row[*tuple[Any, ...]]]
) -> list[RangeSeries]:
    points: dict[int, list[tuple[datetime, float]]] = {}
    for row in rows:
        # A series created after the lookup is not in ``found``; it is left for the next query.
        if row.series_id in found and row.value is not None:
            points.setdefault(row.series_id, []).append((row.bucket, float(row.value)))
    return [RangeSeries(info, points[sid]) for sid, info in found.items() if sid in points]


# --------------------------------------------------------------------------- latest


def latest(
    bind: Bind,
    project_id: int,
    metric: str | None,
    matchers: Sequence[Matcher] = (),
    *,
    since: datetime | None = None,
    max_series: int | None = None,
) -> list[LatestSample]:
    """The newest sample of each matching series (at or after ``since`` if given, which on
    PostgreSQL also keeps older partitions out of the scan). Series without one are left out.
    Raises :class:`TooManySeries` if more than ``max_series`` series have one."""
    if since is not None:
        check_aware(since)
    with use_connection(bind) as connection:
        dialect = connection.dialect.name
        statement = latest_statement(dialect, project_id, metric, matchers, since)
        ids = select(_series.c.id).where(*series_conditions(dialect, project_id, metric, matchers))
        with regex_errors():
            in_chunks = newest_in_chunks(connection, ids, since)
        if not in_chunks:
            # Stops probing after one series too many instead of probing every match.
            rows = _capped_rows(connection, statement, max_series)
            return [LatestSample(_series_info(row), row.ts, float(row.value)) for row in rows]
        with regex_errors():
            raw = {row.id: row for row in connection.execute(statement)}
            infos = find_series(connection, project_id, metric, matchers)
    found = []
    for info in infos:
        row, chunk = raw.get(info.id), in_chunks.get(info.id)
        # On an equal time the chunk's sample is the one stored first.
        if chunk is not None and (row is None or chunk[0] >= row.ts):
            found.append(LatestSample(info, chunk[0], chunk[1]))
        elif row is not None:
            found.append(LatestSample(info, row.ts, float(row.value)))
    if max_series is not None and len(found) > max_series:
        raise TooManySeries(max_series)
    return found


def latest_statement(
    dialect: str,
    project_id: int,
    metric: str | None,
    matchers: Sequence[Matcher] = (),
    since: datetime | None = None,
) -> Select[Any]:
    """The query behind :func:`latest`: one backward probe of the (series_id, ts) index per
    series, never a scan of all samples."""
    conditions = series_conditions(dialect, project_id, metric, matchers)
    columns = (_series.c.id, _series.c.metric, _series.c.labels, _series.c.kind)
    if dialect == "postgresql":
        newest = _newest(samples, since).with_only_columns(samples.c.ts, samples.c.value)
        lateral = newest.lateral("newest")
        return (
            select(*columns, lateral.c.ts, lateral.c.value)
            .select_from(_series.join(lateral, true()))
            .where(*conditions)
            .order_by(_series.c.metric, _series.c.id)
        )
    # SQLite has no LATERAL: join the one row whose rowid the correlated subquery picks.
    newest_sample = samples.alias("newest_sample")
    pick = (
        _newest(newest_sample, since)
        .with_only_columns(literal_column("newest_sample.rowid"))
        .correlate(_series)
        .scalar_subquery()
    )
    return (
        select(*columns, samples.c.ts, samples.c.value)
        .select_from(_series.join(samples, literal_column("samples.rowid") == pick))
        .where(*conditions)
        .order_by(_series.c.metric, _series.c.id)
    )


def _newest(table: Any, since: datetime | None) -> Select[Any]:
    statement = (
        select(table.c.ts)
        .where(table.c.series_id == _series.c.id)
        .order_by(table.c.ts.desc())
        .limit(1)
    )
    return statement if since is None else statement.where(table.c.ts >= since)
