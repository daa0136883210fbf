"""Alert rules written in PromQL (kind ``promql``): the expression is checked when the rule is
created and evaluated at each pass as an instant query by tuneloop's engine, over whatever
keeps the project's series (the built-in store or a Prometheus-compatible TSDB), as
Prometheus evaluates an alerting rule: each series of the result is an alert, its labels the
series' without the metric name, its value the series' value."""

from __future__ import annotations

from datetime import datetime

from tuneloop import promql
from tuneloop.settings import get_settings
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.types import to_micros

EVALUATION_TIMEOUT_S = 30.0
"""One rule's query: as long as a read of the API may take."""
MAX_SERIES_PER_SELECTOR = 200_000
"""As the other kinds: a selector never reads more series than a project can hold."""


def check_expr(text: str) -> str:
    """``text`` if the engine evaluates it to an instant vector or a scalar; ``ValueError``
    with the engine's message (a syntax error, an unsupported function) if not."""
    try:
        promql.parse_instant(text)
    except promql.PromQLError as exc:
        raise ValueError(str(exc)) from None
    return text


def evaluate(
    series: TimeSeriesBackend, project_id: int, text: str, now: datetime
) -> list[tuple[dict[str, str], float]]:
    """Labels and value of each series of ``text`` at ``now``."""
    source = promql.BackendSource(series, project_id, max_series=MAX_SERIES_PER_SELECTOR)
    return promql.instant_samples(
        source,
        text,
        to_micros(now) // 1000,
        max_samples=get_settings().promql_max_samples,
        timeout_s=EVALUATION_TIMEOUT_S,
    )
