"""Autoscalers through the API, on real SQLite and PostgreSQL: CRUD, what is refused with 422,
and who may choose a target (admins only)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from tests.api.conftest import Minter, bearer
from tuneloop.runtime import Runtime
from tuneloop.storage import session_scope
from tuneloop.storage.models import AuditEntry, Autoscaler

URL = "/api/v1/projects/alpha/autoscalers"
DEPLOYMENT = {"kind": "Deployment", "namespace": "serving", "name": "llama"}
P99 = {"metric": "llm_request_latency_p99_seconds", "match": ['service="llama"']}


def body(**changes: Any) -> dict[str, Any]:
    return {
        "name": "llama",
        "target_kind": "kubernetes",
        "target": DEPLOYMENT,
        "policy": {"min_replicas": 2, "max_replicas": 20, "p99_slo_s": 0.5},
        "p99": P99,
        **changes,
    }


def spec(**changes: Any) -> dict[str, Any]:
    """A PUT body: the definition without the name."""
    return {key: value for key, value in body(**changes).items() if key != "name"}


@pytest.fixture
def tokens(mint: Minter) -> dict[str, dict[str, str]]:
    mint.project("alpha")
    mint.project("beta")
    return {
        "admin": bearer(mint.admin()),
        "member": bearer(mint.token("alpha", "member", "alice")),
        "agent": bearer(mint.token("alpha", "agent", "node-7")),
        "beta": bearer(mint.token("beta", "member", "bob")),
    }


def audit_actions(runtime: Runtime) -> list[tuple[str, str, dict[str, Any]]]:
    with session_scope(runtime.sessions) as session:
        rows = session.scalars(
            select(AuditEntry)
            .where(AuditEntry.action.startswith("autoscaler."))
            .order_by(AuditEntry.id)
        )
        return [(row.action, row.actor, row.details) for row in rows]


def test_autoscaler_crud(
    client: TestClient, tokens: dict[str, dict[str, str]], runtime: Runtime
) -> None:
    admin, member = tokens["admin"], tokens["member"]
    created = client.post(URL, json=body(), headers=admin)
    assert created.status_code == 201, created.text
    out = created.json()
    assert out["name"] == "llama" and out["target"] == DEPLOYMENT
    assert out["policy"]["max_replicas"] == 20
    assert out["policy"]["scale_in_stabilization_s"] == 300  # defaults filled in: what runs
    assert out["p99"] == P99 and out["queue"] is None
    assert (out["dry_run"], out["enabled"]) == (False, True)
    assert client.post(URL, json=body(), headers=admin).status_code == 409

    webhook = body(name="edge", target_kind="webhook", target={"url": "https://scaler/x"})
    assert client.post(URL, json=webhook, headers=admin).status_code == 201
    listed = client.get(URL, headers=tokens["agent"])
    assert listed.status_code == 200
    assert [item["name"] for item in listed.json()["items"]] == ["edge", "llama"]
    assert client.get(f"{URL}/llama", headers=member).json() == out

    # A member changes the policy, dry_run and enabled of an autoscaler, with the same target.
    policy = {"min_replicas": 3, "max_replicas": 8, "p99_slo_s": 0.4}
    replaced = client.put(
        f"{URL}/llama", json=spec(policy=policy, dry_run=True, enabled=False), headers=member
    )
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["policy"]["max_replicas"] == 8
    assert (replaced.json()["dry_run"], replaced.json()["enabled"]) == (True, False)
    assert replaced.json()["updated_at"] > out["updated_at"]
    unchanged = client.put(
        f"{URL}/llama", json=spec(policy=policy, dry_run=True, enabled=False), headers=member
    )
    assert unchanged.json() == replaced.json()

    state = client.get(f"{URL}/llama/state", headers=member)
    assert state.status_code == 200
    assert state.json() == {
        "name": "llama",
        "enabled": False,
        "dry_run": True,
        "replicas": None,
        "last_decision": None,
        "last_reason": None,
        "last_decision_at": None,
        "last_error": None,
        "last_error_at": None,
        "state": {},
    }

    assert client.delete(f"{URL}/llama", headers=admin).status_code == 204
    assert client.get(f"{URL}/llama", headers=member).status_code == 404
    assert client.get(f"{URL}/llama/state", headers=member).status_code == 404

    actions = audit_actions(runtime)
    assert [action for action, _, _ in actions] == [
        "autoscaler.create",
        "autoscaler.create",
        "autoscaler.update",  # the repeated PUT changed nothing and is not audited
        "autoscaler.delete",
    ]
    update = actions[2]
    assert update[1].endswith(":alice")
    assert set(update[2]) == {"policy", "dry_run", "enabled"}


def test_the_state_shows_the_last_pass(
    client: TestClient, tokens: dict[str, dict[str, str]], runtime: Runtime
) -> None:
    assert client.post(URL, json=body(), headers=tokens["admin"]).status_code == 201
    with session_scope(runtime.sessions) as session:
        row = session.scalars(select(Autoscaler)).one()
        row.replicas, row.last_decision, row.last_reason = 4, 6, "scale_out"
        row.last_error = "webhook answered HTTP 500"
        row.state = {"replicas": 4, "recommendations": [[1.0, 6]], "events": []}

    state = client.get(f"{URL}/llama/state", headers=tokens["agent"]).json()

    assert (state["replicas"], state["last_decision"], state["last_reason"]) == (4, 6, "scale_out")
    assert state["last_error"] == "webhook answered HTTP 500"
    assert state["state"]["recommendations"] == [[1.0, 6]]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"policy": {"min_replicas": 5, "max_replicas": 2, "p99_slo_s": 1}}, "min_replicas <="),
        ({"policy": {"max_replicas": 2, "p99_slo_s": 1}}, "the policy needs min_replicas"),
        ({"policy": {"min_replicas": "2", "max_replicas": 4, "p99_slo_s": 1}}, "must be a number"),
        ({"policy": {"min_replicas": 1, "max_replicas": 4, "p99_slo_s": 1, "x": 1}}, "unknown"),
        ({"policy": {"min_replicas": 1, "max_replicas": 4, "p99_slo_s": -1}}, "must be > 0"),
        ({"target_kind": "nomad"}, "unknown target kind 'nomad': use one of kubernetes, webhook"),
        ({"target": {**DEPLOYMENT, "kind": "DaemonSet"}}, "Deployment or StatefulSet"),
        ({"target": {**DEPLOYMENT, "namespace": "Serving!"}}, "invalid namespace"),
        ({"target": {**DEPLOYMENT, "kubeconfig": "/etc/kube"}}, "unknown: kubeconfig"),
        ({"target_kind": "webhook", "target": {"url": "file:///etc/passwd"}}, "http:// or"),
        ({"target_kind": "webhook", "target": {"url": "https://u:p@h/x"}}, "credentials"),
        ({"target_kind": "webhook", "target": {"url": "https://h/x", "token": "s"}}, "unknown"),
        ({"p99": {"metric": "p99", "match": ["service=llama"]}}, "invalid p99 matcher"),
        ({"p99": {"metric": "p99", "match": ['job=~"("']}}, "invalid regular expression"),
        ({"p99": None}, "give the p99 selector"),
        ({"p99": {"expr": "max(p99"}}, "invalid p99 expr: parse error"),
        ({"p99": {"expr": "p99[5m]"}}, "instant vector or a scalar"),
        ({"p99": {"expr": "predict_linear(p99[5m], 60)"}}, "predict_linear() is not supported"),
        ({"p99": {"expr": "max(p99)", "metric": "p99"}}, "stands alone: it takes no metric"),
        ({"queue": {"metric": "queue"}}, "needs the policy's target_queue_per_replica"),
    ],
)
def test_invalid_definitions_are_422(
    client: TestClient, tokens: dict[str, dict[str, str]], changes: dict[str, Any], message: str
) -> None:
    response = client.post(URL, json=body(**changes), headers=tokens["admin"])

    assert response.status_code == 422, response.text
    assert response.json()["code"] == "invalid_input"
    assert message in response.json()["detail"]


@pytest.mark.parametrize(
    "changes",
    [
        {"kubeconfig": "/etc/kubernetes/admin.conf"},  # no file path in any body
        {"name": "no spaces"},
        {"p99": {"metric": "", "match": []}},
    ],
)
def test_malformed_bodies_are_422(
    client: TestClient, tokens: dict[str, dict[str, str]], changes: dict[str, Any]
) -> None:
    response = client.post(URL, json=body(**changes), headers=tokens["admin"])
    assert response.status_code == 422, response.text


def test_only_admins_choose_targets(
    client: TestClient, tokens: dict[str, dict[str, str]], runtime: Runtime
) -> None:
    member, agent, admin = tokens["member"], tokens["agent"], tokens["admin"]
    for token in (member, agent):
        refused = client.post(URL, json=body(), headers=token)
        assert refused.status_code == 403
        assert "needs an admin token" in refused.json()["detail"]
    assert client.get(URL, headers=admin).json()["items"] == []

    assert client.post(URL, json=body(), headers=admin).status_code == 201
    elsewhere = {"kind": "Deployment", "namespace": "kube-system", "name": "coredns"}
    hook = {"url": "http://169.254.169.254/latest"}
    for target_kind, target in (("kubernetes", elsewhere), ("webhook", hook)):
        moved = client.put(
            f"{URL}/llama", json=spec(target_kind=target_kind, target=target), headers=member
        )
        assert moved.status_code == 403
        assert "choosing an autoscaler's target needs an admin token" in moved.json()["detail"]
    assert client.get(f"{URL}/llama", headers=member).json()["target"] == DEPLOYMENT

    assert client.put(f"{URL}/llama", json=spec(dry_run=True), headers=agent).status_code == 403
    deleted = client.delete(f"{URL}/llama", headers=member)
    assert deleted.status_code == 403 and "enabled: false" in deleted.json()["detail"]

    # An admin may move it; the old target's remembered state does not come along.
    with session_scope(runtime.sessions) as session:
        row = session.scalars(select(Autoscaler)).one()
        row.state = {"replicas": 4, "recommendations": [[1.0, 6]], "events": []}
        row.replicas, row.last_decision, row.last_reason = 4, 6, "scale_out"
    moved = client.put(f"{URL}/llama", json=spec(target=elsewhere), headers=admin)
    assert moved.status_code == 200 and moved.json()["target"] == elsewhere
    state = client.get(f"{URL}/llama/state", headers=member).json()
    assert (state["state"], state["replicas"], state["last_decision"]) == ({}, None, None)


def test_another_projects_autoscalers_are_not_found(
    client: TestClient, tokens: dict[str, dict[str, str]]
) -> None:
    assert client.post(URL, json=body(), headers=tokens["admin"]).status_code == 201
    beta = tokens["beta"]

    for path in (URL, f"{URL}/llama", f"{URL}/llama/state"):
        assert client.get(path, headers=beta).status_code == 404
    assert client.put(f"{URL}/llama", json=spec(), headers=beta).status_code == 404
    assert client.delete(f"{URL}/llama", headers=beta).status_code == 404
    own = "/api/v1/projects/beta/autoscalers"
    assert client.get(own, headers=beta).json()["items"] == []
    assert client.get(f"{own}/llama", headers=beta).status_code == 404
    assert client.get(URL).status_code == 401


def test_a_signal_may_be_a_promql_expression(
    client: TestClient, tokens: dict[str, dict[str, str]]
) -> None:
    expr = 'max(llm_request_latency_p99_seconds{service="llama"})'
    created = client.post(URL, json=body(p99={"expr": expr}), headers=tokens["admin"])
    assert created.status_code == 201, created.text
    assert created.json()["p99"]["expr"] == expr
    read = client.get(f"{URL}/llama", headers=tokens["agent"]).json()
    assert read["p99"]["expr"] == expr and "metric" not in read["p99"]
