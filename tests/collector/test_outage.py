"""The issue's "done when": stopping PostgreSQL during a steady load and starting it again loses
no accepted sample, and writes none twice. Exact counts, on a private PostgreSQL server."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from collector.pipeline import Pipeline, PipelineConfig, PipelineFull
from collector.sinks.store import StoreSink
from collector.spool import Spool
from tests.collector.conftest import PrivatePostgres, create_project
from tests.helpers import stored_totals
from tuneloop.storage import make_engine
from tuneloop.storage.models import metadata
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
SUBMISSIONS = 200
SERIES = 10
PER_SERIES = 25  # 250 samples a submission, 50,000 in all


def submission(number: int) -> list[SeriesBatch]:
    """Samples unique by (series, ts) across the whole load, with a value that encodes both,
    so a lost, repeated or altered sample shows in the totals."""
    batches = []
    for series in range(SERIES):
        timestamps = [
            T0 + timedelta(seconds=number * PER_SERIES + index) for index in range(PER_SERIES)
        ]
        values = [float(number * 1000 + series * 100 + index) for index in range(PER_SERIES)]
        batches.append(
            SeriesBatch("load_value", {"series": str(series)}, timestamps, values, SeriesKind.GAUGE)
        )
    return batches


class Load:
    """A client submitting at a steady pace, retrying a refused submission as an HTTP client
    would after Retry-After (shortened here to keep the test fast)."""

    def __init__(self, pipeline: Pipeline, project_id: int) -> None:
        self.pipeline = pipeline
        self.project_id = project_id
        self.accepted = 0
        self.accepted_value_sum = 0.0
        self.refusals = 0
        self.sent = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        for number in range(SUBMISSIONS):
            batches = submission(number)
            while True:
                try:
                    self.pipeline.submit(self.project_id, batches)
                except PipelineFull as exc:
                    assert exc.retry_after_s >= 1.0
                    self.refusals += 1
                    time.sleep(0.05)
                    continue
                break
            self.accepted += sum(len(batch.values) for batch in batches)
            self.accepted_value_sum += sum(sum(batch.values) for batch in batches)
            self.sent = number + 1
            time.sleep(0.02)


def test_stopping_postgres_during_load_loses_and_repeats_nothing(
    private_postgres: PrivatePostgres, tmp_path: Path
) -> None:
    engine = make_engine(private_postgres.url)
    metadata.create_all(engine)
    project_id = create_project(engine)
    pipeline = Pipeline(
        StoreSink(SampleWriter(engine)),
        config=PipelineConfig(
            batch_max_samples=2_000,
            flush_interval_s=0.05,
            queue_max_samples=10_000,
            retry_initial_s=0.1,
            retry_max_s=0.5,
        ),
        spool=Spool(tmp_path / "spool", max_bytes=256 * 1024 * 1024),
    )
    pipeline.start()
    load = Load(pipeline, project_id)
    load.thread.start()
    try:
        while load.sent < 60:
            time.sleep(0.01)
        private_postgres.stop("fast")
        stopped_at = load.sent
        time.sleep(2.0)
        private_postgres.start()
        load.thread.join(60)
        assert not load.thread.is_alive()
    finally:
        pipeline.stop(timeout_s=30)

    # The outage really happened while the load ran, and the spool carried it.
    assert load.sent - stopped_at > 50
    spooled = pipeline.registry.get_sample_value("tuneloop_collector_points_spooled_total")
    assert spooled is not None and spooled > 0
    assert pipeline.status().spool_bytes == 0

    total = SUBMISSIONS * SERIES * PER_SERIES
    assert load.accepted == total
    count, value_sum, repeated = stored_totals(engine)
    engine.dispose()
    assert repeated == 0
    assert count == load.accepted
    assert value_sum == load.accepted_value_sum
    written = pipeline.registry.get_sample_value("tuneloop_collector_points_written_total")
    assert written == total
