"""The series API answers from a Prometheus-compatible TSDB when the runtime has one: the same
routes and result shapes as on the built-in store (tests/api/test_series_api.py), the project
isolation of the contract."""

from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from tests.api.conftest import Minter, bearer
from tests.peers import flush_victoria_metrics
from tests.timeseries_contract.conftest import T0
from tuneloop.runtime import Runtime
from tuneloop.settings import Settings
from tuneloop.storage import make_engine, session_factory
from tuneloop.storage.models import metadata
from tuneloop.storage.prometheus.backend import PrometheusBackend
from tuneloop.storage.timeseries.types import SeriesBatch

GAUGE = "DCGM_FI_DEV_GPU_UTIL"


@pytest.mark.parametrize("tsdb", ["victoriametrics", "prometheus"])
def test_series_routes_read_the_tsdb(
    tsdb: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url: str = request.getfixturevalue(
        "victoria_metrics_url" if tsdb == "victoriametrics" else "prometheus_url"
    )
    database_url = f"sqlite:///{tmp_path / 'tuneloop.db'}"
    engine = make_engine(database_url)
    metadata.create_all(engine)
    # The TSDB is shared: a project label of this test's own keeps other tests' series out.
    remote = PrometheusBackend(url, project_label=f"p{random.randrange(10**9)}")
    runtime = Runtime(
        Settings(database_url=database_url), engine, session_factory(engine), remote_series=remote
    )
    mint = Minter(runtime)
    alpha, beta = mint.project("alpha"), mint.project("beta")
    token = bearer(mint.token("alpha", "member", "alice"))
    times = [T0 + timedelta(seconds=s) for s in range(0, 120, 10)]
    for project_id, value in ((alpha, 1.0), (beta, 9.0)):
        result = remote.write(project_id, [SeriesBatch(GAUGE, {"gpu": "0"}, times, [value] * 12)])
        assert not result.rejected
    if tsdb == "victoriametrics":
        flush_victoria_metrics(url)
    start, end = int(T0.timestamp()), int(T0.timestamp()) + 120
    try:
        with TestClient(create_app(runtime)) as client:
            listed = client.get("/api/v1/projects/alpha/series", headers=token)
            assert listed.status_code == 200, listed.text
            assert listed.json()["series"] == [
                {"metric": GAUGE, "labels": {"gpu": "0"}, "kind": "gauge"}
            ]
            matrix = client.get(
                "/api/v1/projects/alpha/query_range",
                headers=token,
                params={"metric": GAUGE, "start": start, "end": end, "step": "60", "agg": "sum"},
            )
            assert matrix.status_code == 200, matrix.text
            assert matrix.json()["result"] == [
                {
                    "metric": {"__name__": GAUGE, "gpu": "0"},
                    "values": [[start, "6"], [start + 60, "6"]],
                }
            ]
            bad = client.get(
                "/api/v1/projects/alpha/series", headers=token, params={"match": 'gpu=~"("'}
            )
            assert bad.status_code == 422
    finally:
        runtime.close()
