"""Typed config columns through the API: who wrote a version (``origin``), and what an observed
version says about the desired ones (``acknowledged_version``, ``status``, ``reason``), from
the typed fields or the agents' older wire keys in the config. On real SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import Minter, bearer

JOB = "/api/v1/projects/alpha/jobs/train"


@pytest.fixture
def heads(mint: Minter, client: TestClient) -> dict[str, dict[str, str]]:
    mint.project("alpha")
    member = bearer(mint.token("alpha", "member", "alice"))
    assert client.post("/api/v1/projects/alpha/jobs", json={"name": "train"}, headers=member)
    return {"member": member, "agent": bearer(mint.token("alpha", "agent", "node-7"))}


def register(client: TestClient, agent: dict[str, str]) -> Any:
    """An agent starting the job on batch size 32: desired version 1, released."""
    body = {"host": "node-7", "world_size": 1, "ranks": [], "config": {"batch_size": 32}}
    response = client.post(f"{JOB}/agents", json=body, headers=agent)
    assert response.status_code == 201, response.text
    return response.json()


def observe(client: TestClient, agent: dict[str, str], **body: Any) -> Any:
    return client.post(f"{JOB}/config/observed", json=body, headers=agent)


def test_the_wire_keys_of_an_observed_config_are_stored_typed(
    client: TestClient, heads: dict[str, dict[str, str]]
) -> None:
    register(client, heads["agent"])
    wire = {"batch_size": 32, "desired_version": 1, "status": "oom", "reason": "CUDA OOM"}
    old_style = observe(client, heads["agent"], config=wire)
    assert old_style.status_code == 201, old_style.text
    out = old_style.json()
    assert out["config"] == {"batch_size": 32}
    assert (out["version"], out["acknowledged_version"], out["status"], out["reason"]) == (
        1,
        1,
        "oom",
        "CUDA OOM",
    )
    assert (out["origin"], out["origin_study_id"]) == ("agent", None)

    typed = observe(
        client,
        heads["agent"],
        config={"batch_size": 32},
        acknowledged_version=1,
        status="running",
    )
    assert typed.status_code == 201, typed.text
    assert (typed.json()["version"], typed.json()["acknowledged_version"]) == (2, 1)
    assert typed.json()["status"] == "running"

    disagree = observe(
        client, heads["agent"], config={"desired_version": 1}, acknowledged_version=2
    )
    assert disagree.status_code == 422
    assert "in the request and" in disagree.json()["detail"]
    unknown = observe(client, heads["agent"], config={"status": "fine"})
    assert unknown.status_code == 422

    state = client.get(f"{JOB}/config", headers=heads["member"]).json()
    desired = state["desired"]
    assert (desired["origin"], desired["source"]) == ("agent", "agent")
    # Desired versions say nothing about acknowledgements.
    assert (desired["acknowledged_version"], desired["status"], desired["reason"]) == (
        None,
        None,
        None,
    )
    assert state["observed"]["acknowledged_version"] == 1
    assert state["in_sync"] is True


def test_an_ack_after_a_free_report_is_the_next_observed_version(
    client: TestClient, heads: dict[str, dict[str, str]]
) -> None:
    agent = register(client, heads["agent"])
    report = observe(client, heads["agent"], config={"batch_size": 32})
    assert (report.json()["version"], report.json()["acknowledged_version"]) == (1, None)

    ack_body = {"agent_id": agent["id"], "version": 1}
    for _ in range(2):  # a repeated ack answers the same observed version
        ack = client.post(f"{JOB}/config/ack", json=ack_body, headers=heads["agent"])
        assert ack.status_code == 201, ack.text
        assert (ack.json()["version"], ack.json()["acknowledged_version"]) == (2, 1)

    observed = client.get(f"{JOB}/config", headers=heads["member"]).json()["observed"]
    assert (observed["version"], observed["acknowledged_version"]) == (2, 1)


def test_a_source_that_looks_like_a_study_is_still_a_change_through_the_api(
    client: TestClient, heads: dict[str, dict[str, str]]
) -> None:
    written = client.put(
        f"{JOB}/config",
        json={"config": {"batch_size": 64}, "source": "tuner:study:1"},
        headers=heads["member"],
    )
    assert written.status_code == 200, written.text
    out = written.json()
    assert (out["source"], out["origin"], out["origin_study_id"]) == ("tuner:study:1", "api", None)


def test_a_report_that_the_job_could_not_run_its_settings_is_not_in_sync(
    client: TestClient, heads: dict[str, dict[str, str]]
) -> None:
    register(client, heads["agent"])
    failed = observe(client, heads["agent"], config={"batch_size": 32}, status="failed")
    assert failed.status_code == 201, failed.text
    assert client.get(f"{JOB}/config", headers=heads["member"]).json()["in_sync"] is False
    observe(client, heads["agent"], config={"batch_size": 32})
    assert client.get(f"{JOB}/config", headers=heads["member"]).json()["in_sync"] is True
