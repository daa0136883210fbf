"""The README's "Tuning a job" walk-through, call by call, with the tokens it names: the
member token ``tuneloop up`` prints on a fresh start and an agent token for the job. The study
body is read from the README itself, so the two cannot drift apart (real SQLite and
PostgreSQL)."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from tests.api.conftest import Minter, bearer
from tests.tuner import jobsim
from tuneloop import accounts
from tuneloop.runtime import Runtime
from tuneloop.storage import session_scope
from tuneloop.storage.models import Study
from tuneloop.storage.types import utcnow
from tuner import service
from tuner.loop import reconcile_study

README = Path(__file__).resolve().parents[2] / "README.md"
JOBS = "/api/v1/projects/default/jobs"
JOB = f"{JOBS}/my-job"
STARTING_CONFIG = {"batch_size": 32, "sync_period": 1}


def readme_study_body() -> Any:
    """The JSON the README's study ``curl`` sends."""
    text = README.read_text()
    section = text[text.index("## Tuning a job") : text.index("## The demo")]
    found = re.search(r"/studies \\\n\s+-d '(.*?)'", section, re.DOTALL)
    assert found is not None, "the README's study curl is missing"
    return json.loads(found.group(1))


def fresh_start_member_token(runtime: Runtime) -> str:
    """What ``tuneloop up`` does on a fresh store: the default project and its member token."""
    with session_scope(runtime.sessions) as session:
        _, secret = accounts.ensure_default_project(session, "default")
    assert secret is not None
    return secret


def test_the_readme_walk_through_works_as_written(
    client: TestClient, mint: Minter, runtime: Runtime
) -> None:
    member = bearer(fresh_start_member_token(runtime))
    agent = bearer(mint.token("default", "agent", "agent"))  # tuneloop token create --role agent
    body = readme_study_body()

    # Before the job exists, a study is refused with how the job comes to exist.
    missing = client.post(f"{JOB}/studies", json=body, headers=member)
    assert missing.status_code == 404
    assert "its agent creates it when it registers" in missing.json()["detail"]
    assert f"POST {JOBS}" in missing.json()["detail"]

    # 1. The job starts with its agent (agent token), which creates and registers it.
    assert client.get(JOB, headers=agent).status_code == 404
    created = client.post(JOBS, json={"name": "my-job", "status": "running"}, headers=agent)
    assert created.status_code == 201, created.text
    registration = {"host": "node-1", "world_size": 2, "ranks": [], "config": STARTING_CONFIG}
    registered = client.post(f"{JOB}/agents", json=registration, headers=agent).json()
    assert registered["released"]["version"] == 1
    assert client.get(JOB, headers=member).json()["status"] == "running"
    now = utcnow()
    jobsim.write_steps(
        runtime.engine,
        created.json()["project_id"],
        "my-job",
        start=now - timedelta(seconds=30),
        end=now,
        per_rank=100.0,
    )

    # 2. A study: not with the agent's token (the answer names the role), with the member's.
    refused = client.post(f"{JOB}/studies", json=body, headers=agent)
    assert refused.status_code == 403
    assert "needs a member or admin token" in refused.json()["detail"]
    study = client.post(f"{JOB}/studies", json=body, headers=member)
    assert study.status_code == 201, study.text
    study_id = study.json()["id"]
    with session_scope(runtime.sessions) as session:  # the tuning loop's next pass
        reconcile_study(session, study_id, now=utcnow())
    # Its first trial measures the starting config, which the job already runs; once that is
    # measured (told here, as the loop would after its window), the next pass proposes a config.
    with session_scope(runtime.sessions) as session:
        service.tell(session, session.get_one(Study, study_id), 1, state="complete", value=1.0)
        reconcile_study(session, study_id, now=utcnow())

    # The agent picks the trial up and acknowledges it.
    trial = client.get(f"{JOB}/config/next?after=1&timeout=5", headers=agent).json()
    assert trial["source"] == f"tuner:study:{study_id}"
    ack = {"agent_id": registered["id"], "version": trial["version"], "step": 100}
    assert client.post(f"{JOB}/config/ack", json=ack, headers=agent).status_code == 201

    # 3. Reading it back.
    studies = f"{JOB}/studies"
    assert client.get(f"{studies}/{study_id}", headers=member).json()["state"] == "running"
    baseline, first = client.get(f"{studies}/{study_id}/trials", headers=member).json()["items"]
    assert baseline["baseline"] and baseline["params"] == STARTING_CONFIG
    assert first["desired_version"] == trial["version"]
    config = client.get(f"{JOB}/config", headers=member).json()
    assert config["desired"]["config"] == first["params"]
    assert (config["in_sync"], config["held"]) == (True, None)
    # The trial runs, but the last good version stays the starting config.
    actuator = client.get(f"{JOB}/actuator", headers=member).json()
    assert (actuator["released_version"], actuator["last_good_version"]) == (trial["version"], 1)
