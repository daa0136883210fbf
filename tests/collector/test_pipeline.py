from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, func, select

from collector.pipeline import Pipeline, to_batches
from collector.points import Point
from collector.runner import CollectorRunner
from collector.sinks.store import StoreSink
from tuneloop.storage.models import Project, samples
from tuneloop.storage.timeseries.types import SeriesBatch, WriteResult
from tuneloop.storage.timeseries.writer import SampleWriter

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def point(metric: str, gpu: str, seconds: int, value: float) -> Point:
    return Point(metric, {"gpu": gpu}, T0 + timedelta(seconds=seconds), value)


class BlinkingSink:
    """Stands in for a store that is down for the first ``failures`` writes."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.written: list[SeriesBatch] = []

    def write(self, batches: Sequence[SeriesBatch]) -> WriteResult:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("database is restarting")
        self.written.extend(batches)
        return WriteResult(samples_written=sum(len(b.values) for b in batches))


def test_to_batches_groups_points_per_series_in_order() -> None:
    batches = to_batches(
        [point("util", "0", 0, 1.0), point("util", "1", 0, 5.0), point("util", "0", 1, 2.0)]
    )
    assert [(b.labels["gpu"], list(b.values)) for b in batches] == [("0", [1.0, 2.0]), ("1", [5.0])]


def test_pipeline_keeps_points_across_a_failed_flush() -> None:
    sink = BlinkingSink(failures=1)
    pipeline = Pipeline(sink)
    pipeline.consume([point("util", "0", 0, 1.0)])
    assert pipeline.flush() is False
    pipeline.consume([point("util", "0", 1, 2.0)])
    assert pipeline.flush() is True
    assert [list(b.values) for b in sink.written] == [[1.0, 2.0]]
    assert pipeline.stats.flush_failures == 1
    assert pipeline.stats.written == 2


def test_pipeline_drops_and_counts_past_its_bound() -> None:
    sink = BlinkingSink(failures=0)
    pipeline = Pipeline(sink, max_buffered=3)
    pipeline.consume([point("util", "0", i, float(i)) for i in range(5)])
    assert pipeline.stats.dropped == 2
    pipeline.flush()
    assert [list(b.values) for b in sink.written] == [[0.0, 1.0, 2.0]]


class BrokenSource:
    name = "broken"

    def start(self) -> None: ...

    def shutdown(self) -> None: ...

    def collect(self, now: datetime) -> list[Point]:
        raise OSError("device gone")


class OneGpuSource:
    name = "gpu"

    def start(self) -> None: ...

    def shutdown(self) -> None: ...

    def collect(self, now: datetime) -> list[Point]:
        return [Point("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0"}, now, 87.0)]


def test_runner_writes_into_the_store_and_survives_a_broken_source(engine: Engine) -> None:
    with engine.begin() as connection:
        project_id = connection.execute(
            Project.__table__.insert().values(name="p", created_at=T0).returning(Project.id)  # type: ignore[attr-defined]
        ).scalar_one()
    writer = SampleWriter(engine, partition_days=1, max_series_per_project=100)
    runner = CollectorRunner(
        [BrokenSource(), OneGpuSource()],
        Pipeline(StoreSink(writer, project_id)),
        interval_s=60,
    )
    runner.collect_once()
    runner.collect_once()
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(samples)).scalar_one() == 2
    assert runner.source_errors == {"broken": 2, "gpu": 0}
