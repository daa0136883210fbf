"""The autoscaler's signals read through the contract: the fleet's worst P99 and summed queue
from each backend the contract suite runs on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from actuators.autoscaler.signals import fleet_metrics
from tests.timeseries_contract.conftest import Subject
from tuneloop.storage.timeseries.types import SeriesBatch


def test_fleet_signals(subject: Subject) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    fresh, stale = now - timedelta(seconds=20), now - timedelta(minutes=10)
    subject.write(
        [
            SeriesBatch("tl_p99_seconds", {"pod": "a"}, [fresh], [0.25]),
            SeriesBatch("tl_p99_seconds", {"pod": "b"}, [fresh - timedelta(seconds=5)], [0.5]),
            SeriesBatch("tl_p99_seconds", {"pod": "gone"}, [stale], [9.0]),
            SeriesBatch("tl_queue", {"pod": "a"}, [fresh], [3.0]),
            SeriesBatch("tl_queue", {"pod": "b"}, [fresh], [4.0]),
        ]
    )
    metrics = fleet_metrics(
        subject.backend,
        subject.project,
        p99={"metric": "tl_p99_seconds", "match": []},
        queue={"metric": "tl_queue", "match": ['pod=~"a|b"']},
        now=now,
        max_age_s=120,
    )
    assert metrics is not None
    assert (metrics.p99_latency_s, metrics.queue_depth) == (0.5, 7.0)
    assert metrics.at == fresh.timestamp()
