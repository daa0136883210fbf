"""The agent protocol through the API (register, long-poll, ack) and the actuator's policy
routes, on real SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert, select

from api.routes import agents as agent_routes
from tests.api.conftest import Minter, bearer
from tuneloop.runtime import Runtime
from tuneloop.storage import session_scope
from tuneloop.storage.models import AuditEntry, JobConfig, JobGpu

PROJECT = "/api/v1/projects/alpha"
JOB = f"{PROJECT}/jobs/train"
GPU0 = "GPU-5c4ec6a1-3b2f-8e2d-7f0a-1b2c3d4e5f60"
GPU1 = "GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"


@pytest.fixture
def heads(mint: Minter, client: TestClient) -> dict[str, dict[str, str]]:
    mint.project("alpha")
    mint.project("beta")
    member = bearer(mint.token("alpha", "member", "alice"))
    assert client.post(f"{PROJECT}/jobs", json={"name": "train"}, headers=member).is_success
    assert client.post(f"{PROJECT}/jobs", json={"name": "other"}, headers=member).is_success
    return {
        "member": member,
        "agent": bearer(mint.token("alpha", "agent", "node-7")),
        "beta": bearer(mint.token("beta", "agent", "node-9")),
    }


def register(client: TestClient, heads: dict[str, str], job: str = JOB, **extra: Any) -> Any:
    body = {
        "host": "gpu-node-7",
        "pid": 4242,
        "world_size": 2,
        "ranks": [{"rank": 0, "gpu_uuids": [GPU0]}, {"rank": 1, "gpu_uuids": [GPU1]}],
        **extra,
    }
    response = client.post(f"{job}/agents", json=body, headers=heads)
    assert response.status_code == 201, response.text
    return response.json()


def audit_actions(runtime: Runtime) -> list[str]:
    with session_scope(runtime.sessions) as session:
        return list(session.scalars(select(AuditEntry.action).order_by(AuditEntry.id)))


def test_registration_records_gpus_for_attribution(
    client: TestClient, heads: dict[str, dict[str, str]], runtime: Runtime
) -> None:
    agent = register(client, heads["agent"], details={"framework": "torch"})
    assert agent["ranks"] == [
        {"rank": 0, "gpu_uuids": [GPU0], "host": "gpu-node-7"},
        {"rank": 1, "gpu_uuids": [GPU1], "host": "gpu-node-7"},
    ]
    assert agent["knobs"] == []
    assert agent["released"] is None
    listed = client.get(f"{JOB}/agents", headers=heads["member"]).json()
    assert [a["id"] for a in listed] == [agent["id"]]

    owners = client.get(
        f"{PROJECT}/gpus", params={"uuid": [GPU1, "GPU-unknown"]}, headers=heads["member"]
    ).json()
    assert owners == [
        {
            "gpu_uuid": GPU1,
            "job_id": agent["job_id"],
            "job": "train",
            "labels": {},
            "rank": 1,
            "host": "gpu-node-7",
            "agent_id": agent["id"],
        }
    ]
    with session_scope(runtime.sessions) as session:
        assert session.scalar(select(JobGpu.rank).where(JobGpu.gpu_uuid == GPU0)) == 0
    # Another project's token sees neither the job nor its GPUs.
    assert client.get(f"{JOB}/agents", headers=heads["beta"]).status_code == 404
    assert client.get(f"{PROJECT}/gpus?uuid={GPU0}", headers=heads["beta"]).status_code == 404


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ranks": [{"rank": 2, "gpu_uuids": []}]}, "rank 2 is outside 0..1"),
        ({"ranks": [{"rank": 0}, {"rank": 0}]}, "listed twice"),
        ({"ranks": [{"rank": 0, "gpu_uuids": ["GPU 0; drop"]}]}, "invalid GPU UUID"),
        ({"host": "bad host"}, "invalid host name"),
    ],
)
def test_bad_registrations_are_refused(
    client: TestClient, heads: dict[str, dict[str, str]], change: dict[str, Any], message: str
) -> None:
    body = {"host": "n1", "world_size": 2, "ranks": [], **change}
    response = client.post(f"{JOB}/agents", json=body, headers=heads["agent"])
    assert response.status_code == 422
    assert message in response.json()["detail"]


def test_starting_config_is_adopted_and_polled(
    client: TestClient, heads: dict[str, dict[str, str]]
) -> None:
    agent = register(client, heads["agent"], config={"batch_size": 32, "sync_period": 1})
    assert agent["released"]["version"] == 1
    first = client.get(f"{JOB}/config/next?after=0&timeout=5", headers=heads["agent"])
    assert first.status_code == 200
    assert first.json()["config"] == {"batch_size": 32, "sync_period": 1}
    started = time.monotonic()
    nothing = client.get(f"{JOB}/config/next?after=1&timeout=0.3", headers=heads["agent"])
    assert nothing.status_code == 204
    assert 0.25 < time.monotonic() - started < 3
    # A second registration (a restarted job) keeps the released version.
    again = register(client, heads["agent"], config={"batch_size": 8})
    assert again["released"]["version"] == 1


def _poll_in_thread(
    client: TestClient, heads: dict[str, str], after: int, out: dict[str, Any]
) -> threading.Thread:
    def poll() -> None:
        started = time.monotonic()
        response = client.get(f"{JOB}/config/next?after={after}&timeout=20", headers=heads)
        out["response"] = response
        out["waited"] = time.monotonic() - started

    thread = threading.Thread(target=poll)
    thread.start()
    return thread


def test_long_poll_is_woken_by_a_desired_write(
    client: TestClient, heads: dict[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_routes, "RECHECK_S", 30.0)  # only the wake-up can answer in time
    register(client, heads["agent"], config={"batch_size": 32})
    out: dict[str, Any] = {}
    thread = _poll_in_thread(client, heads["agent"], 1, out)
    time.sleep(0.5)
    assert "response" not in out
    written = time.monotonic()
    put = client.put(f"{JOB}/config", json={"config": {"batch_size": 64}}, headers=heads["member"])
    assert put.status_code == 200
    thread.join(10)
    response: httpx.Response = out["response"]
    assert response.status_code == 200
    assert response.json()["version"] == 2
    assert response.json()["config"] == {"batch_size": 64}
    assert time.monotonic() - written < 10  # far below RECHECK_S: the wake-up answered


def test_long_poll_sees_writes_of_other_processes(
    client: TestClient,
    heads: dict[str, dict[str, str]],
    runtime: Runtime,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(agent_routes, "RECHECK_S", 0.2)
    agent = register(client, heads["agent"], config={"batch_size": 32})
    out: dict[str, Any] = {}
    thread = _poll_in_thread(client, heads["agent"], 1, out)
    time.sleep(0.3)
    # A plain INSERT, as another process would commit it: nothing in this process is notified.
    with runtime.engine.begin() as connection:
        connection.execute(
            insert(JobConfig).values(
                job_id=agent["job_id"],
                kind="desired",
                version=2,
                config={"batch_size": 16},
                source="tuner",
            )
        )
    thread.join(10)
    assert out["response"].status_code == 200
    assert out["response"].json()["version"] == 2


def test_desired_config_outside_bounds_is_refused(
    client: TestClient, heads: dict[str, dict[str, str]]
) -> None:
    policy = {"bounds": {"batch_size": {"min": 8, "max": 512}, "optimizer": ["sgd", "adam"]}}
    set_policy = client.put(f"{JOB}/actuator", json=policy, headers=heads["member"])
    assert set_policy.status_code == 200, set_policy.text
    assert set_policy.json()["policy"]["bounds"]["batch_size"] == {"min": 8, "max": 512}
    too_big = client.put(
        f"{JOB}/config",
        json={"config": {"batch_size": 4096, "optimizer": "lion"}},
        headers=heads["member"],
    )
    assert too_big.status_code == 422
    assert too_big.json()["detail"] == (
        "desired config outside the bounds of job 'train': batch_size=4096 is above its "
        "maximum 512; optimizer='lion' is not one of ['sgd', 'adam'] (change the config, or "
        "the bounds of the job's actuation policy: PUT .../actuator)"
    )
    inside = client.put(
        f"{JOB}/config", json={"config": {"batch_size": 512}}, headers=heads["member"]
    )
    assert inside.status_code == 200
    assert inside.json()["version"] == 1  # the refused write took no version

    bad_policy = client.put(
        f"{JOB}/actuator", json={"max_change": {"batch_size": 0.5}}, headers=heads["member"]
    )
    assert bad_policy.status_code == 422
    assert "max_change.batch_size must be a factor > 1" in bad_policy.json()["detail"]
    agent_policy = client.put(f"{JOB}/actuator", json={}, headers=heads["agent"])
    assert agent_policy.status_code == 403
    reserved = client.put(
        f"{JOB}/config", json={"config": {}, "source": "actuator"}, headers=heads["member"]
    )
    assert reserved.status_code == 422


def test_acks_of_unreleased_versions_or_other_jobs_are_refused_and_audited(
    client: TestClient, heads: dict[str, dict[str, str]], runtime: Runtime
) -> None:
    agent = register(client, heads["agent"], config={"batch_size": 32})
    other = register(client, heads["agent"], job=f"{PROJECT}/jobs/other")
    ack = client.post(
        f"{JOB}/config/ack",
        json={"agent_id": agent["id"], "version": 1, "step": 0},
        headers=heads["agent"],
    )
    assert ack.status_code == 201
    assert ack.json()["kind"] == "observed"
    assert ack.json()["version"] == 1
    # The observed version names the desired version it runs, as the tuning loop reads acks;
    # its config holds only the job's settings.
    assert ack.json()["config"] == {"batch_size": 32}
    assert ack.json()["acknowledged_version"] == 1
    assert (ack.json()["origin"], ack.json()["status"]) == ("agent", "running")
    again = client.post(
        f"{JOB}/config/ack", json={"agent_id": agent["id"], "version": 1}, headers=heads["agent"]
    )
    assert again.status_code == 201
    assert again.json()["version"] == 1

    never = client.post(
        f"{JOB}/config/ack", json={"agent_id": agent["id"], "version": 7}, headers=heads["agent"]
    )
    assert never.status_code == 409
    assert never.json()["detail"] == "version 7 was never released to job 'train'"
    foreign = client.post(
        f"{JOB}/config/ack", json={"agent_id": other["id"], "version": 1}, headers=heads["agent"]
    )
    assert foreign.status_code == 409
    assert (
        foreign.json()["detail"] == f"agent {other['id']} is registered to job 'other', not 'train'"
    )
    actions = audit_actions(runtime)
    assert actions.count("job.config.ack_refused") == 2
    assert actions.count("job.config.ack") == 2
    state = client.get(f"{JOB}/config", headers=heads["member"]).json()
    assert state["observed"]["version"] == 1
    assert state["in_sync"] is True

    # A desired version equal to what runs needs no release of its own: still in sync.
    equal = client.put(
        f"{JOB}/config", json={"config": {"batch_size": 32}}, headers=heads["member"]
    )
    assert equal.json()["version"] == 2
    assert client.get(f"{JOB}/config", headers=heads["member"]).json()["in_sync"] is True

    # The free-form report route takes an acknowledgement only of a released version.
    forged = client.post(
        f"{JOB}/config/observed",
        json={"config": {"batch_size": 32, "desired_version": 2}},
        headers=heads["agent"],
    )
    assert forged.status_code == 409
    assert forged.json()["detail"] == "desired_version 2 was never released to job 'train'"
    honest = client.post(
        f"{JOB}/config/observed",
        json={"config": {"batch_size": 32, "desired_version": 1}},
        headers=heads["agent"],
    )
    assert honest.status_code == 201


def test_approval_and_marks_routes(client: TestClient, heads: dict[str, dict[str, str]]) -> None:
    client.put(f"{JOB}/actuator", json={"require_approval": True}, headers=heads["member"])
    register(client, heads["agent"], config={"batch_size": 32})
    client.put(f"{JOB}/config", json={"config": {"batch_size": 64}}, headers=heads["member"])
    waiting = client.get(f"{JOB}/config/next?after=1&timeout=0", headers=heads["agent"])
    assert waiting.status_code == 204
    state = client.get(f"{JOB}/actuator", headers=heads["member"]).json()
    assert state["conditions"]["reconcile"]["reason"] == "awaiting_approval"
    assert state["held"] == {
        "reason": "awaiting_approval",
        "version": 2,
        "until": None,
        "message": "desired version 2 waits for approval",
    }
    approved = client.post(f"{JOB}/actuator/approve", json={"version": 2}, headers=heads["member"])
    assert approved.status_code == 200
    released = client.get(f"{JOB}/config/next?after=1&timeout=5", headers=heads["agent"])
    assert released.status_code == 200
    assert released.json()["version"] == 2
    assert client.get(f"{JOB}/config/marks", headers=heads["member"]).json() == []
    missing = client.post(f"{JOB}/actuator/approve", json={"version": 9}, headers=heads["member"])
    assert missing.status_code == 404


def test_a_held_change_says_why_and_until_when(
    client: TestClient, heads: dict[str, dict[str, str]]
) -> None:
    policy = {"freeze_s": 600, "verify": {"enabled": False}}
    assert client.put(f"{JOB}/actuator", json=policy, headers=heads["member"]).is_success
    agent = register(client, heads["agent"], config={"batch_size": 32})
    # Registering changed nothing: the first change is released at once.
    client.put(f"{JOB}/config", json={"config": {"batch_size": 64}}, headers=heads["member"])
    first = client.get(f"{JOB}/config/next?after=1&timeout=5", headers=heads["agent"]).json()
    assert (first["version"], first["held"]) == (2, None)
    ack = {"agent_id": agent["id"], "version": 2, "step": 10}
    assert client.post(f"{JOB}/config/ack", json=ack, headers=heads["agent"]).is_success
    released_at = time.time()

    client.put(f"{JOB}/config", json={"config": {"batch_size": 128}}, headers=heads["member"])
    waiting = client.get(f"{JOB}/config/next?after=2&timeout=0", headers=heads["agent"])
    assert waiting.status_code == 204
    # A restarted agent (after=0), the job's config and its actuator all say why, until when.
    resumed = client.get(f"{JOB}/config/next?after=0&timeout=0", headers=heads["agent"]).json()
    config = client.get(f"{JOB}/config", headers=heads["member"]).json()
    state = client.get(f"{JOB}/actuator", headers=heads["member"]).json()
    assert resumed["version"] == 2
    for held in (resumed["held"], config["held"], state["held"]):
        assert (held["reason"], held["version"]) == ("frozen", 3)
        until = datetime.fromisoformat(held["until"]).timestamp()
        assert until == pytest.approx(released_at + 600, abs=10)
    assert config["in_sync"] is False

    # Without the freeze the change is released and nothing is held any more.
    policy["freeze_s"] = 0
    assert client.put(f"{JOB}/actuator", json=policy, headers=heads["member"]).is_success
    now = client.get(f"{JOB}/config/next?after=2&timeout=5", headers=heads["agent"]).json()
    assert (now["version"], now["held"]) == (3, None)
    assert client.get(f"{JOB}/config", headers=heads["member"]).json()["held"] is None
