"""Every refusal on the way to tuning a job names what to change: the role a call needs, or
the field of the body (real SQLite and PostgreSQL)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import Minter, bearer

JOB = "/api/v1/projects/alpha/jobs/train"
STUDY = {"name": "batch", "space": {"batch_size": [8, 256], "sync_period": [1, 8]}}
MEMBER_CALLS: list[tuple[str, str, dict[str, Any], str]] = [
    ("POST", f"{JOB}/studies", STUDY, "creating a study"),
    ("PUT", f"{JOB}/config", {"config": {"batch_size": 64}}, "setting a desired config"),
    ("PUT", f"{JOB}/actuator", {"freeze_s": 60}, "setting an actuation policy"),
    ("POST", f"{JOB}/actuator/approve", {"version": 1}, "approving a desired version"),
    (
        "POST",
        "/api/v1/projects/alpha/alerts/receivers",
        {"name": "ops", "kind": "webhook", "config": {"url": "http://127.0.0.1:9/"}},
        "changing alert rules or receivers",
    ),
]


@pytest.fixture
def agent(mint: Minter, client: TestClient) -> dict[str, str]:
    mint.project("alpha")
    heads = bearer(mint.token("alpha", "agent", "node-7"))
    # An agent registers its own job: agent tokens may create jobs.
    created = client.post("/api/v1/projects/alpha/jobs", json={"name": "train"}, headers=heads)
    assert created.status_code == 201, created.text
    return heads


@pytest.mark.parametrize(
    ("method", "url", "body", "action"), MEMBER_CALLS, ids=[c[3] for c in MEMBER_CALLS]
)
def test_agent_tokens_are_told_the_role_a_change_needs(
    client: TestClient,
    agent: dict[str, str],
    method: str,
    url: str,
    body: dict[str, Any],
    action: str,
) -> None:
    refused = client.request(method, url, json=body, headers=agent)
    assert refused.status_code == 403, refused.text
    detail = refused.json()["detail"]
    assert detail.startswith(f"{action} needs a member or admin token; agent tokens only ")
    assert "tuneloop token create --project NAME --role member" in detail


def test_a_bad_actuation_policy_names_its_field(mint: Minter, client: TestClient) -> None:
    mint.project("alpha")
    member = bearer(mint.token("alpha", "member", "alice"))
    assert client.post("/api/v1/projects/alpha/jobs", json={"name": "train"}, headers=member)
    for policy, field in (
        ({"freeze_study_trials": "yes"}, "freeze_study_trials must be true or false"),
        ({"freeze": 60}, "unknown policy field(s) ['freeze']"),
        ({"verify": {"window": 5}}, "unknown verify field(s) ['window']"),
    ):
        refused = client.put(f"{JOB}/actuator", json=policy, headers=member)
        assert refused.status_code == 422
        assert field in refused.json()["detail"]
