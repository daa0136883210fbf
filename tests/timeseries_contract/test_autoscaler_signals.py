"""An autoscaler's signals written as PromQL expressions read the same on every backend (the
store on SQLite and PostgreSQL, a real VictoriaMetrics and a real Prometheus): evaluated by
tuneloop's engine over the contract's raw reads, each project only its own."""

from __future__ import annotations

from datetime import timedelta

import pytest

from actuators.autoscaler.signals import fleet_metrics
from tests.timeseries_contract.conftest import T0, Subject
from tuneloop.storage.timeseries.types import SeriesBatch

P99 = "llm_request_latency_p99_seconds"
QUEUE = "llm_queue_requests"
NOW = T0 + timedelta(minutes=7)


def test_expression_signals_on_every_backend(subject: Subject) -> None:
    mine, theirs = subject.projects

    def sample(metric: str, minutes_ago: float, value: float, **labels: str) -> SeriesBatch:
        return SeriesBatch(metric, labels, [NOW - timedelta(minutes=minutes_ago)], [value])

    subject.write(
        [
            sample(P99, 0.5, 0.1, pod="a"),
            sample(P99, 0.25, 0.4, pod="b"),
            sample(P99, 6, 9.0, pod="gone"),  # past the 5-minute lookback: not in the answer
            sample(QUEUE, 0.5, 3, pod="a"),
            sample(QUEUE, 0.5, 4, pod="b"),
        ]
    )
    subject.write([sample(P99, 0.1, 50.0, pod="a")], project=theirs)
    metrics = fleet_metrics(
        subject.backend,
        mine,
        p99={"expr": f"max by (pod) ({P99})"},
        queue={"expr": f"sum({QUEUE}) * 2"},
        now=NOW,
        max_age_s=60,
    )
    assert metrics is not None
    assert metrics.p99_latency_s == pytest.approx(0.4)  # the worst replica
    assert metrics.queue_depth == pytest.approx(14)
    assert metrics.at == pytest.approx((NOW - timedelta(seconds=15)).timestamp())

    # The newest sample the expression read is older than max_age_s: no metrics.
    stale = fleet_metrics(
        subject.backend,
        mine,
        p99={"expr": f"max({P99})"},
        queue=None,
        now=NOW + timedelta(minutes=2),
        max_age_s=60,
    )
    assert stale is None
    # An expression with no series: no metrics either.
    none = fleet_metrics(
        subject.backend,
        mine,
        p99={"expr": f"max({P99}) > 100"},
        queue=None,
        now=NOW,
        max_age_s=60,
    )
    assert none is None
