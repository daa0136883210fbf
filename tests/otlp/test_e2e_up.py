"""The issue's acceptance test: a real opentelemetry-sdk program exports to ``tuneloop up`` (a
real process, on SQLite and on PostgreSQL) and the exact values come back through the query
API."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import BACKENDS
from tests.helpers import free_port
from tests.otlp.conftest import eventually
from tests.otlp.query_api import QueryApi
from tests.otlp.sdk_program import JOB, SECOND, run_job

_TOKEN = re.compile(r"^\s*token\s+(tl_\S+)")


@pytest.fixture
def tuneloop_up(empty_database_url: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``tuneloop up`` on a free port: (base URL, the default project's token)."""
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TUNELOOP_")},
        "TUNELOOP_DATA_DIR": str(tmp_path / "data"),
        "TUNELOOP_DATABASE_URL": empty_database_url,
        "TUNELOOP_FLUSH_INTERVAL_S": "0.05",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "tuneloop", "up", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    lines: list[str] = []
    token = None
    for line in process.stdout:  # the banner comes before the server starts
        lines.append(line)
        if match := _TOKEN.match(line):
            token = match.group(1)
        if "Press Ctrl-C" in line:
            break
    # Keep draining the output so the process never blocks on a full pipe.
    drain = threading.Thread(target=lambda: lines.extend(process.stdout or ()), daemon=True)
    drain.start()
    base = f"http://127.0.0.1:{port}"
    try:
        assert token is not None, "".join(lines)
        deadline = time.monotonic() + 15
        while True:
            try:
                httpx.get(f"{base}/healthz", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "".join(lines)
                time.sleep(0.05)
        yield base, token
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
        drain.join(5)
    assert process.returncode == 0, "".join(lines)
    assert "Traceback" not in "".join(lines), "".join(lines)


@pytest.mark.parametrize("empty_database_url", BACKENDS, indirect=True)
def test_sdk_program_to_tuneloop_up(tuneloop_up: tuple[str, str]) -> None:
    base, token = tuneloop_up
    step_start = (time.time_ns() // SECOND - 30) * SECOND
    run_job(base, token, encoding="protobuf", use_gzip=True, step_start_ns=step_start)
    api = QueryApi(base, token, "default")
    job = {"job": "e2e-trainer"}
    assert eventually(lambda: api.latest("tuneloop_step_phase_seconds", **JOB)) == {
        "data_loading": "0.05",
        "forward": "0.2",
        "backward": "0.23",
        "optimizer": "0.02",
    }
    assert eventually(lambda: api.latest("train_tokens_total", **job)) == {"": "12"}
    assert api.latest("train_samples_total", **job) == {"": "128"}
    assert api.latest("gpu_memory_used_bytes", gpu="0", **job) == {"": "4250000000"}
    assert api.latest("train_step_duration_seconds_count", **job) == {"": "4"}
    assert api.quantile("train_step_duration_seconds", 0.75) == ["0.75"]
    assert api.latest("tuneloop_samples_per_second", **JOB) == {"": "128"}

    # The JSON encoding, against the same process: the job's second run.
    run_job(base, token, encoding="json", use_gzip=False, step_start_ns=step_start + SECOND)
    assert eventually(lambda: api.latest("tuneloop_step_number", **JOB) == {"": "7"})
    metrics = httpx.get(f"{base}/metrics").text
    assert 'tuneloop_otlp_requests_total{code="200",encoding="json",signal="traces"}' in metrics
