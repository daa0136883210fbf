"""A study from a job's diagnosis through the API and ``tuneloop job tune --from-diagnosis``,
on SQLite and PostgreSQL: the job's agent declares its knobs when it registers, step timings
are stored as a job's exporter writes them, and the verdict picks the knobs; a study over
declared knobs through the ordinary route; a CPU rank named as straggler with its host."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from tests.api.conftest import Minter, bearer
from tests.api.test_diagnosis_api import COMPUTE, INPUT
from tests.helpers import cli_runner
from tests.tuner.stepspans import write_gauge, write_steps
from tuneloop.cli import app
from tuneloop.runtime import Runtime
from tuneloop.step_timing import SAMPLES_PER_SECOND, STRAGGLER_RATIO
from tuneloop.storage.models import Job
from tuneloop.storage.types import utcnow
from tuner.diagnosis_reading import job_diagnosis
from tuner.diagnosis_series import diagnosis_batches

JOBS = "/api/v1/projects/alpha/jobs"
LOADER_KNOBS = [
    {"name": "loader_workers", "type": "int", "low": 0, "high": 8, "default": 0},
    {"name": "prefetch_factor", "type": "int", "low": 1, "high": 4, "default": 2},
]
COMM_KNOBS = [
    {"name": "bucket_mb", "type": "int", "low": 1, "high": 64, "log": True, "default": 25},
    {"name": "grad_compression", "type": "categorical", "choices": [False, True], "default": False},
]


@pytest.fixture
def tokens(mint: Minter) -> dict[str, dict[str, str]]:
    mint.project("alpha")
    return {
        "member": bearer(mint.token("alpha", "member", "alice")),
        "agent": bearer(mint.token("alpha", "agent", "node-7")),
    }


def cpu_job(
    client: TestClient,
    engine: Engine,
    tokens: dict[str, dict[str, str]],
    name: str,
    phases: dict[str, float] | None,
    knobs: list[dict[str, Any]],
    **how: Any,
) -> None:
    """A running 2-rank CPU job on two hosts whose agent declared ``knobs`` and started on
    their defaults, with two minutes of step timings shaped by ``phases`` (none: no data)."""
    job = client.post(JOBS, json={"name": name, "status": "running"}, headers=tokens["agent"])
    assert job.status_code == 201, job.text
    config = {"batch_size": 8, **{k["name"]: k["default"] for k in knobs}}
    body = {
        "host": "cpu-a",
        "world_size": 2,
        "ranks": [{"rank": 0}, {"rank": 1, "host": "cpu-b"}],
        "config": config,
        "knobs": knobs,
    }
    registered = client.post(f"{JOBS}/{name}/agents", json=body, headers=tokens["agent"])
    assert registered.status_code == 201, registered.text
    if phases is not None:
        end, project_id = utcnow(), job.json()["project_id"]
        write_steps(engine, project_id, name, phases, end=end, **how)
        for rank in ("0", "1"):
            labels = {"job": name, "rank": rank}
            write_gauge(engine, project_id, SAMPLES_PER_SECOND, labels, 12.0, end=end)


def test_a_study_from_an_input_bound_diagnosis_tunes_the_loader(
    client: TestClient, engine: Engine, tokens: dict[str, dict[str, str]]
) -> None:
    cpu_job(client, engine, tokens, "reader", INPUT, [*COMM_KNOBS, *LOADER_KNOBS])
    created = client.post(
        f"{JOBS}/reader/studies/from-diagnosis",
        json={"window": "2m", "max_trials": 6},
        headers=tokens["member"],
    )
    assert created.status_code == 201, created.text
    study = created.json()
    assert study["verdict"] == "input_bound"
    assert study["knobs"] == ["loader_workers", "prefetch_factor"]
    assert study["name"].startswith("diagnosis-input_bound-")
    assert study["objective"] == "throughput" and study["state"] == "running"
    assert study["space"]["params"] == [
        {"type": "int", "name": "loader_workers", "low": 0, "high": 8, "log": False,
         "powers_of_two": False},
        {"type": "int", "name": "prefetch_factor", "low": 1, "high": 4, "log": False,
         "powers_of_two": False},
    ]  # fmt: skip
    listed = client.get(f"{JOBS}/reader/studies", headers=tokens["member"]).json()
    assert [s["name"] for s in listed] == [study["name"]]
    # An agent token may not start one: studies write desired configs.
    refused = client.post(
        f"{JOBS}/reader/studies/from-diagnosis", json={"window": "2m"}, headers=tokens["agent"]
    )
    assert refused.status_code == 403


def test_a_communication_bound_diagnosis_tunes_bucket_and_compression(
    client: TestClient, engine: Engine, tokens: dict[str, dict[str, str]]
) -> None:
    comm = {"data_loading": 0.02, "forward": 0.1, "backward": 0.1, "grad_sync": 0.5}
    cpu_job(client, engine, tokens, "syncer", comm, [*LOADER_KNOBS, *COMM_KNOBS])
    created = client.post(
        f"{JOBS}/syncer/studies/from-diagnosis", json={"window": "2m"}, headers=tokens["member"]
    )
    assert created.status_code == 201, created.text
    assert created.json()["verdict"] == "communication_bound"
    assert created.json()["knobs"] == ["bucket_mb", "grad_compression"]


@pytest.mark.parametrize(
    ("phases", "knobs", "says"),
    [
        (None, LOADER_KNOBS, "the diagnosis is no_data: no knob to tune"),
        (COMPUTE, LOADER_KNOBS, "which tunes batch_size, but the job declared none of them"),
        (INPUT, [], "declared: none"),
    ],
)
def test_no_study_when_the_verdict_points_at_no_declared_knob(
    client: TestClient,
    engine: Engine,
    tokens: dict[str, dict[str, str]],
    phases: dict[str, float] | None,
    knobs: list[dict[str, Any]],
    says: str,
) -> None:
    cpu_job(client, engine, tokens, "plain", phases, knobs)
    refused = client.post(
        f"{JOBS}/plain/studies/from-diagnosis", json={"window": "2m"}, headers=tokens["member"]
    )
    assert refused.status_code == 409, refused.text
    assert says in refused.json()["detail"]
    assert client.get(f"{JOBS}/plain/studies", headers=tokens["member"]).json() == []


def test_a_study_space_names_declared_knobs(
    client: TestClient, engine: Engine, tokens: dict[str, dict[str, str]]
) -> None:
    cpu_job(client, engine, tokens, "reader", INPUT, LOADER_KNOBS)
    body: dict[str, Any] = {"name": "loader", "objective": "throughput"}
    body["space"] = {"knobs": ["loader_workers"]}
    created = client.post(f"{JOBS}/reader/studies", json=body, headers=tokens["member"])
    assert created.status_code == 201, created.text
    assert [p["name"] for p in created.json()["space"]["params"]] == ["loader_workers"]
    body = {**body, "name": "mixed", "space": {"batch_size": [8, 32], "lr_scaling": None}}
    body["space"]["knobs"] = ["prefetch_factor"]
    created = client.post(f"{JOBS}/reader/studies", json=body, headers=tokens["member"])
    assert created.status_code == 201, created.text
    names = [p["name"] for p in created.json()["space"]["params"]]
    assert names == ["batch_size", "prefetch_factor"]
    body = {**body, "name": "unknown", "space": {"knobs": ["shards"]}}
    refused = client.post(f"{JOBS}/reader/studies", json=body, headers=tokens["member"])
    assert refused.status_code == 422
    assert "no knob 'shards'" in refused.json()["detail"]
    assert "loader_workers" in refused.json()["detail"]


def test_a_cpu_rank_named_as_straggler_has_its_host(
    client: TestClient,
    engine: Engine,
    tokens: dict[str, dict[str, str]],
    runtime: Runtime,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cpu_job(client, engine, tokens, "lagging", COMPUTE, [], slow={1: 1.5}, noise=0.05)
    agent = client.get(f"{JOBS}/lagging/agents", headers=tokens["member"]).json()[-1]
    assert [(r["rank"], r["host"], r["gpu_uuids"]) for r in agent["ranks"]] == [
        (0, "cpu-a", []),
        (1, "cpu-b", []),
    ]
    found = client.get(
        f"{JOBS}/lagging/diagnosis", params={"window": "2m"}, headers=tokens["member"]
    )
    [lag] = found.json()["stragglers"]
    assert (lag["rank"], lag["host"], lag["gpus"]) == ("1", "cpu-b", [])
    # The gauge the JobStraggler alert reads carries it as its Hostname label.
    now = utcnow()
    with Session(engine) as session:
        job = session.scalars(select(Job).where(Job.name == "lagging")).one()
        diagnosed = job_diagnosis(
            runtime.series(), engine, job, end=now, window=timedelta(minutes=2)
        )
    [ratio] = [
        b for b in diagnosis_batches("lagging", diagnosed, now) if b.metric == STRAGGLER_RATIO
    ]
    assert ratio.labels["Hostname"] == "cpu-b" and "gpu" not in ratio.labels
    with cli_runner(database_url, monkeypatch) as cli:
        shown = cli.invoke(app, ["job", "diagnose", "lagging", "--window", "2m"])
        assert shown.exit_code == 0, shown.output
        assert any(line.split()[:2] == ["1", "cpu-b"] for line in shown.output.splitlines())


def test_cli_job_tune_from_diagnosis(
    client: TestClient,
    engine: Engine,
    tokens: dict[str, dict[str, str]],
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cpu_job(client, engine, tokens, "reader", INPUT, LOADER_KNOBS)
    cpu_job(client, engine, tokens, "cruncher", COMPUTE, LOADER_KNOBS)
    with cli_runner(database_url, monkeypatch) as cli:
        shown = cli.invoke(
            app, ["job", "tune", "reader", "--from-diagnosis", "--window", "2m", "--study", "io"]
        )
        assert shown.exit_code == 0, shown.output
        assert "job 'reader' is input_bound: study" in shown.output
        assert "'io' tunes loader_workers, prefetch_factor for throughput" in shown.output
        refused = cli.invoke(app, ["job", "tune", "cruncher", "--from-diagnosis", "--window", "2m"])
        assert refused.exit_code == 1 and "declared none of them" in refused.output
        bare = cli.invoke(app, ["job", "tune", "reader"])
        assert bare.exit_code == 2 and "--from-diagnosis" in bare.output
