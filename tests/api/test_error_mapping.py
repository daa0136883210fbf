"""tuneloop's errors reach HTTP through one handler: each kind has its status and code, a
component's error answers as the kind it subclasses, and a temporary one says when to retry."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from actuators.autoscaler.spec import SpecError
from alerts.rules import RuleError
from api.errors import install_error_handlers
from collector.pipeline import PipelineFull
from tuneloop.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    PermanentError,
    PermissionDenied,
    TuneloopError,
)
from tuneloop.storage import DatabaseUnavailable
from tuner.space import SpaceError

RAISED: dict[str, TuneloopError] = {
    "invalid": InvalidInput("batch_size must be > 0"),
    "rule": RuleError("rule r: unknown metric 'x'"),
    "spec": SpecError("target takes only name; unknown: kubeconfig"),
    "space": SpaceError("lr: low must be below high"),
    "missing": NotFound("job 'train' not found"),
    "taken": Conflict("job 'train' already exists"),
    "denied": PermissionDenied("a member token cannot do that"),
    "other": PermanentError("no"),
    "database": DatabaseUnavailable("database unavailable: connection refused"),
}


@pytest.fixture(scope="module")
def client() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/raise/{name}")
    def raise_(name: str) -> None:
        raise RAISED[name]

    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize(
    ("name", "status", "code"),
    [
        ("invalid", 422, "invalid_input"),
        ("rule", 422, "invalid_input"),
        ("spec", 422, "invalid_input"),
        ("space", 422, "invalid_input"),
        ("missing", 404, "not_found"),
        ("taken", 409, "conflict"),
        ("denied", 403, "forbidden"),
        ("other", 400, "bad_request"),
        ("database", 503, "unavailable"),
    ],
)
def test_each_kind_has_one_answer(client: TestClient, name: str, status: int, code: str) -> None:
    response = client.get(f"/raise/{name}")
    assert response.status_code == status
    assert response.json() == {"detail": str(RAISED[name]), "code": code}
    assert ("retry-after" in response.headers) == (status == 503)


def test_a_temporary_error_says_when_to_retry(client: TestClient) -> None:
    assert client.get("/raise/database").headers["retry-after"] == "5"
    RAISED["full"] = PipelineFull("the write pipeline is full", 12.4)
    full = client.get("/raise/full")
    assert full.status_code == 503
    assert full.headers["retry-after"] == "12"
