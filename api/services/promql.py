"""The Prometheus HTTP API over one project's store: PromQL queries (:mod:`tuneloop.promql`),
series, label names and values, shaped as Prometheus answers them (``data`` of its envelope).

Parameters arrive as text, as Prometheus takes them (times as RFC 3339 or Unix seconds, steps
and timeouts as seconds or durations); what is wrong with them is a :class:`PromQLError`,
which the routes answer as Prometheus does (400, ``errorType`` ``bad_data``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final

import numpy as np
import promql_parser
from sqlalchemy import Connection

from api.services.series import MAX_SERIES_PER_RESPONSE, prom_value
from tuneloop import promql
from tuneloop.promql.parse import matchers as selector_matchers
from tuneloop.promql.values import PromQLError, Series
from tuneloop.storage.timeseries import raw
from tuneloop.storage.timeseries.raw import RawSeries
from tuneloop.storage.timeseries.times import parse_duration_ms, parse_time
from tuneloop.storage.timeseries.types import Matcher
from tuneloop.storage.types import to_micros

MAX_POINTS_PER_SERIES: Final = 11_000
"""Prometheus' limit on the points of one series of a range query."""
_NO_STEP: Final = (
    "zero or negative query resolution step widths are not accepted. Try a positive integer"
)


class StoreSource:
    """One project's samples, as the PromQL engine reads them."""

    def __init__(self, connection: Connection, project_id: int) -> None:
        self.connection = connection
        self.project_id = project_id

    def count(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, limit: int) -> int:
        return raw.count_samples(
            self.connection, self.project_id, matchers, start_ms, end_ms, limit
        )

    def read(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[RawSeries]:
        return raw.read(
            self.connection,
            self.project_id,
            matchers,
            start_ms,
            end_ms,
            max_series=MAX_SERIES_PER_RESPONSE,
        )


# --------------------------------------------------------------------------- parameters


def time_ms(text: str | None, name: str, default: datetime | None = None) -> int:
    """A time parameter in milliseconds (rounded to the millisecond, as Prometheus)."""
    if text is None:
        if default is None:
            raise PromQLError(f"missing parameter {name!r}")
        return round(to_micros(default) / 1000)
    try:
        return round(to_micros(parse_time(text)) / 1000)
    except ValueError as exc:
        raise PromQLError(f'invalid parameter "{name}": {exc}') from None


def duration_ms(text: str, name: str) -> int:
    """Seconds (``15``, ``0.5``) or a duration (``15s``, ``1m30s``), in milliseconds."""
    if name == "step" and text.lstrip("-").replace(".", "", 1).isdigit() and float(text) <= 0:
        raise PromQLError(_NO_STEP)
    try:
        return parse_duration_ms(text)
    except ValueError as exc:
        raise PromQLError(f'invalid parameter "{name}": {exc}') from None


def _selectors(match: Sequence[str]) -> list[tuple[Matcher, ...]]:
    found = []
    for text in match:
        try:
            expr = promql_parser.parse(text)
        except ValueError as exc:
            raise PromQLError(f'invalid parameter "match[]": {exc}') from None
        if not isinstance(expr, promql_parser.VectorSelector):
            raise PromQLError(f'invalid parameter "match[]": {text!r} is not a series selector')
        found.append(selector_matchers(expr))
    return found


# --------------------------------------------------------------------------- queries


def instant_query(
    source: promql.SampleSource, text: str, at_ms: int, *, max_samples: int, timeout_s: float
) -> dict[str, Any]:
    result = promql.query(
        source, text, at_ms, at_ms, 1, max_samples=max_samples, timeout_s=timeout_s
    )
    value = result.value
    at = _seconds(at_ms)
    if isinstance(value, promql.Scalar):
        return {"resultType": "scalar", "result": [at, prom_value(float(value.values[0]))]}
    if isinstance(value, promql.String):
        return {"resultType": "string", "result": [at, value.value]}
    if isinstance(value, promql.RangeVector):
        return {
            "resultType": "matrix",
            "result": [
                {"metric": s.labels, "values": _points(s.times_ms, s.values)}
                for s in value.series
                if len(s.values)
            ],
        }
    vector = value if result.ordered else sorted(value, key=lambda s: sorted(s.labels.items()))
    return {
        "resultType": "vector",
        "result": [
            {"metric": s.labels, "value": [at, prom_value(float(s.values[0]))]}
            for s in vector
            if s.present[0]
        ],
    }


def range_query(
    source: promql.SampleSource,
    text: str,
    start_ms: int,
    end_ms: int,
    step_ms: int,
    *,
    max_samples: int,
    timeout_s: float,
) -> dict[str, Any]:
    if end_ms < start_ms:
        raise PromQLError("end timestamp must not be before start time")
    if step_ms <= 0:
        raise PromQLError(
            "zero or negative query resolution step widths are not accepted. Try a positive integer"
        )
    if (end_ms - start_ms) // step_ms > MAX_POINTS_PER_SERIES:
        raise PromQLError(
            f"exceeded maximum resolution of {MAX_POINTS_PER_SERIES:,} points per timeseries. "
            "Try decreasing the query resolution (?step=XX)"
        )
    result = promql.query(
        source, text, start_ms, end_ms, step_ms, max_samples=max_samples, timeout_s=timeout_s
    )
    value = result.value
    if isinstance(value, promql.Scalar):
        series = [Series({}, value.values, np.ones(len(value.values), bool))]
    else:
        assert isinstance(value, list)
        series = sorted(value, key=lambda s: sorted(s.labels.items()))
    times = result.times_ms
    return {
        "resultType": "matrix",
        "result": [
            {"metric": s.labels, "values": _points(times[s.present], s.values[s.present])}
            for s in series
            if s.present.any()
        ],
    }


def _seconds(ms: int) -> int | float:
    return ms // 1000 if ms % 1000 == 0 else ms / 1000


def _points(times_ms: Any, values: Any) -> list[list[Any]]:
    return [
        [_seconds(t), prom_value(v)]
        for t, v in zip(times_ms.tolist(), values.tolist(), strict=True)
    ]


# --------------------------------------------------------------------------- metadata


def _range(start: str | None, end: str | None) -> tuple[datetime | None, datetime | None]:
    def parsed(text: str | None, name: str) -> datetime | None:
        if text is None:
            return None
        return datetime.fromtimestamp(time_ms(text, name) / 1000, tz=UTC)

    return parsed(start, "start"), parsed(end, "end")


def series(
    connection: Connection,
    project_id: int,
    match: Sequence[str],
    start: str | None,
    end: str | None,
) -> list[dict[str, str]]:
    if not match:
        raise PromQLError("no match[] parameter provided")
    low, high = _range(start, end)
    return raw.series_in_range(
        connection,
        project_id,
        _selectors(match),
        low,
        high,
        max_series=MAX_SERIES_PER_RESPONSE,
    )


def label_names(
    connection: Connection,
    project_id: int,
    match: Sequence[str],
    start: str | None,
    end: str | None,
) -> list[str]:
    low, high = _range(start, end)
    return raw.label_names(connection, project_id, _selectors(match), low, high)


def label_values(
    connection: Connection,
    project_id: int,
    name: str,
    match: Sequence[str],
    start: str | None,
    end: str | None,
) -> list[str]:
    low, high = _range(start, end)
    return raw.label_values(connection, project_id, name, _selectors(match), low, high)


def metadata(connection: Connection, project_id: int) -> dict[str, list[dict[str, str]]]:
    return {
        metric: [{"type": kind, "help": "", "unit": ""}]
        for metric, kind in raw.metric_kinds(connection, project_id)
    }
