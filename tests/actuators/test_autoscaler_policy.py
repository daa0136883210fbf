"""The HPA-like autoscaling policy, table-driven."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from actuators.autoscaler.policy import (
    Metrics,
    ScalePolicy,
    ScalePolicyError,
    ScaleState,
    decide_scale,
)

NOW = 100_000.0
BASE = {"min_replicas": 2, "max_replicas": 20, "p99_slo_s": 0.2, "target_queue_per_replica": 10}


@dataclass
class Case:
    name: str
    replicas: int
    metrics: Metrics | None
    expect: tuple[int, str]
    policy: dict[str, Any] = field(default_factory=dict)
    recommendations: tuple[tuple[float, int], ...] = ()
    events: tuple[tuple[float, int], ...] = ()


def fresh(**signals: float) -> Metrics:
    return Metrics(at=NOW - 5, **signals)


CASES = [
    Case("on target", 4, fresh(p99_latency_s=0.2, queue_depth=40), (4, "within_tolerance")),
    Case("p99 over the SLO", 4, fresh(p99_latency_s=0.3, queue_depth=0), (6, "scale_out")),
    Case(
        "queue growing",
        4,
        fresh(p99_latency_s=0.1, queue_depth=40, queue_growth_per_s=0.5),
        (7, "scale_out"),  # 40 + 60 s x 0.5 = 70 queued: 7 replicas at 10 each
    ),
    Case("stale metrics", 4, Metrics(at=NOW - 120, p99_latency_s=5.0), (4, "stale_metrics")),
    Case("no metrics", 4, None, (4, "stale_metrics")),
    Case("stale, but below the minimum", 1, None, (2, "bounds")),
    Case("never above max", 16, fresh(p99_latency_s=2.0), (20, "at_max")),
    Case(
        "never below min",
        3,
        fresh(p99_latency_s=0.01, queue_depth=0),
        (2, "at_min"),
        policy={"scale_in_percent": 100},
    ),
    Case(
        "rate limit out: +4 or +100% per period",
        2,
        fresh(p99_latency_s=2.0),
        (6, "rate_limited"),
    ),
    Case(
        "rate limit counts this period's changes",
        6,
        fresh(p99_latency_s=2.0),
        (6, "rate_limited"),
        events=((NOW - 30, 2),),
    ),
    Case(
        "scale in waits for the window's highest recommendation",
        10,
        fresh(p99_latency_s=0.05, queue_depth=10),
        (10, "stabilizing"),
        recommendations=((NOW - 100, 10), (NOW - 50, 8)),
    ),
    Case(
        "scale in after the window",
        10,
        fresh(p99_latency_s=0.05, queue_depth=10),
        (8, "scale_in"),
        recommendations=((NOW - 400, 10), (NOW - 50, 8)),
    ),
    Case(
        "scale in limited to 50% per period",
        16,
        fresh(p99_latency_s=0.01, queue_depth=0),
        (8, "rate_limited"),
        policy={"scale_in_stabilization_s": 0},
    ),
    Case(
        "a remembered higher recommendation never scales out while asking for fewer",
        5,
        fresh(p99_latency_s=0.05, queue_depth=10),
        (5, "stabilizing"),
        recommendations=((NOW - 50, 13),),
    ),
    Case(
        "a remembered lower recommendation never scales in while asking for more",
        5,
        fresh(p99_latency_s=0.3),
        (5, "stabilizing"),
        policy={"scale_out_stabilization_s": 120},
        recommendations=((NOW - 50, 2),),
    ),
    Case(
        "queue only policy ignores latency",
        4,
        fresh(p99_latency_s=9.0, queue_depth=40),
        (4, "within_tolerance"),
        policy={"p99_slo_s": None},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_decide_scale(case: Case) -> None:
    policy = ScalePolicy(**{**BASE, **case.policy})
    state = ScaleState(case.replicas, case.recommendations, case.events)
    decision = decide_scale(policy, state, case.metrics, NOW)
    assert (decision.replicas, decision.reason) == case.expect
    assert policy.min_replicas <= decision.replicas <= policy.max_replicas
    assert decision.state.replicas == decision.replicas


def test_a_restart_with_the_remembered_state_decides_the_same() -> None:
    policy = ScalePolicy(**BASE)
    remembered = ScaleState(10, recommendations=((NOW - 10, 10),))
    first = decide_scale(policy, remembered, fresh(p99_latency_s=0.05, queue_depth=10), NOW)
    assert first.replicas == 10  # the low recommendation is remembered, not acted on
    again = decide_scale(policy, first.state, fresh(p99_latency_s=0.05, queue_depth=10), NOW + 1)
    assert again.replicas == 10
    signals = Metrics(at=NOW + 300, p99_latency_s=0.05, queue_depth=10)
    later = decide_scale(policy, again.state, signals, NOW + 301)
    assert (later.replicas, later.reason) == (5, "rate_limited")  # 3 wanted, -50% a period


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"min_replicas": 5, "max_replicas": 2}, "min_replicas <= max_replicas"),
        ({"p99_slo_s": None, "target_queue_per_replica": None}, "set p99_slo_s"),
        ({"p99_slo_s": 0}, "p99_slo_s must be > 0"),
        ({"tolerance": 1.5}, "tolerance"),
    ],
)
def test_invalid_policies(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ScalePolicyError, match=message):
        ScalePolicy(**{**BASE, **fields})
