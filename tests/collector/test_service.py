"""Wiring: the pipeline built from settings, shared with the API app (lifespan, /metrics,
/healthz's collectors section, PipelineDep)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi import HTTPException
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine
from starlette.requests import Request

from api.deps import get_pipeline
from api.main import create_app
from collector.pipeline import Pipeline
from collector.relabel import RelabelConfigError
from collector.service import build_pipeline
from collector.status import StatusBoard
from tests.collector.test_pipeline import series, stored
from tuneloop.runtime import Runtime
from tuneloop.settings import Settings
from tuneloop.storage import session_factory


@pytest.fixture
def runtime(engine: Engine, database_url: str, tmp_path: Path) -> Runtime:
    settings = Settings(database_url=database_url, redis_url=None, data_dir=tmp_path)
    return Runtime(settings=settings, engine=engine, sessions=session_factory(engine))


def test_build_pipeline_uses_the_settings(runtime: Runtime, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("- action: labeldrop\n  regex: pid\n")
    settings = runtime.settings.model_copy(
        update={"relabel_config": rules, "batch_max_samples": 123, "flush_interval_s": 0.5}
    )
    pipeline = build_pipeline(Runtime(settings, runtime.engine, runtime.sessions))
    assert pipeline.config.batch_max_samples == 123
    assert pipeline.config.flush_interval_s == 0.5
    assert pipeline.config.queue_max_samples == 500_000
    assert pipeline._spool is not None and pipeline._spool.root == tmp_path / "spool"
    assert pipeline._relabeler.rules


def test_a_bad_relabel_config_stops_the_build(runtime: Runtime, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("- action: keep\n  regex: '(?=a)a'\n")
    settings = runtime.settings.model_copy(update={"relabel_config": rules})
    with pytest.raises(RelabelConfigError, match=r"rule 1: invalid regex .*lookarounds"):
        build_pipeline(Runtime(settings, runtime.engine, runtime.sessions))


def test_the_lifespan_builds_starts_and_stops_a_pipeline(
    runtime: Runtime, project_id: int, engine: Engine
) -> None:
    app = create_app(runtime)
    assert app.state.pipeline is None
    with TestClient(app) as client:
        pipeline = app.state.pipeline
        assert isinstance(pipeline, Pipeline) and pipeline.status().running
        pipeline.submit(project_id, [series(4)])
        text = client.get("/metrics").text
        assert "tuneloop_collector_points_received_total 4.0" in text
        assert "tuneloop_api_requests_total" in text  # one registry for both
    assert app.state.pipeline is None
    assert not pipeline.status().running
    assert stored(engine) == 4  # stopping drained it
    # The same app started again shares its metrics instead of failing on duplicates.
    with TestClient(app) as client:
        assert client.get("/metrics").status_code == 200


def test_a_given_pipeline_is_shared_and_left_to_its_owner(runtime: Runtime) -> None:
    registry = CollectorRegistry()
    pipeline = build_pipeline(runtime, registry=registry)
    app = create_app(runtime, pipeline)
    with TestClient(app) as client:
        assert app.state.pipeline is pipeline
        assert "tuneloop_collector_queue_depth" in client.get("/metrics").text
        request = Request({"type": "http", "app": app})
        assert get_pipeline(request) is pipeline
    assert app.state.pipeline is pipeline
    pipeline.stop()


def test_pipeline_dep_is_503_until_there_is_one(runtime: Runtime) -> None:
    app = create_app(runtime)
    with pytest.raises(HTTPException) as excinfo:
        get_pipeline(Request({"type": "http", "app": app}))
    assert excinfo.value.status_code == 503


def test_healthz_reports_collectors_and_stays_200_when_one_fails(runtime: Runtime) -> None:
    board = StatusBoard()
    board.register("host")
    board.register("nvml")
    board.register("dcgm")
    board.succeeded("host", datetime(2026, 11, 22, 12, 0, tzinfo=UTC))
    board.failed("nvml", "NVMLError_GpuIsLost: GPU is lost")
    board.failed("nvml", "NVMLError_GpuIsLost: GPU is lost")
    with TestClient(create_app(runtime, collector_status=board)) as client:
        response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "degraded"
    assert body["checks"]["database"]["ok"] is True
    assert body["collectors"] == {
        "host": {
            "ok": True,
            "last_error": None,
            "last_success_at": "2026-11-22T12:00:00Z",
            "consecutive_failures": 0,
        },
        "nvml": {
            "ok": False,
            "last_error": "NVMLError_GpuIsLost: GPU is lost",
            "last_success_at": None,
            "consecutive_failures": 2,
        },
        "dcgm": {
            "ok": None,
            "last_error": None,
            "last_success_at": None,
            "consecutive_failures": 0,
        },
    }


def test_healthz_without_collectors_has_an_empty_section(runtime: Runtime) -> None:
    with TestClient(create_app(runtime)) as client:
        body = client.get("/healthz").json()
    assert body["status"] == "ok" and body["collectors"] == {}
