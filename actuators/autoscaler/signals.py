"""The fleet's signals from the series backend (the store or a TSDB): the newest sample of each
series the selectors match.

A selector may match one series per replica (a ``pod`` label): the fleet's P99 is the worst of
them and its queue their sum. Only series with a sample within the policy's
``max_metric_age_s`` count, so a replica scaled away (its series stops) neither holds the
fleet nor inflates its queue. Every signal the autoscaler is configured with must have such a
sample; if one has none, there are no metrics and the policy takes no action (one missing
signal could otherwise hide the one that asks for more replicas). The metrics' time is their
newest sample's: it moves whenever any series has a new one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Final

from actuators.autoscaler.policy import Metrics
from actuators.autoscaler.spec import selector_parts
from tuneloop.storage.timeseries.backend import TimeSeriesBackend

MAX_SERIES: Final = 1000
"""More series than this in one selector is a selector that needs narrowing."""


def _signal(
    series: TimeSeriesBackend,
    project_id: int,
    selector: Mapping[str, Any],
    since: datetime,
    combine: Callable[[Iterable[float]], float],
) -> tuple[float, float] | None:
    """(combined value, epoch seconds of the newest sample combined), or ``None``."""
    metric, matchers = selector_parts(selector)
    found = series.latest(project_id, metric, matchers, since=since, max_series=MAX_SERIES)
    if not found:
        return None
    return combine(sample.value for sample in found), max(s.ts for s in found).timestamp()


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
    latency = _signal(series, project_id, p99, since, max) if p99 is not None else None
    depth = _signal(series, project_id, queue, since, sum) if queue is not None else None
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
