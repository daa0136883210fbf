"""The pipeline against real stores (SQLite and PostgreSQL) and a really unreachable one (a
closed port): batching, back-pressure, spooling, rejections."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select, text

from collector.pipeline import Pipeline, PipelineConfig, PipelineFull
from collector.points import Point, to_batches
from collector.relabel import Relabeler, parse_rules
from collector.selfmetrics import REASONS, rejection_reason
from collector.sinks.base import SinkUnavailable
from collector.sinks.store import StoreSink, is_unreachable
from collector.spool import Spool
from tests.collector.conftest import create_project
from tests.helpers import wait_for
from tuneloop.storage import make_engine
from tuneloop.storage.models import samples
from tuneloop.storage.timeseries.types import Rejection, RejectionCode, SeriesBatch, WriteResult
from tuneloop.storage.timeseries.writer import SampleWriter

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
UNREACHABLE = "postgresql+psycopg://postgres@127.0.0.1:1/test"


def series(n: int, *, start: int = 0, gpu: str = "0", metric: str = "util") -> SeriesBatch:
    return SeriesBatch(
        metric,
        {"gpu": gpu},
        [T0 + timedelta(seconds=start + i) for i in range(n)],
        [float(start + i) for i in range(n)],
    )


class RecordingSink:
    """A real sink, with a record of each write (time, project, samples)."""

    def __init__(self, inner: StoreSink) -> None:
        self.inner = inner
        self.writes: list[tuple[float, int, int]] = []

    def write(self, project_id: int, batches: Sequence[SeriesBatch]) -> WriteResult:
        result = self.inner.write(project_id, batches)
        self.writes.append((time.monotonic(), project_id, sum(len(b.values) for b in batches)))
        return result


class SwitchableSink:
    """Writes through ``current``: a sink on a closed port until the test "restores" the
    store by pointing it at a real one."""

    def __init__(self, current: StoreSink) -> None:
        self.current = current

    def write(self, project_id: int, batches: Sequence[SeriesBatch]) -> WriteResult:
        return self.current.write(project_id, batches)


def stored(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(select(func.count()).select_from(samples)).scalar_one())


def metric(pipeline: Pipeline, name: str, **labels: str) -> float:
    value = pipeline.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


@pytest.fixture
def unreachable_sink() -> StoreSink:
    return StoreSink(SampleWriter(make_engine(UNREACHABLE)))


# --------------------------------------------------------------------------- edges


def test_to_batches_groups_points_per_series_in_order() -> None:
    def point(gpu: str, seconds: int, value: float) -> Point:
        return Point("util", {"gpu": gpu}, T0 + timedelta(seconds=seconds), value)

    batches = to_batches([point("0", 0, 1.0), point("1", 0, 5.0), point("0", 1, 2.0)])
    assert [(b.labels["gpu"], list(b.values)) for b in batches] == [("0", [1.0, 2.0]), ("1", [5.0])]


def test_store_errors_are_classified_by_class() -> None:
    import sqlite3

    import psycopg
    from sqlalchemy import exc

    assert is_unreachable(psycopg.OperationalError("server closed the connection"))
    assert is_unreachable(exc.OperationalError("x", {}, Exception()))
    assert is_unreachable(ConnectionRefusedError())
    locked = sqlite3.OperationalError("database is locked")
    locked.sqlite_errorcode = sqlite3.SQLITE_BUSY  # type: ignore[attr-defined]
    assert is_unreachable(locked)
    missing = sqlite3.OperationalError("no such table: samples")
    missing.sqlite_errorcode = sqlite3.SQLITE_ERROR  # type: ignore[attr-defined]
    assert not is_unreachable(missing)
    assert not is_unreachable(psycopg.errors.UndefinedTable("samples"))
    assert not is_unreachable(exc.IntegrityError("x", {}, Exception()))
    assert not is_unreachable(ValueError("bug"))


# --------------------------------------------------------------------------- batching


def test_batches_by_size(engine: Engine, project_id: int) -> None:
    sink = RecordingSink(StoreSink(SampleWriter(engine)))
    config = PipelineConfig(batch_max_samples=100, flush_interval_s=60)
    pipeline = Pipeline(sink, config=config)
    pipeline.start()
    try:
        pipeline.submit(project_id, [series(60)])
        time.sleep(0.3)
        assert sink.writes == [] and pipeline.status().queued_samples == 60
        pipeline.submit(project_id, [series(40, start=60, gpu="1")])
        wait_for(lambda: len(sink.writes) == 1)
        assert [samples_ for _, _, samples_ in sink.writes] == [100]
        assert stored(engine) == 100
        # Larger backlogs go out in writes of at most batch_max_samples.
        for start in range(0, 250, 50):
            pipeline.submit(project_id, [series(50, start=1000 + start)])
        wait_for(lambda: sum(s for _, _, s in sink.writes) == 300)
        assert all(s <= 100 for _, _, s in sink.writes)
    finally:
        pipeline.stop()
    assert stored(engine) == 350
    assert metric(pipeline, "tuneloop_collector_points_written_total") == 350
    assert metric(pipeline, "tuneloop_collector_queue_depth") == 0


def test_batches_by_time(engine: Engine, project_id: int) -> None:
    sink = RecordingSink(StoreSink(SampleWriter(engine)))
    pipeline = Pipeline(sink, config=PipelineConfig(batch_max_samples=10_000, flush_interval_s=0.3))
    pipeline.start()
    try:
        submitted = time.monotonic()
        pipeline.submit(project_id, [series(5)])
        pipeline.submit(project_id, [series(5, start=5)])
        wait_for(lambda: len(sink.writes) == 1)
        written_at, _, count = sink.writes[0]
        assert count == 10
        assert written_at - submitted >= 0.29
        assert stored(engine) == 10
    finally:
        pipeline.stop()
    assert metric(pipeline, "tuneloop_collector_write_duration_seconds_count") == 1


def test_queued_items_are_merged_into_one_write_per_project(engine: Engine) -> None:
    first, second = create_project(engine, "a"), create_project(engine, "b")
    sink = RecordingSink(StoreSink(SampleWriter(engine)))
    pipeline = Pipeline(sink)  # not started: everything waits for stop()
    for start in range(0, 50, 10):
        pipeline.submit(first, [series(10, start=start)])
        pipeline.submit(second, [series(2, start=start)])
    pipeline.stop()
    assert [(project, count) for _, project, count in sink.writes] == [(first, 50), (second, 10)]
    assert stored(engine) == 60


# --------------------------------------------------------------------------- back-pressure


def test_a_full_queue_refuses_whole_submissions(engine: Engine, project_id: int) -> None:
    config = PipelineConfig(queue_max_samples=100, flush_interval_s=2.5)
    pipeline = Pipeline(StoreSink(SampleWriter(engine)), config=config)  # not started
    pipeline.submit(project_id, [series(30), series(30, gpu="1")])
    with pytest.raises(PipelineFull) as refused:
        pipeline.submit(project_id, [series(20, start=100, gpu=str(i)) for i in range(3)])
    assert refused.value.retry_after_s == 2.5
    pipeline.submit(project_id, [series(40, start=200)])  # exactly fills it
    assert pipeline.status().queued_samples == 100
    pipeline.stop()
    assert stored(engine) == 100  # nothing of the refused submission was kept
    assert metric(pipeline, "tuneloop_collector_points_rejected_total", reason="queue_full") == 60
    assert metric(pipeline, "tuneloop_collector_points_received_total") == 160


def test_an_oversized_submission_is_let_into_an_empty_queue(
    engine: Engine, project_id: int
) -> None:
    pipeline = Pipeline(
        StoreSink(SampleWriter(engine)), config=PipelineConfig(queue_max_samples=10)
    )
    pipeline.submit(project_id, [series(25)])
    with pytest.raises(PipelineFull) as refused:
        pipeline.submit(project_id, [series(1, start=100)])
    assert refused.value.retry_after_s == 1.0  # never less than a second
    pipeline.stop()
    assert stored(engine) == 25


def test_retry_after_grows_with_the_backlog(
    engine: Engine, project_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = Pipeline(
        StoreSink(SampleWriter(engine)), config=PipelineConfig(queue_max_samples=10)
    )
    clock = [1000.0]
    monkeypatch.setattr("collector.pipeline.time.monotonic", lambda: clock[0])
    pipeline.submit(project_id, [series(10)])
    clock[0] += 7.4  # the store has not taken anything for 7.4 s
    with pytest.raises(PipelineFull) as refused:
        pipeline.submit(project_id, [series(1, start=100)])
    assert refused.value.retry_after_s == pytest.approx(7.4)
    monkeypatch.undo()
    pipeline.stop()


def test_a_stopped_pipeline_refuses(engine: Engine, project_id: int) -> None:
    pipeline = Pipeline(StoreSink(SampleWriter(engine)))
    pipeline.start()
    pipeline.stop()
    with pytest.raises(PipelineFull):
        pipeline.submit(project_id, [series(1)])


# --------------------------------------------------------------------------- store unreachable


def test_unreachable_store_spools_then_refuses_when_spool_and_memory_are_full(
    unreachable_sink: StoreSink, tmp_path: Path
) -> None:
    spool = Spool(tmp_path / "spool", max_bytes=1024 * 1024, segment_bytes=64 * 1024)
    config = PipelineConfig(
        flush_interval_s=0.01, queue_max_samples=500, retry_initial_s=5, retry_max_s=8
    )
    pipeline = Pipeline(unreachable_sink, config=config, spool=spool)
    pipeline.start()
    try:
        pipeline.submit(7, [series(10)])
        wait_for(lambda: pipeline.status().spooling)
        assert metric(pipeline, "tuneloop_collector_points_spooled_total") == 10
        # While spooling, each submission is on disk when submit returns.
        pipeline.submit(7, [series(10, start=10)])
        assert metric(pipeline, "tuneloop_collector_points_spooled_total") == 20
        assert pipeline.status().queued_samples == 0
        # Fill the spool (1 MiB), then memory behind it, then be refused.
        refused = None
        start = 20
        while refused is None:
            try:
                pipeline.submit(7, [series(250, start=start)])
            except PipelineFull as exc:
                refused = exc
            start += 250
        assert 1.0 <= refused.retry_after_s <= 8
        status = pipeline.status()
        assert status.spooling and status.queued_samples == 500
        spooled = metric(pipeline, "tuneloop_collector_points_spooled_total")
        assert spooled + status.queued_samples == start - 250
        assert status.spool_bytes <= 1024 * 1024
        assert metric(pipeline, "tuneloop_collector_spool_bytes") == status.spool_bytes
    finally:
        pipeline.stop(timeout_s=0.5)
    # The store never came back: memory went to the spool as far as it could, the rest is lost
    # and counted (it is the only way a sample can be lost: a full disk at shutdown).
    lost = metric(pipeline, "tuneloop_collector_points_rejected_total", reason="shutdown_lost")
    assert lost == 500
    assert spool.slot is None  # released for the next process
    assert list((tmp_path / "spool" / "slot-0").glob("*.seg"))


def test_without_a_spool_the_store_is_retried_and_order_kept(
    engine: Engine, project_id: int, unreachable_sink: StoreSink
) -> None:
    sink = SwitchableSink(unreachable_sink)
    config = PipelineConfig(flush_interval_s=0.01, retry_initial_s=0.05, retry_max_s=0.1)
    pipeline = Pipeline(sink, config=config)
    pipeline.start()
    try:
        for start in range(0, 30, 3):
            pipeline.submit(project_id, [series(3, start=start)])
        wait_for(lambda: pipeline.status().spooling)
        sink.current = StoreSink(SampleWriter(engine))  # the store is back
        wait_for(lambda: not pipeline.status().spooling)
    finally:
        pipeline.stop()
    with engine.connect() as connection:
        values = connection.execute(select(samples.c.value).order_by(samples.c.ts)).scalars()
        assert list(values) == [float(i) for i in range(30)]


def test_store_comes_back_spool_is_replayed_before_new_data(
    engine: Engine, project_id: int, unreachable_sink: StoreSink, tmp_path: Path
) -> None:
    sink = SwitchableSink(unreachable_sink)
    recorder = RecordingSink(sink)  # type: ignore[arg-type]
    config = PipelineConfig(
        batch_max_samples=5, flush_interval_s=0.01, retry_initial_s=0.05, retry_max_s=0.1
    )
    spool = Spool(tmp_path, max_bytes=1 << 20)
    pipeline = Pipeline(recorder, config=config, spool=spool)
    pipeline.start()
    try:
        for start in range(0, 20):
            pipeline.submit(project_id, [series(1, start=start)])
        wait_for(lambda: pipeline.status().spooling)
        sink.current = StoreSink(SampleWriter(engine))
        for start in range(20, 40):
            pipeline.submit(project_id, [series(1, start=start)])
        wait_for(lambda: stored(engine) == 40)
    finally:
        pipeline.stop()
    with engine.connect() as connection:
        values = list(connection.execute(select(samples.c.value)).scalars())
    assert sorted(values) == [float(i) for i in range(40)]
    assert metric(pipeline, "tuneloop_collector_points_written_total") == 40
    assert spool.pending_bytes == 0


# --------------------------------------------------------------------------- permanent rejections


def test_rejections_are_counted_by_reason_and_never_retried(engine: Engine) -> None:
    capped = create_project(engine, "capped", max_series=2)
    sink = RecordingSink(StoreSink(SampleWriter(engine)))
    relabeler = Relabeler(parse_rules([{"action": "drop", "source_labels": ["gpu"], "regex": "9"}]))
    pipeline = Pipeline(sink, relabeler=relabeler)
    pipeline.submit(
        capped,
        [
            series(3, gpu="0"),
            series(3, gpu="1"),
            series(4, gpu="2"),  # a third series: over the project's cap of 2
            SeriesBatch("util", {"gpu": "3"}, [T0, T0], [1.0, math.nan]),
            SeriesBatch("util", {"gpu": "4"}, [datetime(2026, 1, 1)], [1.0]),  # naive
            series(5, gpu="9"),  # dropped by the relabel rule
        ],
    )
    pipeline.submit(capped + 100, [series(6)])  # no such project
    pipeline.stop()
    reasons = {
        reason: metric(pipeline, "tuneloop_collector_points_rejected_total", reason=reason)
        for reason in (
            "series_limit",
            "nan_value",
            "invalid_timestamp",
            "relabel_drop",
            "unknown_project",
        )
    }
    assert reasons == {
        "series_limit": 5,  # the third series (4) and the fourth's non-NaN sample (1)
        "nan_value": 1,
        "invalid_timestamp": 1,
        "relabel_drop": 5,
        "unknown_project": 6,
    }
    assert stored(engine) == 6
    assert len(sink.writes) == 2  # one per project, no retry


def test_the_label_is_the_rejection_code_not_its_wording() -> None:
    reworded = Rejection("m", {}, 1, "Serienlimit erreicht", RejectionCode.SERIES_LIMIT)
    assert rejection_reason(reworded) == "series_limit"
    # A code outside the known set (a third-party sink) must not add label values.
    assert rejection_reason(Rejection("m", {}, 1, "series limit reached", "made_up")) == "other"
    assert "other" in REASONS and set(RejectionCode) <= set(REASONS)


def test_a_permanent_store_error_is_counted_not_retried(
    engine: Engine, project_id: int, tmp_path: Path
) -> None:
    with engine.begin() as connection:
        connection.execute(text("DROP TABLE samples"))
    spool = Spool(tmp_path, max_bytes=1 << 20)
    sink = RecordingSink(StoreSink(SampleWriter(engine)))
    pipeline = Pipeline(sink, spool=spool, config=PipelineConfig(flush_interval_s=0.01))
    pipeline.start()
    try:
        pipeline.submit(project_id, [series(7)])
        wait_for(
            lambda: (
                metric(pipeline, "tuneloop_collector_points_rejected_total", reason="write_failed")
                == 7
            )
        )
    finally:
        pipeline.stop()
    assert not pipeline.status().spooling and spool.slot is None
    assert metric(pipeline, "tuneloop_collector_points_spooled_total") == 0


def test_sink_unavailable_carries_the_first_line(unreachable_sink: StoreSink) -> None:
    with pytest.raises(SinkUnavailable) as excinfo:
        unreachable_sink.write(1, [series(1)])
    assert "127.0.0.1" in str(excinfo.value) and "\n" not in str(excinfo.value)
