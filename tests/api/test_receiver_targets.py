"""SSRF through alert receivers: only an admin chooses where the server sends notifications,
never to an internal address unless the operator allows its network, and what a target answers
is never echoed back through the API."""

from __future__ import annotations

from collections.abc import Iterator
from ipaddress import ip_network
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from alerts.dispatch import Dispatcher
from alerts.evaluator import Evaluator
from api.main import create_app
from tests.alerts.receivers import Receiver, Reply, serve
from tests.api.conftest import Minter, bearer
from tuneloop.runtime import Runtime
from tuneloop.settings import Settings
from tuneloop.storage import session_factory
from tuneloop.storage.timeseries.types import SeriesBatch
from tuneloop.storage.timeseries.writer import SampleWriter
from tuneloop.storage.types import utcnow

BASE = "/api/v1/projects/alpha/alerts"
INTERNAL = [
    "http://127.0.0.1:8080/",
    "http://169.254.169.254/latest/meta-data/",
    "http://[::1]/",
    "http://10.0.0.1/",
    "http://localhost:9/",
]


def webhook(url: str, name: str = "hook") -> dict[str, Any]:
    return {"name": name, "kind": "webhook", "config": {"url": url}}


def test_only_an_admin_chooses_a_receiver(client: TestClient, mint: Minter) -> None:
    mint.project("alpha")
    for role, needed in (("member", "needs an admin token"), ("agent", "needs a member or")):
        token = bearer(mint.token("alpha", role, role))
        refused = client.post(
            f"{BASE}/receivers", json=webhook("https://hooks.example.org/x"), headers=token
        )
        assert refused.status_code == 403
        assert needed in refused.json()["detail"]
    admin = bearer(mint.admin())
    created = client.post(
        f"{BASE}/receivers", json=webhook("https://hooks.example.org/x"), headers=admin
    )
    assert created.status_code == 201, created.text


@pytest.mark.parametrize("url", INTERNAL)
def test_internal_targets_are_refused(client: TestClient, mint: Minter, url: str) -> None:
    mint.project("alpha")
    admin = bearer(mint.admin())
    refused = client.post(f"{BASE}/receivers", json=webhook(url), headers=admin)
    assert refused.status_code == 422
    assert "TUNELOOP_ALERTS_ALLOWED_TARGET_NETWORKS" in refused.json()["detail"]


def test_other_kinds_targets_are_checked_too(client: TestClient, mint: Minter) -> None:
    mint.project("alpha")
    admin = bearer(mint.admin())
    for kind, config in (
        ("slack", {"url": "http://192.168.0.10/services/x"}),
        ("pagerduty", {"routing_key": "k" * 32, "url": "http://127.0.0.1:9/v2/enqueue"}),
        ("email", {"to": ["a@example.org"], "from": "t@example.org", "host": "localhost"}),
    ):
        body = {"name": kind, "kind": kind, "config": config}
        refused = client.post(f"{BASE}/receivers", json=body, headers=admin)
        assert refused.status_code == 422, kind


@pytest.fixture
def allowing(engine: Engine, database_url: str) -> Iterator[TestClient]:
    """An API whose operator allows the 10.0.0.0/8 network and the loopback one."""
    settings = Settings(
        database_url=database_url,
        redis_url=None,
        alerts_allowed_target_networks=("10.0.0.0/8", "127.0.0.0/8"),
    )
    runtime = Runtime(settings=settings, engine=engine, sessions=session_factory(engine))
    with TestClient(create_app(runtime)) as client:
        yield client


def test_a_network_the_operator_allows_is_accepted(allowing: TestClient, runtime: Runtime) -> None:
    mint = Minter(runtime)
    mint.project("alpha")
    admin = bearer(mint.admin())
    created = allowing.post(f"{BASE}/receivers", json=webhook("http://10.0.0.1/"), headers=admin)
    assert created.status_code == 201, created.text
    still = allowing.post(
        f"{BASE}/receivers", json=webhook("http://192.168.0.1/", "other"), headers=admin
    )
    assert still.status_code == 422 and "private" in still.json()["detail"]


def test_the_error_path_returns_no_answer_text(allowing: TestClient, runtime: Runtime) -> None:
    mint = Minter(runtime)
    project_id = mint.project("alpha")
    admin = bearer(mint.admin())
    member = bearer(mint.token("alpha"))
    secret = "root:x:0:0 instance-credentials AKIA-SECRET"
    rule = {"name": "Hot", "kind": "threshold", "query": {"metric": "DCGM_FI_DEV_GPU_TEMP"},
            "op": ">", "threshold": 85}  # fmt: skip
    assert allowing.post(f"{BASE}/rules", json=rule, headers=member).status_code == 201
    with serve(Receiver(Reply(400, secret))) as target:
        created = allowing.post(f"{BASE}/receivers", json=webhook(target.url), headers=admin)
        assert created.status_code == 201, created.text
        batch = SeriesBatch("DCGM_FI_DEV_GPU_TEMP", {"gpu": "0"}, [utcnow()], [95.0])
        SampleWriter(runtime.engine).write(project_id, [batch])
        Evaluator(runtime.engine, runtime.sessions).evaluate()
        dispatcher = Dispatcher(runtime.sessions, allowed_networks=[ip_network("127.0.0.0/8")])
        assert dispatcher.dispatch() == 1
        assert dispatcher.drain()
        dispatcher.close()
        assert len(target.received) == 1
    receivers = allowing.get(f"{BASE}/receivers", headers=member)
    notifications = allowing.get(f"{BASE}/notifications", headers=member)
    health = allowing.get("/healthz", headers=admin)
    assert receivers.json()[0]["last_error"] == "HTTP 400: Bad Request"
    assert notifications.json()["items"][0]["last_error"] == "HTTP 400: Bad Request"
    for answer in (receivers, notifications, health):
        assert "SECRET" not in answer.text and "root:x" not in answer.text
