"""End to end: a real opentelemetry-sdk program exports metrics and step spans over OTLP/HTTP
(protobuf and JSON, with and without gzip) to a real API server (uvicorn, real SQLite and
PostgreSQL), and the exact values are read back through the query API."""

from __future__ import annotations

import time

import pytest

from tests.api.conftest import Minter
from tests.otlp.conftest import eventually
from tests.otlp.query_api import QueryApi
from tests.otlp.sdk_program import JOB, SECOND, run_job


@pytest.mark.parametrize(
    ("encoding", "use_gzip"),
    [("protobuf", False), ("protobuf", True), ("json", False), ("json", True)],
)
def test_sdk_exports_are_read_back_exactly(
    server: str, mint: Minter, encoding: str, use_gzip: bool
) -> None:
    mint.project("fleet")
    token = mint.token("fleet", "agent", "llama-agent")
    step_start = (time.time_ns() // SECOND - 30) * SECOND
    run_job(server, token, encoding=encoding, use_gzip=use_gzip, step_start_ns=step_start)
    api = QueryApi(server, token, "fleet")
    job = {"job": "e2e-trainer"}

    # The pipeline writes asynchronously: wait for the last series written to appear.
    assert eventually(lambda: api.latest("tuneloop_step_phase_seconds", **JOB)) == {
        "data_loading": "0.05",
        "forward": "0.2",
        "backward": "0.23",
        "optimizer": "0.02",
    }
    assert eventually(lambda: api.latest("train_tokens_total", **job)) == {"": "12"}
    assert api.latest("train_samples_total", **job) == {"": "128"}
    assert api.latest("gpu_memory_used_bytes", gpu="0", **job) == {"": "4250000000"}
    assert api.latest("train_step_duration_seconds_bucket", **job) == {
        "0.1": "0",
        "0.25": "1",
        "0.5": "3",
        "1.0": "4",
        "+Inf": "4",
    }
    assert api.latest("train_step_duration_seconds_sum", **job) == {"": "1.5"}
    assert api.latest("train_step_duration_seconds_count", **job) == {"": "4"}
    # Between the two exports: 0.3 in (0.25, 0.5] and 0.7 in (0.5, 1]. The median
    # interpolates to the top of the first, the 0.75-quantile to the middle of the second.
    assert api.quantile("train_step_duration_seconds", 0.5) == ["0.5"]
    assert api.quantile("train_step_duration_seconds", 0.75) == ["0.75"]

    assert api.latest("tuneloop_step_duration_seconds", **JOB) == {"": "0.5"}
    assert api.latest("tuneloop_samples_per_second", **JOB) == {"": "128"}
    assert api.latest("tuneloop_step_number", **JOB) == {"": "7"}
