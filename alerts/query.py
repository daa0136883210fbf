"""A rule's query at one instant, through the time-series contract
(:class:`~tuneloop.storage.timeseries.backend.TimeSeriesBackend`): the built-in store or a
Prometheus-compatible TSDB alike.

Each kind maps to one or two calls of the contract (``latest``, ``query_range``, ``rate``,
``histogram_quantile``); this module only picks the range and step and reshapes the answer into
:class:`~alerts.conditions.Sample`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from alerts.conditions import Sample, Seen, absent_groups, combine, ratios
from alerts.promql_rule import evaluate as evaluate_promql
from alerts.rules import QuerySpec, RuleDefinition, RuleKind, UnlessSpec
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.timeseries.types import Aggregation, RangeSeries

WHOLE_WINDOW_STEP_S = 10**9
"""A step longer than any window: range queries bucket by epoch multiples of the step, and
every window of these years lies inside the one bucket [2001-09-09, 2033-05-18), so each series
gets exactly one value aggregated over exactly ``[start, end)``."""

_EPSILON = timedelta(microseconds=1)
"""Range ends are exclusive: a sample stamped at the evaluation instant belongs to it."""

MAX_SERIES_PER_RULE = 200_000
"""Same as the default series cap: a selector never reads more than a project can hold."""


def evaluate_samples(
    series: TimeSeriesBackend, project_id: int, rule: RuleDefinition, now: datetime
) -> list[Sample]:
    """The rule's values at ``now``: per series, or per ``by`` group once combined. For an
    ``absent`` rule, the silent groups (value: seconds of silence). Samples whose
    ``matching`` labels match a series of the rule's ``unless`` are left out."""
    if rule.expr is not None:
        return [
            Sample(labels, value)
            for labels, value in evaluate_promql(series, project_id, rule.expr, now)
        ]
    query = rule.query
    assert query is not None
    found = _samples(series, project_id, rule, query, now)
    unless = query.unless
    if unless is None or not found:
        return found
    start = now - timedelta(seconds=query.window_s)
    silencing = _silencing_keys(series, project_id, unless, start, now + _EPSILON)
    return [sample for sample in found if _on_key(sample.labels, unless.matching) not in silencing]


def _silencing_keys(
    series: TimeSeriesBackend,
    project_id: int,
    unless: UnlessSpec,
    start: datetime,
    end: datetime,
) -> set[tuple[str, ...]]:
    answer = series.query_range(
        project_id,
        unless.metric,
        unless.matchers,
        start=start,
        end=end,
        step_s=WHOLE_WINDOW_STEP_S,
        aggregation=Aggregation(unless.aggregation),
        max_series=MAX_SERIES_PER_RULE,
    )
    return {
        _on_key(item.series.labels, unless.matching)
        for item in answer
        if item.points and unless.passes(item.points[-1][1])
    }


def _on_key(labels: Mapping[str, str], on: Sequence[str]) -> tuple[str, ...]:
    return tuple(labels.get(name, "") for name in on)


def _samples(
    series: TimeSeriesBackend,
    project_id: int,
    rule: RuleDefinition,
    query: QuerySpec,
    now: datetime,
) -> list[Sample]:
    window = timedelta(seconds=query.window_s)
    if rule.kind is RuleKind.ABSENT:
        seen = series.latest(
            project_id,
            query.metric,
            query.matchers,
            since=now - timedelta(seconds=max(query.lookback_s, query.window_s)),
            max_series=MAX_SERIES_PER_RULE,
        )
        # A sample stamped after ``now`` (a pass running late) still says the series is there.
        found = [Seen(item.series.labels, min(item.ts, now)) for item in seen]
        return absent_groups(found, query.by, query.matchers, now=now, window=window)
    if rule.kind is RuleKind.RATE:
        per_series = _last_points(
            series.rate(
                project_id,
                query.metric,
                query.matchers,
                start=now - timedelta(seconds=1),
                end=now + _EPSILON,
                step_s=1,
                window_s=query.window_s,
                max_series=MAX_SERIES_PER_RULE,
            )
        )
        return combine(per_series, query.by, rule.combine)
    if rule.kind is RuleKind.REGRESSION:
        recent = _window_values(series, project_id, query, now - window, now + _EPSILON)
        baseline_start = now - window - timedelta(seconds=query.baseline_s)
        baseline = _window_values(series, project_id, query, baseline_start, now - window)
        by, how = query.by, rule.combine
        return ratios(combine(recent, by, how), combine(baseline, by, how))
    return combine(
        _window_values(series, project_id, query, now - window, now + _EPSILON),
        query.by,
        rule.combine,
    )


def _window_values(
    series: TimeSeriesBackend,
    project_id: int,
    query: QuerySpec,
    start: datetime,
    end: datetime,
) -> list[Sample]:
    if query.aggregation == "histogram_quantile":
        assert query.q is not None
        groups = series.histogram_quantile(
            project_id,
            query.q,
            query.metric,
            query.matchers,
            start=end - timedelta(seconds=1),
            end=end,
            step_s=1,
            window_s=max(1, round((end - start).total_seconds())),
            max_series=MAX_SERIES_PER_RULE,
            by=query.by,
        )
        return [
            Sample(group.labels, group.points[-1][1])
            for group in groups
            if group.points and not math.isnan(group.points[-1][1])
        ]
    answer = series.query_range(
        project_id,
        query.metric,
        query.matchers,
        start=start,
        end=end,
        step_s=WHOLE_WINDOW_STEP_S,
        aggregation=Aggregation(query.aggregation),
        q=query.q,
        max_series=MAX_SERIES_PER_RULE,
    )
    return [Sample(item.series.labels, item.points[-1][1]) for item in answer if item.points]


def _last_points(answer: list[RangeSeries]) -> list[Sample]:
    return [Sample(item.series.labels, item.points[-1][1]) for item in answer if item.points]
