"""``tuneloop up`` on the embedded default: a real process, a real port, real SQLite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.helpers import free_port


def test_up_serves_healthz_within_10_seconds_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TUNELOOP_")},
        "TUNELOOP_DATA_DIR": str(tmp_path / "data"),
        "TUNELOOP_COLLECT_INTERVAL_S": "0.5",
    }
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "tuneloop", "up", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        health = None
        while time.monotonic() - started < 10:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        assert health is not None, "no answer on /healthz within 10 s"
        assert health.status_code == 200
        assert health.json()["checks"]["database"]["ok"] is True
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=20)
    assert process.returncode == 0, output
    assert "token      tl_" in output
    assert f"OTLP       http://127.0.0.1:{port}/v1/metrics\n" in output
    assert f"http://127.0.0.1:{port}/v1/traces  (step timings: docs/step-timing.md)" in output
    # The default sources are auto: this host (plus a GPU source on a GPU node), said why.
    assert "sources    host every 0.5s" in output
    assert "GPU source: " in output
    assert "Traceback" not in output
    assert (tmp_path / "data" / "tuneloop.db").exists()

    # A second start reuses the project and does not print a new token.
    second = subprocess.Popen(
        [sys.executable, "-m", "tuneloop", "up", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
    finally:
        second.send_signal(signal.SIGINT)
        output, _ = second.communicate(timeout=20)
    assert second.returncode == 0, output
    assert "token      tl_" not in output
