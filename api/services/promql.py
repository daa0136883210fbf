"""The Prometheus HTTP API over one project's series, in the store or the TSDB: PromQL queries
(:mod:`tuneloop.promql`), series, label names and values, shaped as Prometheus answers them
(``data`` of its envelope).

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
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.timeseries.query import METRIC_LABEL, TooManySeries
from tuneloop.storage.timeseries.store_backend import StoreBackend
from tuneloop.storage.timeseries.times import parse_duration_ms, parse_time
from tuneloop.storage.timeseries.types import Matcher
from tuneloop.storage.types import to_micros

MAX_POINTS_PER_SERIES: Final = 11_000
"""Prometheus' limit on the points of one series of a range query."""
_NO_STEP: Final = (
    "zero or negative query resolution step widths are not accepted. Try a positive integer"
)


def source(
    connection: Connection, remote: TimeSeriesBackend | None, project_id: int
) -> promql.SampleSource:
    """One project's samples: in the TSDB when one is configured, else in the store read
    through ``connection`` (whose time limit bounds the query)."""
    backend = remote if remote is not None else StoreBackend(connection)
    return promql.BackendSource(backend, project_id, max_series=MAX_SERIES_PER_RESPONSE)


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
    remote: TimeSeriesBackend | None,
    project_id: int,
    match: Sequence[str],
    start: str | None,
    end: str | None,
) -> list[dict[str, str]]:
    """The series with a sample in ``[start, end]`` (in a TSDB without ``start``: in its
    default lookback, see the contract)."""
    if not match:
        raise PromQLError("no match[] parameter provided")
    low, high = _range(start, end)
    if remote is None:
        return raw.series_in_range(
            connection,
            project_id,
            _selectors(match),
            low,
            high,
            max_series=MAX_SERIES_PER_RESPONSE,
        )
    seen: dict[int, dict[str, str]] = {}
    for matchers in _selectors(match):
        for info in remote.find_series(
            project_id, None, matchers, max_series=MAX_SERIES_PER_RESPONSE, start=low, end=high
        ):
            seen[info.id] = {METRIC_LABEL: info.metric, **info.labels}
        if len(seen) > MAX_SERIES_PER_RESPONSE:
            raise TooManySeries(MAX_SERIES_PER_RESPONSE)
    return list(seen.values())


def label_names(
    connection: Connection,
    remote: TimeSeriesBackend | None,
    project_id: int,
    match: Sequence[str],
    start: str | None,
    end: str | None,
) -> list[str]:
    low, high = _range(start, end)
    if remote is None:
        return raw.label_names(connection, project_id, _selectors(match), low, high)
    names: set[str] = set()
    for matchers in _selectors(match) or [()]:
        names.update(remote.label_names(project_id, matchers, start=low, end=high))
    return sorted(names)


def label_values(
    connection: Connection,
    remote: TimeSeriesBackend | None,
    project_id: int,
    name: str,
    match: Sequence[str],
    start: str | None,
    end: str | None,
) -> list[str]:
    low, high = _range(start, end)
    if remote is None:
        return raw.label_values(connection, project_id, name, _selectors(match), low, high)
    values: set[str] = set()
    for matchers in _selectors(match) or [()]:
        values.update(remote.label_values(project_id, name, matchers, start=low, end=high))
    return sorted(values)


def metadata(
    connection: Connection, remote: TimeSeriesBackend | None, project_id: int
) -> dict[str, list[dict[str, str]]]:
    if remote is None:
        kinds = raw.metric_kinds(connection, project_id)
    else:
        found = remote.find_series(project_id, None)
        kinds = sorted({(info.metric, str(info.kind.value)) for info in found})
    return {metric: [{"type": kind, "help": "", "unit": ""}] for metric, kind in kinds}
