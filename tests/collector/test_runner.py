"""The runner: every source on its own interval, a failing one retried with backoff while the
others go on, its status on the board and in the metrics."""

from __future__ import annotations

import itertools
import threading
import time
from datetime import datetime

from sqlalchemy import Engine, func, select

from collector.pipeline import Pipeline, PipelineConfig
from collector.points import Point
from collector.runner import CollectorRunner
from collector.sinks.store import StoreSink
from collector.status import StatusBoard
from tuneloop.storage.models import samples
from tuneloop.storage.timeseries.writer import SampleWriter


class FlakySource:
    """Fails its first ``failures`` polls (as a GPU that fell off the bus), then works; keeps
    a record of every call the runner made."""

    def __init__(self, name: str, failures: int) -> None:
        self.name = name
        self.failures = failures
        self.calls: list[tuple[str, float]] = []
        self.lock = threading.Lock()

    def start(self) -> None:
        self.calls.append(("start", time.monotonic()))

    def shutdown(self) -> None:
        self.calls.append(("shutdown", time.monotonic()))

    def collect(self, now: datetime) -> list[Point]:
        self.calls.append(("collect", time.monotonic()))
        if self.failures > 0:
            self.failures -= 1
            raise OSError(f"{self.name}: device gone\nsecond line")
        return [Point("gpu_util", {"source": self.name}, now, 87.0)]

    def collects(self) -> list[float]:
        return [at for call, at in self.calls if call == "collect"]


def metric(pipeline: Pipeline, name: str, **labels: str) -> float | None:
    return pipeline.registry.get_sample_value(name, labels)


def test_a_failing_source_backs_off_while_the_others_go_on(engine: Engine, project_id: int) -> None:
    pipeline = Pipeline(
        StoreSink(SampleWriter(engine)), config=PipelineConfig(flush_interval_s=0.05)
    )
    broken = FlakySource("broken", failures=1_000)
    healthy = FlakySource("healthy", failures=0)
    board = StatusBoard()
    runner = CollectorRunner(
        [broken, healthy],
        pipeline,
        project_id,
        interval_s=0.05,
        board=board,
        retry_initial_s=0.05,
        retry_max_s=0.4,
    )
    pipeline.start()
    runner.start()
    time.sleep(1.2)
    runner.stop()
    pipeline.stop()

    # The healthy source kept its pace (about 24 polls) and its samples are stored.
    assert len(healthy.collects()) >= 12
    with engine.connect() as connection:
        stored = connection.execute(select(func.count()).select_from(samples)).scalar_one()
    assert stored == len(healthy.collects())
    # The broken one was retried ever more slowly: 0.05, 0.1, 0.2, 0.4, 0.4 (less jitter).
    attempts = broken.collects()
    assert 4 <= len(attempts) <= 9
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert gaps[-1] > gaps[0]
    assert max(gaps) <= 0.4 + 0.1
    # ...and started afresh each time (shutdown after each failure).
    assert [call for call, _ in broken.calls[:4]] == ["start", "collect", "shutdown", "start"]

    status = {s.name: s for s in board.snapshot()}
    assert status["healthy"].ok is True and status["healthy"].consecutive_failures == 0
    assert status["healthy"].last_success_at is not None
    assert status["broken"].ok is False
    assert status["broken"].consecutive_failures == len(attempts)
    assert status["broken"].last_error == "OSError: broken: device gone"
    assert status["broken"].last_success_at is None

    assert metric(pipeline, "tuneloop_collector_source_up", source="healthy") == 1
    assert metric(pipeline, "tuneloop_collector_source_up", source="broken") == 0
    assert metric(pipeline, "tuneloop_collector_source_errors_total", source="broken") == len(
        attempts
    )
    assert metric(pipeline, "tuneloop_collector_source_errors_total", source="healthy") is None


def test_a_source_that_recovers_reports_ok_again(engine: Engine, project_id: int) -> None:
    pipeline = Pipeline(StoreSink(SampleWriter(engine)))
    source = FlakySource("gpu", failures=2)
    runner = CollectorRunner([source], pipeline, project_id, interval_s=60)
    for _ in range(3):
        runner.collect_once()
    pipeline.stop()
    (status,) = runner.status()
    assert status.ok is True and status.consecutive_failures == 0
    assert status.last_error == "OSError: gpu: device gone"  # the last error stays for people
    assert metric(pipeline, "tuneloop_collector_points_written_total") == 1


def test_per_source_intervals(engine: Engine, project_id: int) -> None:
    pipeline = Pipeline(StoreSink(SampleWriter(engine)))
    fast, slow = FlakySource("fast", 0), FlakySource("slow", 0)
    runner = CollectorRunner(
        [fast, slow], pipeline, project_id, interval_s=0.05, intervals={"slow": 10}
    )
    runner.start()
    time.sleep(0.5)
    runner.stop()
    pipeline.stop()
    assert len(slow.collects()) == 1
    assert len(fast.collects()) >= 5
