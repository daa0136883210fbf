"""``/healthz``, ``/metrics`` and ``/openapi.json``, against real databases and a real Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

import tuneloop.settings
from api.main import create_app
from tests.api.conftest import Minter, bearer
from tuneloop.runtime import Runtime
from tuneloop.settings import Settings, configure, get_settings, load_settings

CLOSED_PORT_POSTGRES = "postgresql://postgres@127.0.0.1:1/test"
CLOSED_PORT_REDIS = "redis://127.0.0.1:1/0"


def client_for(settings: Settings) -> Iterator[TestClient]:
    runtime = Runtime.open(settings, check=False)
    try:
        with TestClient(create_app(runtime)) as client:
            yield client
    finally:
        runtime.close()


# --------------------------------------------------------------------------- /healthz


def test_healthz_ok_with_database(client: TestClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["database"]["latency_ms"] >= 0
    assert body["checks"]["redis"]["ok"] is None


def test_healthz_503_when_database_is_unreachable() -> None:
    for client in client_for(Settings(database_url=CLOSED_PORT_POSTGRES, redis_url=None)):
        response = client.get("/healthz")
        assert response.status_code == 503
        body = response.json()
        assert body["status"] == "degraded"
        assert body["checks"]["database"]["ok"] is False
        assert "127.0.0.1:1" in body["checks"]["database"]["error"]
        # Other routes fail cleanly too, with the JSON error body.
        api = client.get("/api/v1/projects", headers=bearer("tl_whatever"))
        assert api.status_code == 503
        assert api.json() == {"detail": "database unavailable", "code": "unavailable"}


def test_healthz_reports_a_real_redis(database_url: str, redis_url: str, engine: object) -> None:
    for client in client_for(Settings(database_url=database_url, redis_url=redis_url)):
        body = client.get("/healthz").json()
        assert body["status"] == "ok"
        assert body["checks"]["redis"]["ok"] is True
        assert body["checks"]["redis"]["latency_ms"] >= 0


def test_healthz_degraded_when_configured_redis_is_down(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'h.db'}", redis_url=CLOSED_PORT_REDIS)
    for client in client_for(settings):
        response = client.get("/healthz")
        assert response.status_code == 503
        body = response.json()
        assert body["status"] == "degraded"
        assert body["checks"]["database"]["ok"] is True
        assert body["checks"]["redis"]["ok"] is False
        assert body["checks"]["redis"]["error"]


def test_lifespan_opens_and_closes_a_runtime_from_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tuneloop.settings, "_current", None)
    configure(load_settings(database_url=f"sqlite:///{tmp_path / 'life.db'}", redis_url=""))
    try:
        app = create_app()
        with TestClient(app) as client:
            assert isinstance(app.state.runtime, Runtime)
            assert client.get("/healthz").status_code == 200
        assert app.state.runtime is None
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()


# --------------------------------------------------------------------------- /metrics


def _request_counts(client: TestClient) -> dict[tuple[str, str, str], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == CONTENT_TYPE_LATEST
    counts = {}
    for family in text_string_to_metric_families(response.text):
        if family.name == "tuneloop_api_requests":
            assert family.type == "counter"
            for sample in family.samples:
                if sample.name == "tuneloop_api_requests_total":
                    key = (sample.labels["method"], sample.labels["route"], sample.labels["status"])
                    counts[key] = sample.value
    return counts


def test_metrics_count_requests_by_route_template(client: TestClient, mint: Minter) -> None:
    mint.project("alpha")
    member = bearer(mint.token("alpha"))
    for _ in range(3):
        assert client.get("/api/v1/projects/alpha/jobs", headers=member).status_code == 200
    assert client.get("/api/v1/projects/alpha/jobs").status_code == 401
    assert client.get("/no/such/path").status_code == 404
    assert client.get("/healthz").status_code == 200

    counts = _request_counts(client)
    assert counts[("GET", "/api/v1/projects/{project}/jobs", "200")] == 3
    assert counts[("GET", "/api/v1/projects/{project}/jobs", "401")] == 1
    assert counts[("GET", "<unmatched>", "404")] == 1
    assert counts[("GET", "/healthz", "200")] == 1

    text = client.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    latency = families["tuneloop_api_request_duration_seconds"]
    assert latency.type == "histogram"
    counts_in_histogram = [
        s
        for s in latency.samples
        if s.name.endswith("_count") and s.labels["route"] == "/api/v1/projects/{project}/jobs"
    ]
    assert sum(s.value for s in counts_in_histogram) == 4


def test_each_app_has_its_own_registry(runtime: Runtime) -> None:
    with TestClient(create_app(runtime)) as first, TestClient(create_app(runtime)) as second:
        first.get("/healthz")
        first.get("/healthz")
        second.get("/healthz")
        assert _request_counts(first)[("GET", "/healthz", "200")] == 2
        assert _request_counts(second)[("GET", "/healthz", "200")] == 1


# --------------------------------------------------------------------------- /openapi.json


def test_openapi_lists_routes_with_bearer_security(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    expected = {
        "/healthz": {"get"},
        "/metrics": {"get"},
        "/api/v1/projects": {"get", "post"},
        "/api/v1/projects/{project}": {"get"},
        "/api/v1/projects/{project}/tokens": {"get", "post"},
        "/api/v1/tokens": {"get", "post"},
        "/api/v1/tokens/self": {"get"},
        "/api/v1/tokens/{token_id}": {"delete"},
        "/api/v1/projects/{project}/jobs": {"get", "post"},
        "/api/v1/projects/{project}/jobs/{job}": {"get", "patch"},
        "/api/v1/projects/{project}/jobs/{job}/config": {"get", "put"},
        "/api/v1/projects/{project}/jobs/{job}/config/observed": {"post"},
    }
    for path, methods in expected.items():
        assert path in paths, path
        assert set(paths[path]) >= methods, path
    assert spec["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "tl_…",
        "description": "An API token secret: `Authorization: Bearer tl_...`",
    }
    assert "security" not in paths["/healthz"]["get"]
    assert paths["/api/v1/projects"]["get"]["security"] == [{"bearer": []}]
    job_param = next(
        p
        for p in paths["/api/v1/projects/{project}/jobs/{job}"]["get"]["parameters"]
        if p["name"] == "job"
    )
    assert "id when all digits" in job_param["description"]
