"""Conditional desired-config writes: ``If-Match`` with the ETag of GET .../config, or
``expected_version`` in the body; 409 when someone else wrote meanwhile, on both backends."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import Minter, bearer
from tuneloop import jobs as job_service
from tuneloop.errors import Conflict
from tuneloop.runtime import Runtime
from tuneloop.storage import session_scope
from tuneloop.storage.models import Project

CONFIG = "/api/v1/projects/alpha/jobs/train/config"


@pytest.fixture
def member(mint: Minter, client: TestClient) -> dict[str, str]:
    mint.project("alpha")
    headers = bearer(mint.token("alpha", "member"))
    created = client.post("/api/v1/projects/alpha/jobs", json={"name": "train"}, headers=headers)
    assert created.status_code == 201
    return headers


def test_if_match_writes_only_over_the_version_read(
    client: TestClient, member: dict[str, str]
) -> None:
    empty = client.get(CONFIG, headers=member)
    assert empty.headers["etag"] == '"0"'
    first = client.put(CONFIG, json={"config": {"lr": 0.1}}, headers={**member, "If-Match": '"0"'})
    assert first.status_code == 200 and first.json()["version"] == 1
    assert first.headers["etag"] == '"1"'
    etag = client.get(CONFIG, headers=member).headers["etag"]
    assert etag == '"1"'
    # Someone else writes version 2; a write over version 1 is then refused.
    assert client.put(CONFIG, json={"config": {"lr": 0.2}}, headers=member).status_code == 200
    stale = client.put(CONFIG, json={"config": {"lr": 0.3}}, headers={**member, "If-Match": etag})
    assert stale.status_code == 409
    assert stale.json()["code"] == "conflict"
    assert "at version 2, not 1" in stale.json()["detail"]
    state = client.get(CONFIG, headers=member).json()
    assert state["desired"]["config"] == {"lr": 0.2}  # the stale write left nothing
    weak = client.put(CONFIG, json={"config": {"lr": 0.3}}, headers={**member, "If-Match": 'W/"2"'})
    assert weak.status_code == 200 and weak.json()["version"] == 3


def test_expected_version_in_the_body(client: TestClient, member: dict[str, str]) -> None:
    assert client.put(CONFIG, json={"config": {"a": 1}, "expected_version": 0}).status_code == 401
    ok = client.put(CONFIG, json={"config": {"a": 1}, "expected_version": 0}, headers=member)
    assert ok.status_code == 200
    again = client.put(CONFIG, json={"config": {"a": 2}, "expected_version": 0}, headers=member)
    assert again.status_code == 409
    both = client.put(
        CONFIG,
        json={"config": {"a": 2}, "expected_version": 1},
        headers={**member, "If-Match": '"2"'},
    )
    assert both.status_code == 422
    bad = client.put(CONFIG, json={"config": {"a": 2}}, headers={**member, "If-Match": "nope"})
    assert bad.status_code == 422
    anything = client.put(CONFIG, json={"config": {"a": 2}}, headers={**member, "If-Match": "*"})
    assert anything.status_code == 200 and anything.json()["version"] == 2


def test_the_domain_check_serves_every_caller(runtime: Runtime, mint: Minter) -> None:
    project_id = mint.project("beta")
    with session_scope(runtime.sessions) as session:
        project = session.get(Project, project_id)
        assert project is not None
        job = job_service.create_job(session, project, "j", actor="cli")
        job_service.set_desired_config(session, job, {"x": 1}, source="cli", actor="cli")
        with pytest.raises(Conflict):
            job_service.set_desired_config(
                session, job, {"x": 2}, source="cli", actor="cli", expected_version=0
            )
        row = job_service.set_desired_config(
            session, job, {"x": 2}, source="cli", actor="cli", expected_version=1
        )
        assert row.version == 2
