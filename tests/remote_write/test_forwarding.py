"""Forwarding to a real VictoriaMetrics: what tuneloop stores, VictoriaMetrics holds too (each
series with ``tuneloop_project``), and while it is down the samples wait in the forward's own
spool, through a restart, and arrive once it is up: nothing acknowledged is lost. When the
forward's spool is full the sender is refused, and its retry is kept once by each destination."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine

from collector.fanout import FanOut, WritePipeline
from collector.pipeline import Pipeline, PipelineConfig, PipelineFull
from collector.service import build_pipeline
from collector.sinks.remote_write import RemoteWriteSink
from collector.sinks.store import StoreSink
from collector.spool import Spool
from tests.api.conftest import Minter, bearer
from tests.helpers import api_server, wait_for
from tests.peers import running_victoria_metrics
from tests.remote_write.conftest import Stored, assert_same, exported, stored_series
from tuneloop import remote_write
from tuneloop.ports import free_port
from tuneloop.runtime import Runtime
from tuneloop.settings import Settings
from tuneloop.storage import session_factory
from tuneloop.storage.prometheus.remote_writer import RemoteWriter
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter

T0 = datetime(2026, 11, 1, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)


def forwarding_runtime(engine: Engine, database_url: str, data_dir: Path, url: str) -> Runtime:
    settings = Settings(
        database_url=database_url,
        redis_url=None,
        data_dir=data_dir,
        flush_interval_s=0.05,
        store_retry_max_s=0.5,
        remote_write_url=url,
        remote_write_timeout_s=5.0,
    )
    return Runtime(settings=settings, engine=engine, sessions=session_factory(engine))


@pytest.fixture
def started() -> Iterator[list[WritePipeline]]:
    """Pipelines a test started, stopped at its end whatever happens."""
    pipelines: list[WritePipeline] = []
    yield pipelines
    for pipeline in pipelines:
        pipeline.stop(timeout_s=2.0)


def batches(start: int, count: int) -> list[SeriesBatch]:
    """A collector's poll: two GPUs' utilization and a counter, ``count`` seconds of each."""
    stamps = [T0 + timedelta(seconds=start + i) for i in range(count)]
    return [
        SeriesBatch("gpu_utilization", {"gpu": gpu}, stamps, [0.5 + i / 100 for i in range(count)])
        for gpu in ("0", "1")
    ] + [
        SeriesBatch(
            "train_steps_total",
            {"job": "llm"},
            stamps,
            [float(start + i) for i in range(count)],
            SeriesKind.COUNTER,
        )
    ]


def total(stored: Stored) -> int:
    return sum(len(samples) for samples in stored.values())


def test_what_tuneloop_stores_victoria_metrics_holds_too(
    engine: Engine, database_url: str, tmp_path: Path, mint: Minter, started: list[WritePipeline]
) -> None:
    project_id = mint.project("fleet")
    token = bearer(mint.token("fleet", "agent", "prometheus"))
    with running_victoria_metrics(tmp_path / "vm") as vm:
        runtime = forwarding_runtime(engine, database_url, tmp_path / "data", f"{vm}/api/v1/write")
        registry = CollectorRegistry()
        pipeline = build_pipeline(runtime, registry=registry)
        assert isinstance(pipeline, FanOut)
        pipeline.start()
        started.append(pipeline)
        # A source's poll, straight into the pipeline...
        pipeline.submit(project_id, batches(0, 30))
        # ...and a sender's remote write through the API.
        with api_server(runtime, pipeline) as (url, _, _):
            body = remote_write.encode(
                [remote_write.series("node_load1", {"host": "a"}, [T0_MS, T0_MS + 500], [1.5, 2.0])]
            )
            answer = httpx.post(
                f"{url}/api/v1/write", content=body, headers={**remote_write.HEADERS, **token}
            )
            assert answer.status_code == 204, answer.text
        wait_for(lambda: total(stored_series(engine, project_id)) == 92, 15, "stored", every_s=0.1)
        wait_for(lambda: total(exported(vm, project_id)) == 92, 15, "forwarded", every_s=0.2)
        assert_same(exported(vm, project_id), stored_series(engine, project_id))
    # The forward's own counters, beside the store pipeline's.
    assert registry.get_sample_value("tuneloop_forward_points_written_total") == 92
    assert registry.get_sample_value("tuneloop_collector_points_written_total") == 92


def test_an_unreachable_tsdb_spools_and_gets_every_sample_once_up(
    engine: Engine, database_url: str, tmp_path: Path, mint: Minter, started: list[WritePipeline]
) -> None:
    project_id = mint.project("fleet")
    port = free_port()  # nothing listens there yet
    runtime = forwarding_runtime(
        engine, database_url, tmp_path / "data", f"http://127.0.0.1:{port}/api/v1/write"
    )
    first = build_pipeline(runtime)
    assert isinstance(first, FanOut)
    first.start()
    started.append(first)
    for second in range(0, 60, 10):
        first.submit(project_id, batches(second, 10))  # acknowledged
    # The store has them; the forward is spooling.
    wait_for(lambda: total(stored_series(engine, project_id)) == 180, 15, "stored", every_s=0.1)
    wait_for(lambda: first.forwards[0].status().spooling, 15, "the forward spooling")
    # The process stops while the TSDB is still down: the forward's spool keeps the samples.
    first.stop(timeout_s=1.0)
    assert any((tmp_path / "data" / "spool" / "remote-write").rglob("*.seg"))
    restarted = build_pipeline(runtime)
    restarted.start()
    started.append(restarted)
    restarted.submit(project_id, batches(60, 10))
    with running_victoria_metrics(tmp_path / "vm", port=port) as vm:
        wait_for(lambda: total(exported(vm, project_id)) >= 210, 30, "forwarded", every_s=0.3)
        assert_same(exported(vm, project_id), stored_series(engine, project_id))


def test_a_full_forward_refuses_the_sender_whose_retry_each_destination_keeps_once(
    engine: Engine, tmp_path: Path, mint: Minter, started: list[WritePipeline]
) -> None:
    project_id = mint.project("fleet")
    port = free_port()  # the TSDB is down...
    primary = Pipeline(
        StoreSink(SampleWriter(engine)), config=PipelineConfig(flush_interval_s=0.05)
    )
    forward = Pipeline(
        RemoteWriteSink(RemoteWriter(f"http://127.0.0.1:{port}/api/v1/write")),
        config=PipelineConfig(flush_interval_s=0.05, durable=True, retry_max_s=0.5),
        spool=Spool(tmp_path / "forward", max_bytes=8 * 1024),  # ...and its log fills fast
    )
    fanout = FanOut(primary, [forward])
    fanout.start()
    started.append(fanout)
    accepted: list[int] = []
    refused = None
    for second in range(0, 3000, 10):
        try:
            fanout.submit(project_id, batches(second, 10))
        except PipelineFull:
            refused = second
            break
        accepted.append(second)
    assert refused is not None, "the forward's log never filled"
    with running_victoria_metrics(tmp_path / "vm", port=port) as vm:
        # The sender retries what was refused until it is taken, as told by Retry-After.
        wait_for(lambda: _taken(fanout, project_id, refused), 30, "the retry taken", every_s=0.2)
        due = 30 * (len(accepted) + 1)
        wait_for(lambda: total(exported(vm, project_id)) >= due, 30, "forwarded", every_s=0.3)
        store = stored_series(engine, project_id)
        assert total(store) == due  # the store took the refused submission once, not twice
        assert_same(exported(vm, project_id), store)


def _taken(fanout: FanOut, project_id: int, second: int) -> bool:
    try:
        fanout.submit(project_id, batches(second, 10))
    except PipelineFull:
        return False
    return True
