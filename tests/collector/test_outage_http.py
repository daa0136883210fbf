"""The outage test over HTTP: clients export OTLP/protobuf to a real API server (uvicorn on a
real socket) at a steady rate while its private PostgreSQL server is stopped and started again.
Every data point answered 200 without ``partial_success`` is in the database exactly once.

Tokens the database confirmed before the outage keep routing exports through it (into the
pipeline's spool); a token it never confirmed is refused with 503 until it is back.

Direct protobuf POSTs rather than the SDK exporter: the count of accepted points must be exact,
so each request's fate has to be known, and a refused one (503 with Retry-After) is retried
at once rather than after the SDK's backoff, to keep the test short.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import httpx
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.metrics.v1.metrics_pb2 import Gauge, Metric

from collector.pipeline import Pipeline
from collector.service import build_pipeline
from tests.api.conftest import Minter
from tests.collector.conftest import PrivatePostgres
from tests.helpers import api_server, stored_totals
from tests.otlp.builders import metrics_request, number
from tuneloop.runtime import Runtime
from tuneloop.settings import Settings
from tuneloop.storage import make_engine, session_factory
from tuneloop.storage.models import metadata

SERIES = 5
PER_SERIES = 10  # 50 points a request
PACE_S = 0.02
OUTAGE_S = 2.0
FLUSH_S = 1.0


def export_request(number_: int, base_ns: int) -> tuple[ExportMetricsServiceRequest, float]:
    """Request ``number_``: points unique by (series, time) across the whole load, with values
    that encode both, so a lost, repeated or altered point shows in the totals."""
    points = []
    for series in range(SERIES):
        for index in range(PER_SERIES):
            offset = (number_ * SERIES + series) * PER_SERIES + index
            points.append(
                number(
                    float(number_ * 1000 + series * 100 + index),
                    base_ns + offset * 1_000_000,  # 1 ms apart
                    {"series": str(series)},
                )
            )
    metric = Metric(name="load.value", gauge=Gauge(data_points=points))
    return metrics_request([metric]), sum(point.as_double for point in points)


class Load:
    """One client posting at a steady pace; a refused request is sent again until accepted."""

    def __init__(self, url: str, token: str) -> None:
        self.url = f"{url}/v1/metrics"
        self.headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/x-protobuf",
        }
        self.base_ns = (time.time_ns() // 1_000_000_000 - 600) * 1_000_000_000
        self.accepted = 0
        self.accepted_value_sum = 0.0
        self.statuses: Counter[int] = Counter()
        self.partial: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    @property
    def accepted_requests(self) -> int:
        return self.statuses[200]

    def run(self) -> None:
        with httpx.Client(timeout=10) as client:
            number_ = 0
            while not self.stop.is_set():
                request, value_sum = export_request(number_, self.base_ns)
                body = request.SerializeToString()
                while not self.stop.is_set():
                    response = client.post(self.url, content=body, headers=self.headers)
                    self.statuses[response.status_code] += 1
                    if response.status_code == 200:
                        answer = ExportMetricsServiceResponse.FromString(response.content)
                        if answer.HasField("partial_success"):
                            self.partial.append(str(answer.partial_success))
                        else:
                            self.accepted += SERIES * PER_SERIES
                            self.accepted_value_sum += value_sum
                        break
                    time.sleep(PACE_S)  # refused: nothing kept; send the same points again
                number_ += 1
                time.sleep(PACE_S)

    def wait_for_accepted_requests(self, count: int, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.accepted_requests < count:
            assert time.monotonic() < deadline, f"load stuck: {dict(self.statuses)}"
            assert self.thread.is_alive()
            time.sleep(0.01)


def wait_for_a_write(pipeline: Pipeline, timeout_s: float = 10.0) -> None:
    def written() -> float:
        value = pipeline.registry.get_sample_value("tuneloop_collector_points_written_total")
        return value or 0.0

    before = written()
    deadline = time.monotonic() + timeout_s
    while written() == before:
        assert time.monotonic() < deadline, "the pipeline wrote nothing"
        time.sleep(0.005)


def test_stopping_postgres_under_http_load_loses_and_repeats_nothing(
    private_postgres: PrivatePostgres, tmp_path: Path
) -> None:
    engine = make_engine(private_postgres.url)
    metadata.create_all(engine)
    settings = Settings(
        database_url=private_postgres.url,
        redis_url=None,
        data_dir=tmp_path,
        # See the timing of the stop below; short retries so that replay starts soon after
        # the server is back.
        flush_interval_s=FLUSH_S,
        store_retry_max_s=0.5,
    )
    runtime = Runtime(settings=settings, engine=engine, sessions=session_factory(engine))
    mint = Minter(runtime)
    mint.project("fleet")
    token = mint.token("fleet", "agent", "loader")
    unseen = mint.token("fleet", "agent", "never-used-before-the-outage")
    pipeline = build_pipeline(runtime)  # the real wiring: settings, spool in data_dir
    pipeline.start()
    try:
        with api_server(runtime, pipeline, log_level="error") as (url, _, server_thread):
            load = Load(url, token)
            load.thread.start()
            try:
                load.wait_for_accepted_requests(30)
                # Stop the server a moment after a flush: the points accepted since then are
                # still queued, and the next flush (FLUSH_S after the first of them) finds the
                # server gone, so they must go through the spool. Stopping at a random moment
                # would, now and then, follow a flush so closely that nothing was left to spool.
                wait_for_a_write(pipeline)
                time.sleep(0.2)
                private_postgres.stop("fast")
                stopped_at = load.accepted_requests
                time.sleep(OUTAGE_S / 2)
                refused = httpx.post(
                    f"{url}/v1/metrics",
                    content=export_request(10**6, load.base_ns)[0].SerializeToString(),
                    headers={**load.headers, "Authorization": f"Bearer {unseen}"},
                    timeout=10,
                )
                time.sleep(OUTAGE_S / 2)
                during = load.accepted_requests - stopped_at
                private_postgres.start()
                load.wait_for_accepted_requests(load.accepted_requests + 30)
            finally:
                load.stop.set()
                load.thread.join(15)
    finally:
        pipeline.stop(timeout_s=15)

    assert not load.thread.is_alive() and not server_thread.is_alive()
    # The known token kept exporting through the outage, into the spool; the unknown one was
    # refused with Retry-After, since only the database can vouch for it.
    assert during > 10, dict(load.statuses)
    assert refused.status_code == 503 and "Retry-After" in refused.headers
    assert set(load.statuses) <= {200, 503}, dict(load.statuses)
    assert load.partial == []
    spooled = pipeline.registry.get_sample_value("tuneloop_collector_points_spooled_total")
    assert spooled is not None and spooled > 0
    assert pipeline.status().spool_bytes == 0

    count, value_sum, repeated = stored_totals(engine)
    engine.dispose()
    assert repeated == 0
    assert count == load.accepted
    assert value_sum == load.accepted_value_sum
    written = pipeline.registry.get_sample_value("tuneloop_collector_points_written_total")
    assert written == load.accepted
