"""The collector writes through the contract when the runtime has a TSDB: what the pipeline
takes is readable from the TSDB, and a TSDB that does not answer is "try again later" (the
pipeline spools), never a loss."""

from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path

import pytest

from collector.service import build_pipeline
from collector.sinks.backend import BackendSink
from collector.sinks.base import SinkUnavailable
from tests.helpers import free_port
from tests.peers import flush_victoria_metrics
from tests.timeseries_contract.conftest import T0
from tuneloop.runtime import Runtime
from tuneloop.settings import Settings
from tuneloop.storage import make_engine, session_factory
from tuneloop.storage.prometheus.backend import PrometheusBackend
from tuneloop.storage.timeseries.types import SeriesBatch


@pytest.mark.parametrize("tsdb", ["victoriametrics", "prometheus"])
def test_the_pipeline_writes_into_the_tsdb(
    tsdb: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url: str = request.getfixturevalue(
        "victoria_metrics_url" if tsdb == "victoriametrics" else "prometheus_url"
    )
    database_url = f"sqlite:///{tmp_path / 'tuneloop.db'}"
    engine = make_engine(database_url)
    remote = PrometheusBackend(url)
    settings = Settings(database_url=database_url, data_dir=tmp_path, flush_interval_s=0.05)
    runtime = Runtime(settings, engine, session_factory(engine), remote_series=remote)
    project = random.randrange(100_000_000, 999_999_999)  # the TSDB is shared
    times = [T0 + timedelta(seconds=s) for s in range(0, 60, 10)]
    pipeline = build_pipeline(runtime)
    pipeline.start()
    try:
        pipeline.submit(project, [SeriesBatch("tl_util", {"gpu": "0"}, times, [1, 2, 3, 4, 5, 6])])
    finally:
        pipeline.stop()
    if tsdb == "victoriametrics":
        flush_victoria_metrics(url)
    try:
        (newest,) = remote.latest(project, "tl_util", since=T0)
        assert (newest.ts, newest.value) == (times[-1], 6.0)
    finally:
        runtime.close()


def test_an_unreachable_tsdb_is_retried_later() -> None:
    backend = PrometheusBackend(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    try:
        with pytest.raises(SinkUnavailable):
            BackendSink(backend).write(1, [SeriesBatch("tl_util", {}, [T0], [1.0])])
    finally:
        backend.close()
