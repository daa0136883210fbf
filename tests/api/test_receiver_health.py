"""``/healthz`` and ``/metrics`` answer without a token: then they count the failing alert
receivers but name no project, no receiver and no error; a token sees its project's receivers,
an admin token every project's."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from tests.api.conftest import Minter, bearer
from tuneloop.runtime import Runtime
from tuneloop.storage import session_scope
from tuneloop.storage.models import AlertReceiver

pytestmark = pytest.mark.usefixtures("local_receivers_allowed")

NAMES = ("alpha", "beta", "alpha-hook", "beta-hook", "ok-hook", "connection refused")


@pytest.fixture
def failing(client: TestClient, mint: Minter, runtime: Runtime) -> dict[str, dict[str, str]]:
    """Projects alpha and beta, each with a failing receiver; alpha also with a healthy one.
    Returns the headers of a member of alpha and of an admin."""
    admin = bearer(mint.admin())
    for project in ("alpha", "beta"):
        mint.project(project)
        for name in (f"{project}-hook", "ok-hook") if project == "alpha" else (f"{project}-hook",):
            created = client.post(
                f"/api/v1/projects/{project}/alerts/receivers",
                json={"name": name, "kind": "webhook", "config": {"url": "http://127.0.0.1:9/"}},
                headers=admin,
            )
            assert created.status_code == 201, created.text
    with session_scope(runtime.sessions) as session:
        for row in session.scalars(select(AlertReceiver).where(AlertReceiver.name != "ok-hook")):
            row.consecutive_failures, row.last_error = 5, "connection refused"
    return {"member": bearer(mint.token("alpha")), "admin": admin}


def test_healthz_without_a_token_only_counts(
    client: TestClient, failing: dict[str, dict[str, str]]
) -> None:
    for headers in ({}, bearer("tl_not-a-token")):
        response = client.get("/healthz", headers=headers)
        assert response.status_code == 200
        body = response.json()
        assert body["status"] == "degraded"
        assert body["receivers_failing"] == 2
        assert body["notifiers"] == {}
        assert not [name for name in NAMES if name in response.text]


def test_healthz_with_a_token_names_its_projects_receivers(
    client: TestClient, failing: dict[str, dict[str, str]]
) -> None:
    body = client.get("/healthz", headers=failing["member"]).json()
    assert body["receivers_failing"] == 2
    assert set(body["notifiers"]) == {"alpha/alpha-hook", "alpha/ok-hook"}
    assert body["notifiers"]["alpha/alpha-hook"]["last_error"] == "connection refused"
    every = client.get("/healthz", headers=failing["admin"]).json()["notifiers"]
    assert set(every) == {"alpha/alpha-hook", "alpha/ok-hook", "beta/beta-hook"}


def test_metrics_without_a_token_only_count(
    client: TestClient, failing: dict[str, dict[str, str]]
) -> None:
    text = client.get("/metrics").text
    assert "tuneloop_alert_receivers 3.0" in text
    assert "tuneloop_alert_receivers_failing 2.0" in text
    assert "tuneloop_alert_receiver_up" not in text
    assert not [name for name in NAMES if f'"{name}"' in text]


def test_metrics_with_a_token_show_its_projects_receivers(
    client: TestClient, failing: dict[str, dict[str, str]]
) -> None:
    text = client.get("/metrics", headers=failing["member"]).text
    assert (
        'tuneloop_alert_receiver_up{kind="webhook",project="alpha",receiver="alpha-hook"} 0.0'
        in (text)
    )
    assert 'receiver="ok-hook"} 1.0' in text
    assert '"beta"' not in text
    admin = client.get("/metrics", headers=failing["admin"]).text
    assert 'project="beta",receiver="beta-hook"} 0.0' in admin
