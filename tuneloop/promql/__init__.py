"""A PromQL engine over the time-series store: :func:`query` evaluates an expression at one
time (an instant query) or at every step of a range, with Prometheus' semantics, for the subset
of the language listed in :mod:`tuneloop.promql.parse`; the rest is refused by name."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import promql_parser as ast

from tuneloop.promql.evaluate import Evaluator
from tuneloop.promql.parse import NOT_INSTANT, parse, parse_instant
from tuneloop.promql.source import BackendSource, NewestSampleTracker
from tuneloop.promql.values import (
    ExecutionError,
    PromQLError,
    QueryTimeout,
    RangeVector,
    SampleSource,
    Scalar,
    String,
    TimeArray,
    Value,
)

__all__ = [
    "BackendSource",
    "ExecutionError",
    "NewestSampleTracker",
    "PromQLError",
    "QueryResult",
    "QueryTimeout",
    "RangeVector",
    "SampleSource",
    "Scalar",
    "String",
    "instant_samples",
    "parse_instant",
    "query",
]


@dataclass(frozen=True, slots=True)
class QueryResult:
    value: Value
    times_ms: TimeArray
    """The steps: ``start, start + step, ...`` up to ``end``; one for an instant query."""
    ordered: bool
    """Whether the order of the series means something (``sort``, ``sort_desc``)."""


def query(
    source: SampleSource,
    text: str,
    start_ms: int,
    end_ms: int,
    step_ms: int,
    *,
    max_samples: int,
    timeout_s: float,
) -> QueryResult:
    """``text`` evaluated at ``start_ms, start_ms + step_ms, ... <= end_ms`` (steps aligned to
    the start, as Prometheus does). An instant query has ``start_ms == end_ms``. Raises
    :class:`PromQLError` (bad input, refused before reading), :class:`ExecutionError` (too
    many samples, conflicting series) or :class:`QueryTimeout`."""
    expr = parse(text)
    times = np.arange(start_ms, end_ms + 1, max(step_ms, 1), dtype=np.int64)
    evaluator = Evaluator(source, times, max_samples, time.monotonic() + timeout_s, end_ms)
    evaluator.check_samples(expr)
    value = evaluator.eval(expr)
    if start_ms != end_ms and isinstance(value, (RangeVector, String)):
        kind = "range vector" if isinstance(value, RangeVector) else "string"
        raise PromQLError(
            f'invalid expression type "{kind}" for range query, must be Scalar or instant Vector'
        )
    inner = expr
    while isinstance(inner, ast.ParenExpr):
        inner = inner.expr
    ordered = isinstance(inner, ast.Call) and inner.func.name in ("sort", "sort_desc")
    return QueryResult(value, times, ordered)


def instant_samples(
    source: SampleSource, text: str, at_ms: int, *, max_samples: int, timeout_s: float
) -> list[tuple[dict[str, str], float]]:
    """Labels (the metric name dropped, as Prometheus' rules drop it) and value of each series
    ``text`` gives at ``at_ms``; a scalar is one, without labels. :class:`PromQLError` unless
    the expression gives an instant vector or a scalar (:func:`parse_instant`)."""
    parse_instant(text)
    value = query(source, text, at_ms, at_ms, 1, max_samples=max_samples, timeout_s=timeout_s).value
    if isinstance(value, Scalar):
        return [({}, float(value.values[0]))]
    if not isinstance(value, list):
        raise PromQLError(NOT_INSTANT)
    return [
        ({k: v for k, v in one.labels.items() if k != "__name__"}, float(one.values[0]))
        for one in value
        if one.present[0]
    ]
