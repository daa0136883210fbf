"""Alerting routes on real SQLite and PostgreSQL: rules are checked when written, every resource
stays inside its project."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from api.main import create_app
from tests.api.conftest import Minter, bearer
from tuneloop.runtime import Runtime
from tuneloop.storage import session_scope
from tuneloop.storage.models import AlertReceiver

# The receivers below point at 127.0.0.1 (receiver targets: tests/api/test_receiver_targets.py).
pytestmark = pytest.mark.usefixtures("local_receivers_allowed")

BASE = "/api/v1/projects/alpha/alerts"
HOT = {
    "name": "GpuHot",
    "kind": "threshold",
    "query": {"metric": "DCGM_FI_DEV_GPU_TEMP", "aggregation": "max", "window": "5m"},
    "op": ">",
    "threshold": 85,
    "for": "5m",
    "annotations": {"summary": "GPU {{ $labels.gpu }} at {{ $value }}C"},
}


def test_rules_crud_and_refusals(client: TestClient, mint: Minter) -> None:
    mint.project("alpha")
    mint.project("beta")
    member = bearer(mint.token("alpha", "member", "alice"))
    agent = bearer(mint.token("alpha", "agent", "node"))
    other = bearer(mint.token("beta", "member", "bob"))

    created = client.post(f"{BASE}/rules", json=HOT, headers=member)
    assert created.status_code == 201, created.text
    assert created.json()["rule"]["for"] == "300s"
    assert client.post(f"{BASE}/rules", json=HOT, headers=member).status_code == 409

    unknown = client.post(
        f"{BASE}/rules", json={**HOT, "name": "X", "query": {"metric": "no_such"}}, headers=member
    )
    assert unknown.status_code == 422
    assert "unknown metric 'no_such'" in unknown.json()["detail"]

    broken = client.post(
        f"{BASE}/rules",
        json={**HOT, "name": "Y", "annotations": {"summary": "{{ $labels.gpu"}},
        headers=member,
    )
    assert broken.status_code == 422
    assert "unclosed action" in str(broken.json()["detail"])

    bad_query = client.post(
        f"{BASE}/rules",
        json={**HOT, "name": "Z", "query": {"metric": "DCGM_FI_DEV_GPU_TEMP", "match": ["gpu"]}},
        headers=member,
    )
    assert bad_query.status_code == 422
    assert "expected one of" in str(bad_query.json()["detail"])

    rate_of_gauge = client.post(
        f"{BASE}/rules",
        json={**HOT, "name": "R", "kind": "rate", "query": {"metric": "DCGM_FI_DEV_GPU_TEMP"}},
        headers=member,
    )
    assert rate_of_gauge.status_code == 422
    assert "rate needs a counter" in rate_of_gauge.json()["detail"]

    assert client.post(f"{BASE}/rules", json={**HOT, "name": "A"}, headers=agent).status_code == 403
    assert client.get(f"{BASE}/rules", headers=other).status_code == 404
    assert client.get(f"{BASE}/rules/GpuHot", headers=agent).json()["rule"]["threshold"] == 85

    replaced = client.put(f"{BASE}/rules/GpuHot", json={**HOT, "threshold": 90}, headers=member)
    assert replaced.status_code == 200 and replaced.json()["rule"]["threshold"] == 90
    listed = client.get(f"{BASE}/rules", headers=member).json()
    assert [item["rule"]["name"] for item in listed["items"]] == ["GpuHot"]
    assert client.delete(f"{BASE}/rules/GpuHot", headers=member).status_code == 204
    assert client.get(f"{BASE}/rules/GpuHot", headers=member).status_code == 404


def test_rule_file_load_is_all_or_nothing(client: TestClient, mint: Minter) -> None:
    mint.project("alpha")
    member = bearer(mint.token("alpha", "member", "alice"))
    good = """
rules:
  - {name: Hot, kind: threshold, query: {metric: DCGM_FI_DEV_GPU_TEMP}, op: ">", threshold: 85}
  - {name: Silent, kind: absent, query: {metric: DCGM_FI_DEV_GPU_UTIL, by: [hostname]}}
inhibit_rules:
  - {source: ['alertname="Silent"'], target: ['gpu=~".+"'], equal: [hostname]}
"""
    loaded = client.post(f"{BASE}/rules:load", json={"text": good, "source": "f"}, headers=member)
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["created"] == ["Hot", "Silent"]
    bad = good.replace("DCGM_FI_DEV_GPU_TEMP", "nope")
    refused = client.post(f"{BASE}/rules:load", json={"text": bad, "source": "f"}, headers=member)
    assert refused.status_code == 422 and "unknown metric 'nope'" in refused.json()["detail"]
    again = client.post(
        f"{BASE}/rules:load",
        json={"text": good.split("  - {name: Silent")[0], "source": "f"},
        headers=member,
    )
    assert again.json() == {
        "created": [],
        "updated": [],
        "unchanged": ["Hot"],
        "deleted": ["Silent"],
    }
    assert client.get(f"{BASE}/inhibitions", headers=member).json() == []


def test_silences_receivers_and_inhibitions(client: TestClient, mint: Minter) -> None:
    mint.project("alpha")
    mint.project("beta")
    member = bearer(mint.token("alpha", "member", "alice"))
    other = bearer(mint.token("beta", "member", "bob"))
    admin = bearer(mint.admin())

    silence = client.post(
        f"{BASE}/silences",
        json={"matchers": ['alertname="GpuHot"'], "duration": "2h", "comment": "maintenance"},
        headers=member,
    )
    assert silence.status_code == 201, silence.text
    silence_id = silence.json()["id"]
    assert [s["id"] for s in client.get(f"{BASE}/silences", headers=member).json()] == [silence_id]
    endless = client.post(f"{BASE}/silences", json={"matchers": ['a="b"']}, headers=member)
    assert endless.status_code == 422 and "time-boxed" in endless.json()["detail"]
    empty = client.post(
        f"{BASE}/silences", json={"matchers": ['a=""'], "duration": "1h"}, headers=member
    )
    assert empty.status_code == 422
    assert (
        client.delete(
            f"/api/v1/projects/beta/alerts/silences/{silence_id}", headers=other
        ).status_code
        == 404
    )
    assert client.delete(f"{BASE}/silences/{silence_id}", headers=member).status_code == 204
    assert client.get(f"{BASE}/silences", headers=member).json() == []

    receiver = client.post(
        f"{BASE}/receivers",
        json={"name": "oncall", "kind": "pagerduty", "config": {"routing_key": "k" * 32}},
        headers=admin,
    )
    assert receiver.status_code == 201, receiver.text
    assert receiver.json()["config"]["routing_key"] == "***"
    bad = client.post(
        f"{BASE}/receivers",
        json={"name": "hook", "kind": "webhook", "config": {"url": "ftp://x"}},
        headers=admin,
    )
    assert bad.status_code == 422 and "http:// or https://" in bad.json()["detail"]
    bad_group = client.post(
        f"{BASE}/receivers",
        json={"name": "g", "kind": "slack", "config": {"url": "https://x"}, "group_by": ["a-b"]},
        headers=admin,
    )
    assert bad_group.status_code == 422 and "group_by" in bad_group.json()["detail"]

    inhibition = client.post(
        f"{BASE}/inhibitions",
        json={"source": ['alertname="NodeDown"'], "target": ['gpu=~".+"'], "equal": ["hostname"]},
        headers=member,
    )
    assert inhibition.status_code == 201
    assert client.get(f"{BASE}/inhibitions", headers=member).json()[0]["equal"] == ["hostname"]


def test_a_failing_receiver_shows_on_healthz_and_metrics(
    client: TestClient, mint: Minter, runtime: Runtime
) -> None:
    mint.project("alpha")
    member = bearer(mint.token("alpha", "member", "alice"))
    admin = bearer(mint.admin())
    for name in ("ok-hook", "bad-hook"):
        created = client.post(
            f"{BASE}/receivers",
            json={"name": name, "kind": "webhook", "config": {"url": "http://127.0.0.1:9/"}},
            headers=admin,
        )
        assert created.status_code == 201
    assert client.get("/healthz").json()["status"] == "ok"
    with session_scope(runtime.sessions) as session:
        row = session.scalars(select(AlertReceiver).where(AlertReceiver.name == "bad-hook")).one()
        row.consecutive_failures, row.last_error = 3, "HTTP 503: busy"

    # Receiver names and errors are shown to a token of their project (never without one).
    health = client.get("/healthz", headers=member)
    assert health.status_code == 200
    body = health.json()
    assert body["status"] == "degraded"
    assert body["notifiers"]["alpha/bad-hook"]["ok"] is False
    assert body["notifiers"]["alpha/bad-hook"]["last_error"] == "HTTP 503: busy"
    assert body["notifiers"]["alpha/ok-hook"]["ok"] is True
    metrics = client.get("/metrics", headers=member).text
    assert (
        'tuneloop_alert_receiver_up{kind="webhook",project="alpha",receiver="bad-hook"} 0.0'
        in metrics
    )
    assert (
        'tuneloop_alert_receiver_consecutive_failures{kind="webhook",project="alpha",'
        'receiver="bad-hook"} 3.0' in metrics
    )


def test_an_admin_adds_an_alertmanager_receiver_its_secrets_read_back_hidden(
    client: TestClient, mint: Minter
) -> None:
    mint.project("alpha")
    admin = bearer(mint.admin())
    body = {
        "name": "am",
        "kind": "alertmanager",
        "config": {
            "urls": ["https://am-0.example:9093/", "https://am-1.example:9093"],
            "username": "tuneloop",
            "password": "s3cret",
            "resend_interval": "2m",
        },
        "matchers": ['severity="critical"'],
    }
    member = bearer(mint.token("alpha", "member"))
    assert client.post(f"{BASE}/receivers", json=body, headers=member).status_code == 403
    created = client.post(f"{BASE}/receivers", json=body, headers=admin)
    assert created.status_code == 201, created.text
    config = created.json()["config"]
    assert config["password"] == "***"
    assert config["urls"] == body["config"]["urls"]
    (listed,) = client.get(f"{BASE}/receivers", headers=member).json()
    assert listed["kind"] == "alertmanager" and listed["config"]["password"] == "***"
    credentials_in_url = {
        **body, "name": "am2", "config": {"urls": ["https://u:p@am.example:9093"]}
    }  # fmt: skip
    refused = client.post(f"{BASE}/receivers", json=credentials_in_url, headers=admin)
    assert refused.status_code == 422
    assert "username and password" in refused.json()["detail"]


def test_loaded_rules_link_runbooks_at_the_configured_base(runtime: Runtime) -> None:
    base = "https://git.example.com/ops/tuneloop/blob/main/docs/runbooks.md"
    linked = dataclasses.replace(
        runtime,
        settings=runtime.settings.model_copy(update={"alerts_runbook_base_url": base}),
    )
    mint = Minter(linked)
    mint.project("alpha")
    member = bearer(mint.token("alpha", "member", "alice"))
    pack = (Path(__file__).resolve().parents[2] / "alerts/pack/gpu-fleet.yaml").read_text()
    with TestClient(create_app(linked)) as client:
        loaded = client.post(
            f"{BASE}/rules:load", json={"text": pack, "source": "pack"}, headers=member
        )
        assert loaded.status_code == 200, loaded.text
        rules = client.get(f"{BASE}/rules", headers=member).json()
    items = [item["rule"] for item in rules["items"]]
    assert len(items) == 21
    assert all(
        rule["annotations"]["runbook_url"] == f"{base}#{rule['name'].lower()}" for rule in items
    )


PROMQL_HOT = {
    "name": "GpuHotPromql",
    "kind": "promql",
    "expr": "max by (gpu) (max_over_time(DCGM_FI_DEV_GPU_TEMP[5m])) > 85",
    "for": "5m",
}


def test_a_promql_rule_is_created_and_a_bad_expression_refused_naming_expr(
    client: TestClient, mint: Minter
) -> None:
    mint.project("alpha")
    member = bearer(mint.token("alpha", "member", "alice"))
    base = "/api/v1/projects/alpha/alerts/rules"
    created = client.post(base, json=PROMQL_HOT, headers=member)
    assert created.status_code == 201, created.text
    assert created.json()["rule"]["expr"] == PROMQL_HOT["expr"]
    read = client.get(f"{base}/GpuHotPromql", headers=member).json()["rule"]
    assert read["kind"] == "promql" and read["expr"] == PROMQL_HOT["expr"]
    bad = client.post(
        base, json={**PROMQL_HOT, "name": "Bad", "expr": "rate(x[5m]"}, headers=member
    )
    assert bad.status_code == 422
    (problem,) = bad.json()["detail"]
    assert problem["loc"][-1] == "expr" and "parse error" in problem["msg"]
