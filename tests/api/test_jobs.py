"""Jobs and config versions through the API, on real SQLite and PostgreSQL."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from tests.api.conftest import Minter, bearer
from tuneloop import accounts, job_configs
from tuneloop import jobs as job_service
from tuneloop.runtime import Runtime
from tuneloop.storage import session_scope
from tuneloop.storage.models import AuditEntry, JobConfig

JOBS = "/api/v1/projects/alpha/jobs"


@pytest.fixture
def secrets_(mint: Minter) -> dict[str, dict[str, str]]:
    mint.project("alpha")
    return {
        "member": bearer(mint.token("alpha", "member", "alice")),
        "agent": bearer(mint.token("alpha", "agent", "node-7")),
        "admin": bearer(mint.admin()),
    }


def test_jobs_crud(
    client: TestClient, secrets_: dict[str, dict[str, str]], runtime: Runtime
) -> None:
    member = secrets_["member"]
    created = client.post(
        JOBS,
        json={"name": "llama-70b", "kind": "inference", "labels": {"team": "nlp", "gpu": "h100"}},
        headers=member,
    )
    assert created.status_code == 201
    job = created.json()
    assert job["name"] == "llama-70b"
    assert job["kind"] == "inference"
    assert job["status"] == "pending"
    assert job["labels"] == {"team": "nlp", "gpu": "h100"}

    assert client.post(JOBS, json={"name": "llama-70b"}, headers=member).status_code == 409

    by_name = client.get(f"{JOBS}/llama-70b", headers=member)
    by_id = client.get(f"{JOBS}/{job['id']}", headers=member)
    assert by_name.status_code == by_id.status_code == 200
    assert by_name.json() == by_id.json() == job

    patched = client.patch(
        f"{JOBS}/llama-70b",
        json={"status": "running", "labels": {"team": "vision"}},
        headers=member,
    )
    assert patched.status_code == 200
    assert patched.json()["status"] == "running"
    assert patched.json()["labels"] == {"team": "vision"}
    assert client.get(f"{JOBS}/{job['id']}", headers=member).json()["status"] == "running"

    assert client.get(f"{JOBS}/nope", headers=member).status_code == 404
    assert client.get(f"{JOBS}/999999", headers=member).status_code == 404
    assert (
        client.patch(f"{JOBS}/llama-70b", json={"status": "exploded"}, headers=member).status_code
        == 422
    )

    with session_scope(runtime.sessions) as session:
        entries = session.scalars(select(AuditEntry).order_by(AuditEntry.id)).all()
        assert [e.action for e in entries] == ["job.create", "job.update"]
        assert all(e.target == "job:llama-70b" and e.actor.endswith(":alice") for e in entries)
        assert entries[1].details["status"] == {"from": "pending", "to": "running"}


def test_job_list_pages_and_filters(
    client: TestClient, secrets_: dict[str, dict[str, str]]
) -> None:
    member = secrets_["member"]
    for index in range(5):
        status = "running" if index % 2 else "pending"
        response = client.post(
            JOBS, json={"name": f"job-{index}", "status": status}, headers=member
        )
        assert response.status_code == 201
    first = client.get(JOBS, params={"limit": 2}, headers=member).json()
    assert [j["name"] for j in first["items"]] == ["job-0", "job-1"]
    assert first["next_offset"] == 2
    last = client.get(JOBS, params={"limit": 2, "offset": 4}, headers=member).json()
    assert [j["name"] for j in last["items"]] == ["job-4"]
    assert last["next_offset"] is None
    running = client.get(JOBS, params={"status": "running"}, headers=member).json()
    assert [j["name"] for j in running["items"]] == ["job-1", "job-3"]
    assert client.get(JOBS, params={"limit": 0}, headers=member).status_code == 422
    assert client.get(JOBS, params={"limit": 501}, headers=member).status_code == 422


@pytest.mark.parametrize(
    "body",
    [
        {"name": "12345"},
        {"name": "x'; DROP TABLE jobs;--"},
        {"name": ""},
        {"name": "a/b"},
        {"name": "ok", "labels": {"bad-key": "v"}},
        {"name": "ok", "labels": {"k": 1}},
        {"name": "ok", "kind": "batch"},
        {"name": "ok", "unexpected": True},
    ],
)
def test_invalid_jobs_are_rejected(
    client: TestClient, secrets_: dict[str, dict[str, str]], body: dict[str, object]
) -> None:
    response = client.post(JOBS, json=body, headers=secrets_["member"])
    assert response.status_code == 422
    assert response.json()["code"] == "validation_error"
    assert client.get(JOBS, headers=secrets_["member"]).json()["items"] == []


def test_desired_config_versions_increment(
    client: TestClient, secrets_: dict[str, dict[str, str]], runtime: Runtime
) -> None:
    member = secrets_["member"]
    job = client.post(JOBS, json={"name": "train"}, headers=member).json()
    empty = client.get(f"{JOBS}/train/config", headers=member)
    assert empty.json() == {"desired": None, "observed": None, "in_sync": False, "held": None}

    versions = []
    for batch_size in (32, 64, 128):
        response = client.put(
            f"{JOBS}/train/config", json={"config": {"batch_size": batch_size}}, headers=member
        )
        assert response.status_code == 200
        versions.append(response.json()["version"])
    assert versions == [1, 2, 3]
    by_id = client.put(
        f"{JOBS}/{job['id']}/config",
        json={"config": {"batch_size": 256}, "source": "tuner"},
        headers=secrets_["admin"],
    )
    assert by_id.json()["version"] == 4
    assert by_id.json()["source"] == "tuner"

    state = client.get(f"{JOBS}/train/config", headers=member).json()
    assert state["desired"]["version"] == 4
    assert state["desired"]["config"] == {"batch_size": 256}
    assert state["observed"] is None

    with session_scope(runtime.sessions) as session:
        rows = session.scalars(select(JobConfig.version).where(JobConfig.kind == "desired")).all()
        assert sorted(rows) == [1, 2, 3, 4]
        actions = session.scalars(select(AuditEntry.action)).all()
        assert actions.count("job.config.desired") == 4


def test_agents_register_jobs_and_report_observed_config(
    client: TestClient, secrets_: dict[str, dict[str, str]]
) -> None:
    agent, member = secrets_["agent"], secrets_["member"]
    assert (
        client.post(JOBS, json={"name": "serve", "kind": "inference"}, headers=agent).status_code
        == 201
    )
    assert (
        client.patch(f"{JOBS}/serve", json={"status": "running"}, headers=agent).status_code == 200
    )

    forbidden = client.put(f"{JOBS}/serve/config", json={"config": {"tp": 2}}, headers=agent)
    assert forbidden.status_code == 403
    assert forbidden.json()["code"] == "forbidden"

    desired = client.put(f"{JOBS}/serve/config", json={"config": {"tp": 4}}, headers=member)
    assert desired.json()["version"] == 1
    observed = client.post(
        f"{JOBS}/serve/config/observed",
        json={"config": {"tp": 2}, "source": "agent"},
        headers=agent,
    )
    assert observed.status_code == 201
    assert observed.json()["kind"] == "observed"
    assert observed.json()["version"] == 1
    state = client.get(f"{JOBS}/serve/config", headers=agent).json()
    assert state["in_sync"] is False

    caught_up = client.post(
        f"{JOBS}/serve/config/observed", json={"config": {"tp": 4}}, headers=agent
    )
    assert caught_up.json()["version"] == 2
    state = client.get(f"{JOBS}/serve/config", headers=member).json()
    assert state["desired"]["version"] == 1
    assert state["observed"]["version"] == 2
    assert state["in_sync"] is True

    # A report naming a desired version never released to the job is not an acknowledgement
    # (version 1 was written, but no actuator released it).
    for version in (1, 7, "1"):
        refused = client.post(
            f"{JOBS}/serve/config/observed",
            json={"config": {"tp": 4, "desired_version": version}},
            headers=agent,
        )
        assert refused.status_code == 409, refused.text
        assert "never released" in refused.json()["detail"]


def test_config_must_be_an_object(client: TestClient, secrets_: dict[str, dict[str, str]]) -> None:
    client.post(JOBS, json={"name": "train"}, headers=secrets_["member"])
    for body in ({"config": [1, 2]}, {"config": "x"}, {}):
        response = client.put(f"{JOBS}/train/config", json=body, headers=secrets_["member"])
        assert response.status_code == 422


def test_concurrent_desired_writes_get_consecutive_versions(runtime: Runtime) -> None:
    """Writers racing on one job each get a distinct version; none is lost."""
    with session_scope(runtime.sessions) as session:
        project = accounts.create_project(session, "race")
        job_service.create_job(session, project, "train")

    def write(worker: int) -> list[int]:
        versions = []
        for step in range(5):
            with session_scope(runtime.sessions) as session:
                owner = accounts.get_project_by_name(session, "race")
                assert owner is not None
                job = job_service.get_job(session, owner, "train")
                row = job_configs.propose(session, job, {"w": worker, "s": step})
                versions.append(row.version)
        return versions

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(write, range(6)))
    everything = sorted(v for versions in results for v in versions)
    assert everything == list(range(1, 31))
