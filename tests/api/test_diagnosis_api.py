"""A job's diagnosis through the API and ``tuneloop job diagnose``, on SQLite and PostgreSQL:
step spans posted to ``/v1/traces`` as a job's exporter posts them, then read back."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from tests.api.conftest import Minter, bearer
from tests.helpers import cli_runner
from tests.tuner.stepspans import write_gauge, write_steps
from tuneloop.cli import app
from tuneloop.runtime import Runtime
from tuneloop.step_timing import FLOPS_PER_SAMPLE, SAMPLES_PER_SECOND
from tuneloop.storage.types import utcnow

JOBS = "/api/v1/projects/alpha/jobs"
INPUT = {
    "data_loading": 0.4,
    "forward": 0.2,
    "backward": 0.25,
    "grad_sync": 0.05,
    "optimizer": 0.05,
}
COMPUTE = {
    "data_loading": 0.02,
    "forward": 0.3,
    "backward": 0.5,
    "grad_sync": 0.03,
    "optimizer": 0.05,
}


@pytest.fixture
def tokens(mint: Minter) -> dict[str, dict[str, str]]:
    mint.project("alpha")
    mint.project("beta")
    return {
        "member": bearer(mint.token("alpha", "member", "alice")),
        "agent": bearer(mint.token("alpha", "agent", "node-7")),
        "stranger": bearer(mint.token("beta", "member", "bob")),
    }


def test_diagnosis_of_a_job_with_a_slowed_rank(
    client: TestClient, tokens: dict[str, dict[str, str]], engine: Engine
) -> None:
    job = client.post(JOBS, json={"name": "llama", "status": "running"}, headers=tokens["agent"])
    assert job.status_code == 201, job.text
    agents = client.post(
        f"{JOBS}/llama/agents",
        json={
            "host": "node-2",
            "world_size": 4,
            "ranks": [{"rank": r, "gpu_uuids": [f"GPU-node-2-{r}"]} for r in range(4)],
        },
        headers=tokens["agent"],
    )
    assert agents.status_code in (200, 201), agents.text
    end = utcnow().replace(microsecond=0) - timedelta(seconds=5)
    project_id = job.json()["project_id"]
    write_steps(engine, project_id, "llama", COMPUTE, end=end, ranks=4, slow={3: 1.5}, noise=0.1)

    params = {"window": "2m", "end": end.isoformat()}
    for who in ("agent", "member"):
        found = client.get(f"{JOBS}/llama/diagnosis", params=params, headers=tokens[who])
        assert found.status_code == 200, found.text
    body = found.json()
    # Three ranks wait for the fourth in grad_sync: no phase dominates the job's step.
    assert body["verdict"] == "mixed"
    assert body["ranks"] == 4 and body["excluded"] == [] and body["gpu"] is None
    assert {s["phase"] for s in body["shares"]} == {
        "data_loading",
        "forward",
        "backward",
        "grad_sync",
        "optimizer",
    }
    [lag] = body["stragglers"]
    assert (lag["rank"], lag["host"], lag["gpus"]) == ("3", "node-2", ["GPU-node-2-3"])
    by_id = client.get(
        f"{JOBS}/{job.json()['id']}/diagnosis", params=params, headers=tokens["member"]
    )
    assert by_id.json()["verdict"] == "mixed"


def test_no_data_bad_window_and_other_projects(
    client: TestClient, tokens: dict[str, dict[str, str]]
) -> None:
    assert client.post(JOBS, json={"name": "idle"}, headers=tokens["member"]).status_code == 201
    found = client.get(f"{JOBS}/idle/diagnosis", headers=tokens["member"])
    assert found.status_code == 200
    assert found.json()["verdict"] == "no_data" and found.json()["shares"] == []
    for window in ("2d", "-5m", "soon"):
        bad = client.get(
            f"{JOBS}/idle/diagnosis", params={"window": window}, headers=tokens["member"]
        )
        assert bad.status_code in (400, 422), bad.text
    assert client.get(f"{JOBS}/nobody/diagnosis", headers=tokens["member"]).status_code == 404
    # A token of another project never reaches this one's jobs.
    refused = client.get(f"{JOBS}/idle/diagnosis", headers=tokens["stranger"])
    assert refused.status_code in (403, 404)
    assert client.get(f"{JOBS}/idle/diagnosis").status_code == 401


def test_cli_job_diagnose(
    client: TestClient,
    tokens: dict[str, dict[str, str]],
    engine: Engine,
    runtime: Runtime,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job = client.post(JOBS, json={"name": "llama"}, headers=tokens["member"])
    end = utcnow().replace(microsecond=0)
    write_steps(engine, job.json()["project_id"], "llama", INPUT, end=end, ranks=2)
    with cli_runner(database_url, monkeypatch) as cli:
        shown = cli.invoke(app, ["job", "diagnose", "llama", "--window", "2m"])
        assert shown.exit_code == 0, shown.output
        assert "input_bound: input-bound: steps wait for their data" in shown.output
        assert "data_loading" in shown.output and "stragglers: none" in shown.output
        missing = cli.invoke(app, ["job", "diagnose", "nobody"])
        assert missing.exit_code == 1 and "does not exist" in missing.output
        bad = cli.invoke(app, ["job", "diagnose", "llama", "--window", "soon"])
        assert bad.exit_code == 2 and "--window" in bad.output


def test_mfu_and_tensor_activity_in_the_api_and_the_cli(
    client: TestClient,
    tokens: dict[str, dict[str, str]],
    engine: Engine,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    end = utcnow().replace(microsecond=0)
    for name, flops in (("llama", 6 * 1e9 * 2048), ("bogus", 1e16)):
        job = client.post(JOBS, json={"name": name}, headers=tokens["member"])
        project_id = job.json()["project_id"]
        write_steps(engine, project_id, name, COMPUTE, end=end, ranks=1)
        rank = {"job": name, "rank": "0"}
        write_gauge(engine, project_id, FLOPS_PER_SAMPLE, rank, flops, end=end)
        write_gauge(engine, project_id, SAMPLES_PER_SECOND, rank, 12.0, end=end)
        gpu = {"job": name, "gpu": "0", "UUID": f"GPU-{name}", "modelName": "NVIDIA H100 PCIe"}
        write_gauge(engine, project_id, "DCGM_FI_PROF_SM_ACTIVE", gpu, 0.9, end=end)
        write_gauge(engine, project_id, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", gpu, 0.6, end=end)
    params = {"window": "2m", "end": end.isoformat()}
    body = client.get(f"{JOBS}/llama/diagnosis", params=params, headers=tokens["member"]).json()
    assert body["gpu"]["tensor_active"] == pytest.approx(0.6)
    assert body["gpu"]["model_names"] == ["NVIDIA H100 PCIe"]
    work = body["efficiency"]
    assert work["peak_flops"] == 756e12 and work["peak_source"] == "table: NVIDIA H100 PCIe"
    assert work["mfu"] == pytest.approx(6 * 1e9 * 2048 * 12 / 756e12)
    assert work["excluded"] is None
    bogus = client.get(f"{JOBS}/bogus/diagnosis", params=params, headers=tokens["member"]).json()
    assert bogus["efficiency"]["mfu"] is None
    assert "over the peak" in bogus["efficiency"]["excluded"]
    with cli_runner(database_url, monkeypatch) as cli:
        shown = cli.invoke(app, ["job", "diagnose", "llama", "--window", "5m"])
        assert shown.exit_code == 0, shown.output
        assert "tensor active 60%" in shown.output and "SM active 90%" in shown.output
        assert "MFU 19.5%" in shown.output and "table: NVIDIA H100 PCIe" in shown.output
        flagged = cli.invoke(app, ["job", "diagnose", "bogus", "--window", "5m"])
        assert "MFU excluded:" in flagged.output and "over the peak" in flagged.output
