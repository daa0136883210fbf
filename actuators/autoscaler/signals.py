"""The fleet's signals from the series backend (the store or a TSDB): the newest sample of each
series the selectors match.

A selector may match one series per replica (a ``pod`` label): the fleet's P99 is the worst of
them and its queue their sum. Only series with a sample within the policy's
``max_metric_age_s`` count, so a replica scaled away (its series stops) neither holds the
fleet nor inflates its queue. Every signal the autoscaler is configured with must have such a
sample; if one has none, there are no metrics and the policy takes no action (one missing
signal could otherwise hide the one that asks for more replicas). The metrics' time is their
newest sample's: it moves whenever any series has a new one.

A signal may instead be a PromQL expression (``{"expr": ...}``), evaluated at ``now`` by
tuneloop's engine over the same backend: its series are combined as a selector's (the worst
P99, the summed queue), each with the expression's own lookback (5 minutes for an instant
selector, the range of a ``[...]``), and its time is the newest sample the engine read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Final

from actuators.autoscaler.policy import Metrics
from actuators.autoscaler.spec import selector_parts
from tuneloop import promql
from tuneloop.settings import get_settings
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.types import to_micros

MAX_SERIES: Final = 1000
"""More series than this in one selector is a selector that needs narrowing."""
EXPR_TIMEOUT_S: Final = 30.0


def _signal(
    series: TimeSeriesBackend,
    project_id: int,
    selector: Mapping[str, Any],
    now: datetime,
    since: datetime,
    combine: Callable[[Iterable[float]], float],
) -> tuple[float, float] | None:
    """(combined value, epoch seconds of the newest sample combined), or ``None``."""
    if "expr" in selector:
        return _expr_signal(series, project_id, str(selector["expr"]), now, since, combine)
    metric, matchers = selector_parts(selector)
    found = series.latest(project_id, metric, matchers, since=since, max_series=MAX_SERIES)
    if not found:
        return None
    return combine(sample.value for sample in found), max(s.ts for s in found).timestamp()


def _expr_signal(
    series: TimeSeriesBackend,
    project_id: int,
    text: str,
    now: datetime,
    since: datetime,
    combine: Callable[[Iterable[float]], float],
) -> tuple[float, float] | None:
    """An expression's series at ``now`` combined; ``None`` without any, or when the newest
    sample it read is older than ``since``."""
    source = promql.NewestSampleTracker(
        promql.BackendSource(series, project_id, max_series=MAX_SERIES)
    )
    found = promql.instant_samples(
        source,
        text,
        to_micros(now) // 1000,
        max_samples=get_settings().promql_max_samples,
        timeout_s=EXPR_TIMEOUT_S,
    )
    values = [value for _, value in found if not math.isnan(value)]
    if not values or source.newest_ms is None or source.newest_ms < to_micros(since) // 1000:
        return None
    return combine(values), source.newest_ms / 1000


def fleet_metrics(
    series: TimeSeriesBackend,
    project_id: int,
    *,
    p99: Mapping[str, Any] | None,
    queue: Mapping[str, Any] | None,
    now: datetime,
    max_age_s: float,
) -> Metrics | None:
    """The newest signals as of ``now``, or ``None`` when a configured one has no fresh
    sample. Raises ``ValueError`` for a selector the store refuses (too many series, a
    regular expression PostgreSQL rejects)."""
    since = now - timedelta(seconds=max_age_s)
    latency = _signal(series, project_id, p99, now, since, max) if p99 is not None else None
    depth = _signal(series, project_id, queue, now, since, sum) if queue is not None else None
    if (p99 is not None and latency is None) or (queue is not None and depth is None):
        return None
    times = [found[1] for found in (latency, depth) if found is not None]
    if not times:
        return None
    return Metrics(
        at=max(times),
        p99_latency_s=latency[0] if latency is not None else None,
        queue_depth=depth[0] if depth is not None else None,
    )
