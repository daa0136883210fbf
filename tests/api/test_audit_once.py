"""A change made through the API is audited exactly once, by the domain function that makes it
(not again by the route), and names the token that asked."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import select

from tests.api.conftest import Minter, bearer
from tuneloop.runtime import Runtime
from tuneloop.storage import session_scope
from tuneloop.storage.models import AuditEntry

ALERTS = "/api/v1/projects/alpha/alerts"
JOBS = "/api/v1/projects/alpha/jobs"
AUTOSCALERS = "/api/v1/projects/alpha/autoscalers"
HOT = {
    "name": "GpuHot",
    "kind": "threshold",
    "query": {"metric": "DCGM_FI_DEV_GPU_TEMP", "aggregation": "max", "window": "5m"},
    "op": ">",
    "threshold": 85,
}


def _entries_after(runtime: Runtime, after_id: int) -> list[tuple[str, str, str]]:
    with session_scope(runtime.sessions) as session:
        rows = session.scalars(
            select(AuditEntry).where(AuditEntry.id > after_id).order_by(AuditEntry.id)
        )
        return [(row.action, row.target, row.actor) for row in rows]


def _last_id(runtime: Runtime) -> int:
    with session_scope(runtime.sessions) as session:
        ids = session.scalars(select(AuditEntry.id).order_by(AuditEntry.id.desc())).first()
        return ids or 0


def test_creating_and_deleting_an_alert_rule_is_audited_once_each(
    client: TestClient, mint: Minter, runtime: Runtime
) -> None:
    mint.project("alpha")
    member = bearer(mint.token("alpha", "member", "alice"))

    before = _last_id(runtime)
    assert client.post(f"{ALERTS}/rules", json=HOT, headers=member).status_code == 201
    created = _entries_after(runtime, before)
    assert [(action, target) for action, target, _ in created] == [
        ("alert.rule.create", "rule:GpuHot")
    ]
    assert created[0][2].endswith(":alice")

    before = _last_id(runtime)
    assert client.delete(f"{ALERTS}/rules/GpuHot", headers=member).status_code == 204
    deleted = _entries_after(runtime, before)
    assert [(action, target) for action, target, _ in deleted] == [
        ("alert.rule.delete", "rule:GpuHot")
    ]


def test_silences_receivers_and_inhibitions_are_audited_once_each(
    client: TestClient, mint: Minter, runtime: Runtime
) -> None:
    mint.project("alpha")
    member = bearer(mint.token("alpha", "member", "alice"))
    before = _last_id(runtime)

    silence = client.post(
        f"{ALERTS}/silences", json={"matchers": ['alertname="X"'], "duration": "1h"}, headers=member
    )
    assert silence.status_code == 201, silence.text
    silence_id = silence.json()["id"]
    assert client.delete(f"{ALERTS}/silences/{silence_id}", headers=member).status_code == 204
    receiver = {"name": "hook", "kind": "webhook", "config": {"url": "https://example.com/h"}}
    # Only an admin chooses where notifications go.
    admin = bearer(mint.admin())
    assert client.post(f"{ALERTS}/receivers", json=receiver, headers=admin).status_code == 201
    assert client.delete(f"{ALERTS}/receivers/hook", headers=member).status_code == 204
    inhibition = client.post(
        f"{ALERTS}/inhibitions",
        json={"source": ['alertname="A"'], "target": ['alertname="B"']},
        headers=member,
    )
    assert inhibition.status_code == 201, inhibition.text
    inhibition_id = inhibition.json()["id"]
    assert client.delete(f"{ALERTS}/inhibitions/{inhibition_id}", headers=member).status_code == 204

    assert [action for action, _, _ in _entries_after(runtime, before)] == [
        "alert.silence.create",
        "alert.silence.expire",
        "alert.receiver.create",
        "alert.receiver.delete",
        "alert.inhibition.create",
        "alert.inhibition.delete",
    ]


def test_job_changes_are_audited_once_each(
    client: TestClient, mint: Minter, runtime: Runtime
) -> None:
    mint.project("alpha")
    member = bearer(mint.token("alpha", "member", "alice"))
    before = _last_id(runtime)

    assert client.post(JOBS, json={"name": "train"}, headers=member).status_code == 201
    patched = client.patch(f"{JOBS}/train", json={"status": "running"}, headers=member)
    assert patched.status_code == 200
    unchanged = client.patch(f"{JOBS}/train", json={"status": "running"}, headers=member)
    assert unchanged.status_code == 200
    config = {"config": {"batch_size": 32}}
    assert client.put(f"{JOBS}/train/config", json=config, headers=member).status_code == 200

    assert [(action, target) for action, target, _ in _entries_after(runtime, before)] == [
        ("job.create", "job:train"),
        ("job.update", "job:train"),
        ("job.config.desired", "job:train"),
    ]


def test_actuator_policy_and_approval_are_audited_once_each(
    client: TestClient, mint: Minter, runtime: Runtime
) -> None:
    mint.project("alpha")
    member = bearer(mint.token("alpha", "member", "alice"))
    assert client.post(JOBS, json={"name": "train"}, headers=member).status_code == 201
    config = {"config": {"batch_size": 32}}
    assert client.put(f"{JOBS}/train/config", json=config, headers=member).status_code == 200

    before = _last_id(runtime)
    policy = {"require_approval": True, "bounds": {"batch_size": {"min": 8, "max": 512}}}
    set_policy = client.put(f"{JOBS}/train/actuator", json=policy, headers=member)
    assert set_policy.status_code == 200, set_policy.text
    entries = _entries_after(runtime, before)
    assert [(action, target) for action, target, _ in entries] == [("actuator.policy", "job:train")]
    assert entries[0][2].endswith(":alice")

    before = _last_id(runtime)
    approved = client.post(f"{JOBS}/train/actuator/approve", json={"version": 1}, headers=member)
    assert approved.status_code == 200, approved.text
    entries = _entries_after(runtime, before)
    assert [(action, target) for action, target, _ in entries] == [
        ("actuator.approve", "job:train")
    ]
    assert entries[0][2].endswith(":alice")


def test_autoscaler_changes_are_audited_once_each(
    client: TestClient, mint: Minter, runtime: Runtime
) -> None:
    mint.project("alpha")
    admin = bearer(mint.admin())
    member = bearer(mint.token("alpha", "member", "alice"))
    definition = {
        "target_kind": "webhook",
        "target": {"url": "https://scaler.example.com/llama"},
        "policy": {"min_replicas": 2, "max_replicas": 20, "p99_slo_s": 0.5},
        "p99": {"metric": "llm_request_latency_p99_seconds", "match": ['service="llama"']},
    }
    before = _last_id(runtime)

    created = client.post(AUTOSCALERS, json={"name": "llama", **definition}, headers=admin)
    assert created.status_code == 201, created.text
    changed = {**definition, "dry_run": True}
    assert client.put(f"{AUTOSCALERS}/llama", json=changed, headers=member).status_code == 200
    assert client.put(f"{AUTOSCALERS}/llama", json=changed, headers=member).status_code == 200
    assert client.delete(f"{AUTOSCALERS}/llama", headers=admin).status_code == 204

    entries = _entries_after(runtime, before)
    assert [(action, target) for action, target, _ in entries] == [
        ("autoscaler.create", "autoscaler:llama"),
        ("autoscaler.update", "autoscaler:llama"),  # the repeated PUT changed nothing
        ("autoscaler.delete", "autoscaler:llama"),
    ]
    assert entries[1][2].endswith(":alice")
