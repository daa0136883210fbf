"""From query results to the alerts a rule has now (pure: no I/O).

The query side (``alerts.query``) returns per-series values; this module groups them by the
rule's ``by`` labels, compares, finds absent groups and regressions, and builds each alert's
labels and annotations.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from alerts.rules import ALERTNAME, SEVERITY, Combine, RuleDefinition
from alerts.templates import render
from tuneloop.storage.timeseries.types import Matcher, MatchOp, fingerprint

LabelSet = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Sample:
    """One value of one series (or computed group) at evaluation time."""

    labels: LabelSet
    value: float


@dataclass(frozen=True, slots=True)
class Seen:
    """When a series last reported (input of ``absent`` rules)."""

    labels: LabelSet
    ts: datetime


@dataclass(frozen=True, slots=True)
class Active:
    """An alert whose condition holds now."""

    fingerprint: str
    labels: dict[str, str]
    annotations: dict[str, str]
    value: float


def group_key(labels: LabelSet, by: Sequence[str] | None) -> tuple[tuple[str, str], ...]:
    if by is None:
        return tuple(sorted(labels.items()))
    return tuple((name, labels.get(name, "")) for name in sorted(by))


def combine(samples: Iterable[Sample], by: Sequence[str] | None, how: Combine) -> list[Sample]:
    """Per-series samples combined per group of the ``by`` labels (unchanged without ``by``)."""
    if by is None:
        return [sample for sample in samples if not math.isnan(sample.value)]
    groups: dict[tuple[tuple[str, str], ...], list[float]] = {}
    for sample in samples:
        if not math.isnan(sample.value):
            groups.setdefault(group_key(sample.labels, by), []).append(sample.value)
    return [
        Sample({name: value for name, value in key if value}, _combine(values, how))
        for key, values in sorted(groups.items())
    ]


def _combine(values: list[float], how: Combine) -> float:
    if how == "max":
        return max(values)
    if how == "min":
        return min(values)
    if how == "sum":
        return math.fsum(values)
    if how == "count":
        return float(len(values))
    return math.fsum(values) / len(values)


def ratios(recent: Sequence[Sample], baseline: Sequence[Sample]) -> list[Sample]:
    """``recent / baseline`` of each label set present in both with a positive baseline."""
    before = {group_key(sample.labels, None): sample.value for sample in baseline}
    out = []
    for sample in recent:
        base = before.get(group_key(sample.labels, None))
        if base is not None and base > 0:
            out.append(Sample(sample.labels, sample.value / base))
    return out


def absent_groups(
    seen: Sequence[Seen],
    by: Sequence[str] | None,
    matchers: Sequence[Matcher],
    *,
    now: datetime,
    window: timedelta,
) -> list[Sample]:
    """Groups (of the ``by`` labels) whose newest sample is older than ``window``; without
    ``by``, one alert when no series at all reported within ``window`` (PromQL ``absent``),
    labelled with the selector's equality matchers. The value is the seconds of silence."""
    cutoff = now - window
    if by is None:
        if any(item.ts >= cutoff for item in seen):
            return []
        labels = {m.name: m.value for m in matchers if m.op is MatchOp.EQ and m.name != "__name__"}
        newest = max((item.ts for item in seen), default=None)
        silent = (now - newest).total_seconds() if newest is not None else math.inf
        return [Sample(labels, silent)]
    newest_by_group: dict[tuple[tuple[str, str], ...], datetime] = {}
    for item in seen:
        key = group_key(item.labels, by)
        if key not in newest_by_group or item.ts > newest_by_group[key]:
            newest_by_group[key] = item.ts
    return [
        Sample({name: value for name, value in key if value}, (now - ts).total_seconds())
        for key, ts in sorted(newest_by_group.items())
        if ts < cutoff
    ]


def active_alerts(rule: RuleDefinition, samples: Iterable[Sample]) -> list[Active]:
    """The rule's alerts whose condition holds, from its (combined) samples."""
    out: dict[str, Active] = {}
    for sample in samples:
        if rule.op is not None and not rule.compare(sample.value):
            continue
        labels = alert_labels(rule, sample.labels, sample.value)
        key = alert_fingerprint(labels)
        annotations = {
            name: render(text, labels, sample.value) for name, text in rule.annotations.items()
        }
        out[key] = Active(key, labels, annotations, sample.value)
    return list(out.values())


def alert_labels(rule: RuleDefinition, base: LabelSet, value: float) -> dict[str, str]:
    labels = dict(base)
    labels.update({name: render(text, base, value) for name, text in rule.labels.items()})
    labels[ALERTNAME] = rule.name
    labels[SEVERITY] = rule.severity.value
    return labels


def alert_fingerprint(labels: LabelSet) -> str:
    """Identity of an alert: its label set (the rule's name is the ``alertname`` label)."""
    return fingerprint(ALERTNAME, labels)
