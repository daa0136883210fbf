"""Readers that go through the contract, on each backend the contract suite runs on: the
autoscaler's signals (the fleet's worst P99, its summed queue) and the job actuator's
measurement of a released config (per-second means of rank 0's objective) and the tuner's
readings of a trial's window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast

import pytest

from actuators.autoscaler.signals import fleet_metrics
from actuators.job import measure
from tests.timeseries_contract.conftest import T0, Subject
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuner import promql_objective, readings
from tuner.readings import FB_FREE_METRIC, FB_USED_METRIC, THROUGHPUT_METRIC


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


def test_job_measurement(subject: Subject) -> None:
    times = [T0 + timedelta(seconds=s) for s in range(60)]
    rank0 = {"job": "train", "rank": "0"}
    subject.write(
        [
            # Two samples a second: the measurement averages them per second first.
            SeriesBatch("tl_tokens_per_s", rank0, times, [100.0] * 60),
            SeriesBatch(
                "tl_tokens_per_s",
                rank0,
                [t + timedelta(milliseconds=500) for t in times],
                [110.0 + i % 2 for i in range(60)],
            ),
            SeriesBatch("tl_tokens_per_s", {"job": "train", "rank": "1"}, times, [1.0] * 60),
        ]
    )
    job = cast(Any, SimpleNamespace(name="train", project_id=subject.project))
    stats = measure(
        cast(Any, None), job, "tl_tokens_per_s", T0, T0 + timedelta(seconds=60), subject.backend
    )
    assert stats is not None
    assert stats.n == 60
    assert stats.mean == pytest.approx(105.25)


def test_tuner_readings(subject: Subject) -> None:
    times = [T0 + timedelta(seconds=s) for s in range(60)]
    job = {"job": "train"}
    subject.write(
        [
            SeriesBatch(THROUGHPUT_METRIC, {**job, "rank": "0"}, times, [100.0] * 60),
            SeriesBatch(THROUGHPUT_METRIC, {**job, "rank": "1"}, times, [110.0] * 60),
            SeriesBatch(
                FB_USED_METRIC, {**job, "gpu": "0"}, times, [1000.0 + i for i in range(60)]
            ),
            SeriesBatch(
                FB_FREE_METRIC, {**job, "gpu": "0"}, times, [9000.0 - i for i in range(60)]
            ),
        ]
    )
    backend, project = subject.backend, subject.project
    assert readings.has_series(backend, project, "train", THROUGHPUT_METRIC)
    assert not readings.has_series(backend, project, "other", THROUGHPUT_METRIC)
    assert readings.rank_count(backend, project, "train") == 2
    end = T0 + timedelta(seconds=60)
    samples = readings.window_samples(
        backend, project, "train", THROUGHPUT_METRIC, start=T0, end=end, per_job=True
    )
    assert len(samples) == 60 and {s.value for s in samples} == {210.0}
    memory = readings.gpu_memory(backend, project, "train", start=T0, end=end)
    assert memory is not None
    assert (memory.peak_mib, memory.capacity_mib) == (1059.0, 10000.0)


def test_tuner_promql_objective_window(subject: Subject) -> None:
    times = [T0 + timedelta(seconds=s) for s in range(60)]
    counter = SeriesKind.COUNTER
    subject.write(
        [
            SeriesBatch(
                "tl_tokens_total",
                {"job": "train", "rank": "0"},
                times,
                [100.0 * s for s in range(60)],
                counter,
            ),
            SeriesBatch(
                "tl_tokens_total",
                {"job": "train", "rank": "1"},
                times,
                [110.0 * s for s in range(60)],
                counter,
            ),
            SeriesBatch(
                "tl_tokens_total",
                {"job": "other", "rank": "0"},
                times,
                [999.0 * s for s in range(60)],
                counter,
            ),
        ]
    )
    start, end = T0 + timedelta(seconds=20), T0 + timedelta(seconds=59)
    for expr in (
        "sum(rate(tl_tokens_total{job=$job}[10s]))",
        "rate(tl_tokens_total{job=$job}[10s])",
    ):
        samples = promql_objective.window_samples(
            subject.backend, subject.project, "train", expr, start=start, end=end
        )
        # One per second after the start; the ranks' series summed.
        assert [s.t for s in samples] == [
            (start + timedelta(seconds=i)).timestamp() for i in range(1, 40)
        ]
        assert [s.value for s in samples] == pytest.approx([210.0] * 39), expr
