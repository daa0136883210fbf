"""Reads of series for the API, through the time-series contract (the built-in store or a
Prometheus-compatible TSDB): plain functions from parsed parameters to response bodies. Bad
input the backend refuses (a range with too many points, too many series, a regular expression
PostgreSQL or the TSDB rejects) becomes :class:`~tuneloop.errors.InvalidInput`, which the API
answers with 422 and the backend's message."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from api.schemas.series import (
    MatrixOut,
    MatrixSeriesOut,
    RangeAggregation,
    SeriesListOut,
    SeriesOut,
    VectorOut,
    VectorSampleOut,
)
from tuneloop.errors import InvalidInput
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.timeseries.query import METRIC_LABEL
from tuneloop.storage.timeseries.types import Aggregation, Matcher, RangeSeries, SeriesInfo
from tuneloop.storage.types import to_micros

MAX_SERIES_PER_RESPONSE = 10_000
"""More series than this is a selector that needs narrowing, not an answer anyone reads."""


@dataclass(frozen=True, slots=True)
class Selector:
    """Which series: a metric name (any if ``None``) and label matchers, all of which hold."""

    metric: str | None
    matchers: tuple[Matcher, ...] = ()


@dataclass(frozen=True, slots=True)
class TimeRange:
    """Points at multiples of ``step_s`` over ``[start, end)``; ``window_s`` is the lookback
    of counter functions (``None``: one step)."""

    start: datetime
    end: datetime
    step_s: int
    window_s: int | None = None


@contextmanager
def invalid_input() -> Iterator[None]:
    """Report the store's ``ValueError`` (its way of refusing a query) as bad input."""
    try:
        yield
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def list_series(series: TimeSeriesBackend, project_id: int, selector: Selector) -> SeriesListOut:
    with invalid_input():
        found = series.find_series(
            project_id,
            selector.metric,
            selector.matchers,
            max_series=MAX_SERIES_PER_RESPONSE,
        )
    return SeriesListOut(
        series=[SeriesOut(metric=s.metric, labels=dict(s.labels), kind=s.kind) for s in found]
    )


def range_query(
    series: TimeSeriesBackend,
    project_id: int,
    selector: Selector,
    time_range: TimeRange,
    aggregation: RangeAggregation,
    q: float | None,
) -> MatrixOut:
    """``aggregation`` of each matching series per step; ``rate`` and ``increase`` as
    documented in :mod:`tuneloop.storage.timeseries.functions`."""
    with invalid_input():
        found = _range_series(series, project_id, selector, time_range, aggregation, q)
    return MatrixOut(
        result=[MatrixSeriesOut(metric=_metric(s.series), values=_values(s.points)) for s in found]
    )


def _range_series(
    series: TimeSeriesBackend,
    project_id: int,
    selector: Selector,
    time_range: TimeRange,
    aggregation: RangeAggregation,
    q: float | None,
) -> list[RangeSeries]:
    start, end, step_s = time_range.start, time_range.end, time_range.step_s
    counter_functions = {"rate": series.rate, "increase": series.increase}
    counter_function = counter_functions.get(aggregation)
    if counter_function is not None:
        if q is not None:
            raise ValueError(f"q is only meaningful for quantile, not {aggregation}")
        return counter_function(
            project_id,
            selector.metric,
            selector.matchers,
            start=start,
            end=end,
            step_s=step_s,
            window_s=time_range.window_s,
            max_series=MAX_SERIES_PER_RESPONSE,
        )
    if time_range.window_s is not None:
        raise ValueError(f"window is only meaningful for rate and increase, not {aggregation}")
    return series.query_range(
        project_id,
        selector.metric,
        selector.matchers,
        start=start,
        end=end,
        step_s=step_s,
        aggregation=Aggregation(aggregation),
        q=q,
        max_series=MAX_SERIES_PER_RESPONSE,
    )


def latest(
    series: TimeSeriesBackend, project_id: int, selector: Selector, since: datetime | None
) -> VectorOut:
    with invalid_input():
        found = series.latest(
            project_id,
            selector.metric,
            selector.matchers,
            since=since,
            max_series=MAX_SERIES_PER_RESPONSE,
        )
    return VectorOut(
        result=[
            VectorSampleOut(metric=_metric(s.series), value=(unix_time(s.ts), prom_value(s.value)))
            for s in found
        ]
    )


def histogram_quantile(
    series: TimeSeriesBackend, project_id: int, q: float, selector: Selector, time_range: TimeRange
) -> MatrixOut:
    """Per group of bucket series (labels other than ``le``; no ``__name__``, as in PromQL),
    the ``q``-quantile per step. ``selector.metric`` is the histogram's base name."""
    assert selector.metric is not None
    with invalid_input():
        found = series.histogram_quantile(
            project_id,
            q,
            selector.metric,
            selector.matchers,
            start=time_range.start,
            end=time_range.end,
            step_s=time_range.step_s,
            window_s=time_range.window_s,
            max_series=MAX_SERIES_PER_RESPONSE,
        )
    return MatrixOut(
        result=[
            MatrixSeriesOut(metric=group.labels, values=_values(group.points)) for group in found
        ]
    )


# --------------------------------------------------------------------------- Prometheus format


def _metric(series: SeriesInfo) -> dict[str, str]:
    return {**series.labels, METRIC_LABEL: series.metric}


def _values(points: Sequence[tuple[datetime, float]]) -> list[tuple[int | float, str]]:
    return [(unix_time(ts), prom_value(value)) for ts, value in points]


def unix_time(ts: datetime) -> int | float:
    """Unix seconds: an integer when whole (as Prometheus writes them), else to the µs."""
    seconds, micros = divmod(to_micros(ts), 1_000_000)
    return seconds if micros == 0 else seconds + micros / 1_000_000


_SPECIAL: Mapping[float, str] = {math.inf: "+Inf", -math.inf: "-Inf"}


def prom_value(value: float) -> str:
    """A sample value as Prometheus writes one (Go's shortest ``'f'`` format): ``3``, ``0.5``,
    ``1000000000000000000000``, ``NaN``, ``+Inf``. Parsers take Python's ``repr`` as well, but
    tools that compare strings expect these."""
    if math.isnan(value):
        return "NaN"
    if value in _SPECIAL:
        return _SPECIAL[value]
    text = repr(value)
    if "e" in text:
        return format(Decimal(text), "f")
    return text[:-2] if text.endswith(".0") else text
