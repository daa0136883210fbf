"""Alert rules written in PromQL (kind ``promql``): the expression is checked when the rule is
created and evaluated at each pass as an instant query by tuneloop's engine, over whatever
keeps the project's series (the built-in store or a Prometheus-compatible TSDB), as
Prometheus evaluates an alerting rule: each series of the result is an alert, its labels the
series' without the metric name, its value the series' value."""

from __future__ import annotations

from datetime import datetime

import promql_parser as ast

from tuneloop import promql
from tuneloop.promql.parse import parse
from tuneloop.settings import get_settings
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.types import to_micros

EVALUATION_TIMEOUT_S = 30.0
"""One rule's query: as long as a read of the API may take."""
NOT_INSTANT = "an alert rule's expression must give an instant vector or a scalar"
MAX_SERIES_PER_SELECTOR = 200_000
"""As the other kinds: a selector never reads more series than a project can hold."""


def check_expr(text: str) -> str:
    """``text`` if the engine evaluates it to an instant vector or a scalar; ``ValueError``
    with the engine's message (a syntax error, an unsupported function) if not."""
    try:
        expr = parse(text)
    except promql.PromQLError as exc:
        raise ValueError(str(exc)) from None
    inner = expr
    while isinstance(inner, ast.ParenExpr):
        inner = inner.expr
    if isinstance(inner, (ast.MatrixSelector, ast.SubqueryExpr, ast.StringLiteral)):
        raise ValueError(NOT_INSTANT)
    return text


def evaluate(
    series: TimeSeriesBackend, project_id: int, text: str, now: datetime
) -> list[tuple[dict[str, str], float]]:
    """Labels and value of each series of ``text`` at ``now`` (a scalar: one, without
    labels)."""
    at_ms = to_micros(now) // 1000
    source = promql.BackendSource(series, project_id, max_series=MAX_SERIES_PER_SELECTOR)
    result = promql.query(
        source,
        text,
        at_ms,
        at_ms,
        1,
        max_samples=get_settings().promql_max_samples,
        timeout_s=EVALUATION_TIMEOUT_S,
    )
    value = result.value
    if isinstance(value, promql.Scalar):
        return [({}, float(value.values[0]))]
    if not isinstance(value, list):
        raise promql.PromQLError(NOT_INSTANT)
    return [
        ({k: v for k, v in one.labels.items() if k != "__name__"}, float(one.values[0]))
        for one in value
        if one.present[0]
    ]
