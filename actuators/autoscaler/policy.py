"""The autoscaling policy, as the Kubernetes HPA computes it, on SLO signals. Pure: metrics,
the remembered recommendations and scale events in, a replica count and the reason out.

1. **Stale metrics: no action.** Metrics older than ``max_metric_age_s`` (or none) change
   nothing; only the min/max bounds are enforced.
2. **Raw recommendation** ``ceil(current x ratio)`` with the largest of the ratios
   ``p99 latency / SLO`` and ``queue per replica / target``, the queue projected
   ``queue_lookahead_s`` ahead at its growth rate. Within ``tolerance`` of 1: no change.
3. **Stabilization**: scaling in follows the highest recommendation of the last
   ``scale_in_stabilization_s``, scaling out the lowest of ``scale_out_stabilization_s``
   (default 0: at once), so a dip or a spike does not flap the fleet. It only holds a change
   back: a remembered higher recommendation never scales out on a pass that asks for fewer
   replicas (that would skip the scale-out rate limit), nor a lower one in.
4. **Rate limits** per ``period_s``: out by at most ``max(scale_out_pods, scale_out_percent``
   of the current) replicas, in by at most ``scale_in_percent``, counting the changes
   already made in the period.
5. **Bounds**: never below ``min_replicas`` nor above ``max_replicas``, whatever the above.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tuneloop.errors import InvalidInput


class ScalePolicyError(InvalidInput):
    pass


@dataclass(frozen=True, slots=True)
class ScalePolicy:
    min_replicas: int
    max_replicas: int
    p99_slo_s: float | None = None
    target_queue_per_replica: float | None = None
    tolerance: float = 0.1
    queue_lookahead_s: float = 60.0
    scale_in_stabilization_s: float = 300.0
    scale_out_stabilization_s: float = 0.0
    period_s: float = 60.0
    scale_out_pods: int = 4
    scale_out_percent: float = 100.0
    scale_in_percent: float = 50.0
    max_metric_age_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ScalePolicyError(
                f"need 0 <= min_replicas <= max_replicas, got {self.min_replicas} and "
                f"{self.max_replicas}"
            )
        if self.p99_slo_s is None and self.target_queue_per_replica is None:
            raise ScalePolicyError("set p99_slo_s, target_queue_per_replica or both")
        for name in ("p99_slo_s", "target_queue_per_replica"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ScalePolicyError(f"{name} must be > 0, got {value}")
        if not 0 <= self.tolerance < 1:
            raise ScalePolicyError(f"tolerance must be in [0, 1), got {self.tolerance}")
        if self.period_s <= 0 or self.max_metric_age_s <= 0:
            raise ScalePolicyError("period_s and max_metric_age_s must be > 0")
        if self.scale_in_percent <= 0 or self.scale_out_percent <= 0 or self.scale_out_pods < 0:
            raise ScalePolicyError("rate limits must allow some change")


@dataclass(frozen=True, slots=True)
class Metrics:
    """The fleet's signals, as of ``at`` (epoch seconds, the newest sample's time)."""

    at: float
    p99_latency_s: float | None = None
    queue_depth: float | None = None
    queue_growth_per_s: float | None = None


@dataclass(frozen=True, slots=True)
class ScaleState:
    """What the loop remembers between passes (store it; a restart then repeats nothing)."""

    replicas: int
    recommendations: tuple[tuple[float, int], ...] = ()
    """(time, raw recommendation) within the stabilization windows."""
    events: tuple[tuple[float, int], ...] = ()
    """(time, replicas before) of the changes made within the last period."""


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    replicas: int
    reason: str
    """``stale_metrics``, ``within_tolerance``, ``scale_out``, ``scale_in``, ``stabilizing``,
    ``rate_limited``, ``at_min``, ``at_max`` or ``bounds``."""
    state: ScaleState
    """The state to remember once the target runs ``replicas``."""


def _raw(policy: ScalePolicy, current: int, metrics: Metrics) -> tuple[int, float] | None:
    ratios = []
    if policy.p99_slo_s is not None and metrics.p99_latency_s is not None:
        ratios.append(metrics.p99_latency_s / policy.p99_slo_s)
    if policy.target_queue_per_replica is not None and metrics.queue_depth is not None:
        growth = max(0.0, metrics.queue_growth_per_s or 0.0)
        projected = metrics.queue_depth + growth * policy.queue_lookahead_s
        ratios.append(projected / max(current, 1) / policy.target_queue_per_replica)
    ratios = [r for r in ratios if math.isfinite(r) and r >= 0]
    if not ratios:
        return None
    ratio = max(ratios)
    if abs(ratio - 1.0) <= policy.tolerance:
        return current, ratio
    return max(1, math.ceil(max(current, 1) * ratio)), ratio


def _clamp(policy: ScalePolicy, replicas: int) -> int:
    return min(policy.max_replicas, max(policy.min_replicas, replicas))


def decide_scale(
    policy: ScalePolicy, state: ScaleState, metrics: Metrics | None, now: float
) -> ScaleDecision:
    current = state.replicas
    window = max(policy.scale_in_stabilization_s, policy.scale_out_stabilization_s)
    history = tuple((t, r) for t, r in state.recommendations if now - t <= window)
    events = tuple((t, r) for t, r in state.events if now - t < policy.period_s)
    if metrics is None or now - metrics.at > policy.max_metric_age_s:
        bounded = _clamp(policy, current)
        return _decision(policy, state, bounded, "stale_metrics", history, events, now)
    raw = _raw(policy, current, metrics)
    if raw is None:
        bounded = _clamp(policy, current)
        return _decision(policy, state, bounded, "stale_metrics", history, events, now)
    recommendation, _ratio = raw
    history = (*history, (now, recommendation))
    if recommendation == current:
        bounded = _clamp(policy, current)
        return _decision(policy, state, bounded, "within_tolerance", history, events, now)

    if recommendation > current:
        recent = [r for t, r in history if now - t <= policy.scale_out_stabilization_s]
        # Stabilization only holds a change back, never turns it around (as in the HPA).
        target = max(current, min([*recent, recommendation]))
        reason = "scale_out" if target > current else "stabilizing"
        # Rate limit: at most this many replicas more than at the period's start.
        base = _period_start(current, events)
        limit = base + max(policy.scale_out_pods, math.ceil(base * policy.scale_out_percent / 100))
        if target > limit:
            target, reason = limit, "rate_limited"
    else:
        recent = [r for t, r in history if now - t <= policy.scale_in_stabilization_s]
        target = min(current, max([*recent, recommendation]))
        reason = "scale_in" if target < current else "stabilizing"
        base = _period_start(current, events)
        limit = base - math.floor(base * policy.scale_in_percent / 100)
        if target < limit:
            target, reason = max(limit, target), "rate_limited"
    bounded = _clamp(policy, target)
    if bounded != target:
        reason = "at_max" if bounded == policy.max_replicas else "at_min"
    return _decision(policy, state, bounded, reason, history, events, now)


def _period_start(current: int, events: Sequence[tuple[float, int]]) -> int:
    """Replicas before the first change of the current period (the rate-limit base)."""
    return events[0][1] if events else current


def _decision(
    policy: ScalePolicy,
    state: ScaleState,
    replicas: int,
    reason: str,
    history: tuple[tuple[float, int], ...],
    events: tuple[tuple[float, int], ...],
    now: float,
) -> ScaleDecision:
    if replicas != state.replicas:
        if reason in ("stale_metrics", "within_tolerance"):
            reason = "bounds"
        events = (*events, (now, state.replicas))
    return ScaleDecision(replicas, reason, ScaleState(replicas, history, events))
