"""The example service against a live tuneloop API: tuneloop's own webhook target asks the
scaler for a replica, a real server process starts, registers and declares its batching knobs,
takes a config released through the API between two batches and acknowledges it, answers
requests, and stops when scaled to 0.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import torch
import uvicorn

from actuators.autoscaler.webhook import WebhookScaleTarget
from examples.inference import model as models
from examples.inference.scaler import ReplicaPool, build_app
from tests.agent.conftest import Live
from tuneloop.ports import free_port

JOB = "digits-serve"


def wait_for(probe: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    """Untrained weights: the serving path is what is tested, not the accuracy."""
    path = tmp_path / "weights.pt"
    torch.save(models.build().state_dict(), path)
    return path


@pytest.fixture
def scaler(
    live: Live, weights: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, ReplicaPool]]:
    """The scaler's app on a free port; its replicas report to ``live`` as job ``JOB``."""
    for name, value in {
        "URL": live.url,
        "TOKEN": live.agent_token,
        "JOB": JOB,
        "PROJECT": live.project,
    }.items():
        monkeypatch.setenv(f"TUNELOOP_{name}", value)
    args = ["--weights", str(weights), "--max-batch-size", "8", "--max-delay-ms", "5"]
    pool = ReplicaPool(args, tmp_path / "logs")
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(build_app(pool), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 10, "the scaler")
    try:
        yield f"http://127.0.0.1:{port}", pool
    finally:
        server.should_exit = True
        thread.join(10)
        pool.close()


def test_the_webhook_scales_real_replicas_that_take_released_knobs(
    live: Live, scaler: tuple[str, ReplicaPool]
) -> None:
    url, pool = scaler
    member = {"Authorization": f"Bearer {live.member_token}"}
    job_url = live.job_url(JOB)
    target = WebhookScaleTarget(f"{url}/scale")
    try:
        assert target.get_replicas() == 0
        target.set_replicas(1, "test: one replica")
        assert target.get_replicas() == 1
        [replica_url] = wait_for(pool.ready_urls, 90, "the replica to answer")
        [process] = [r.process for r in pool.replicas]

        answer = httpx.post(f"{replica_url}/predict", json={"pixels": [0.5] * 64}, timeout=10)
        assert answer.status_code == 200, answer.text
        assert answer.json()["variant"] == "float32" and 0 <= answer.json()["label"] <= 9
        short = httpx.post(f"{replica_url}/predict", json={"pixels": [0.5] * 3}, timeout=10)
        assert short.status_code == 422

        def arrived() -> float:
            # The offered rate of an offered_load_p99 study counts the requests arriving.
            query = f'sum(inference_requests_arrived_total{{job="{JOB}"}})'
            answer = httpx.get(
                f"{live.url}/api/v1/query", params={"query": query}, headers=member, timeout=10
            ).json()
            found = answer["data"]["result"]
            return float(found[0]["value"][1]) if found else 0.0

        wait_for(lambda: arrived() >= 1, 30, "the arrivals counter over OTLP")

        def config() -> dict[str, Any]:
            return dict(httpx.get(f"{job_url}/config", headers=member, timeout=10).json())

        # The replica registered its starting knobs: version 1, adopted and acknowledged.
        wait_for(lambda: (config().get("observed") or {}).get("version") == 1, 30, "version 1")
        assert config()["desired"]["config"] == {"max_batch_size": 8, "max_delay_ms": 5}
        # ... and declared them, so that a study's space can name them.
        [agent] = httpx.get(f"{job_url}/agents", headers=member, timeout=10).json()
        declared = {k["name"]: k for k in agent["knobs"]}
        assert declared["max_batch_size"]["powers_of_two"] and declared["max_delay_ms"]["log"]
        assert {k: (d["low"], d["high"], d["default"]) for k, d in declared.items()} == {
            "max_batch_size": (1, 64, 8),
            "max_delay_ms": (1, 64, 5),
        }
        outside = {"config": {"max_batch_size": 6, "max_delay_ms": 2}}
        refused = httpx.put(f"{job_url}/config", json=outside, headers=member, timeout=10)
        assert refused.status_code == 422 and "max_batch_size=6" in refused.text

        released = httpx.put(
            f"{job_url}/config",
            json={"config": {"max_batch_size": 4, "max_delay_ms": 2}},
            headers=member,
            timeout=10,
        )
        assert released.status_code == 200, released.text
        version = released.json()["version"]

        def knobs() -> dict[str, int]:
            return dict(httpx.get(f"{replica_url}/knobs", timeout=5).json())

        wait_for(lambda: knobs()["version"] == version, 30, "the replica to apply the release")
        assert knobs() == {"max_batch_size": 4, "max_delay_ms": 2, "version": version}
        wait_for(lambda: config()["in_sync"], 30, "the acknowledgement")
        assert config()["observed"]["version"] == version
        refused = httpx.put(f"{replica_url}/knobs", json={"max_batch_size": 2}, timeout=5)
        assert refused.status_code == 409, "the control plane owns a registered replica's knobs"

        target.set_replicas(0, "test: none")
        assert pool.ready_urls() == [] and target.get_replicas() == 0
        assert process.wait(30) is not None, "the replica process stopped"
    finally:
        target.close()


def test_a_terminated_scaler_stops_its_replicas(weights: Path, tmp_path: Path) -> None:
    port = free_port()
    command = [sys.executable, "-m", "examples.inference.scaler", "--port", str(port)]
    command += ["--log-dir", str(tmp_path), "--", "--weights", str(weights)]
    scaler = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/replicas"

        def listed() -> list[str]:
            try:
                return list(httpx.get(url, timeout=2).json()["urls"])
            except httpx.HTTPError:
                return []

        wait_for(listed, 90, "the first replica")
        [replica] = psutil.Process(scaler.pid).children()
        scaler.terminate()
        assert scaler.wait(60) == 0, "SIGTERM ends the scaler cleanly"
        assert not replica.is_running() or replica.status() == psutil.STATUS_ZOMBIE
    finally:
        if scaler.poll() is None:
            scaler.kill()
            scaler.wait()
