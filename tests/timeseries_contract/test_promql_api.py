"""The PromQL query API answers from a Prometheus-compatible TSDB when the runtime has one:
the engine reads raw samples through the contract, each project only its own."""

from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path
from typing import Any

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
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind

GAUGE = "DCGM_FI_DEV_GPU_UTIL"
COUNTER = "tuneloop_tokens_total"


def _data(response: Any) -> Any:
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", body
    return body["data"]


@pytest.mark.parametrize("tsdb", ["victoriametrics", "prometheus"])
def test_promql_routes_read_the_tsdb_each_project_its_own(
    tsdb: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url: str = request.getfixturevalue(
        "victoria_metrics_url" if tsdb == "victoriametrics" else "prometheus_url"
    )
    database_url = f"sqlite:///{tmp_path / 'tuneloop.db'}"
    engine = make_engine(database_url)
    metadata.create_all(engine)
    remote = PrometheusBackend(url, project_label=f"p{random.randrange(10**9)}")
    runtime = Runtime(
        Settings(database_url=database_url), engine, session_factory(engine), remote_series=remote
    )
    mint = Minter(runtime)
    alpha, beta = mint.project("alpha"), mint.project("beta")
    alice = bearer(mint.token("alpha", "member", "alice"))
    bob = bearer(mint.token("beta", "member", "bob"))
    times = [T0 + timedelta(seconds=s) for s in range(0, 120, 10)]
    for project_id, value, gpus in ((alpha, 1.0, ("0", "1")), (beta, 9.0, ("0", "7"))):
        batches = [SeriesBatch(GAUGE, {"gpu": gpu}, times, [value] * 12) for gpu in gpus]
        batches.append(
            SeriesBatch(COUNTER, {}, times, [value * i for i in range(12)], SeriesKind.COUNTER)
        )
        assert not remote.write(project_id, batches).rejected
    if tsdb == "victoriametrics":
        flush_victoria_metrics(url)
    at = int(T0.timestamp()) + 110
    try:
        with TestClient(create_app(runtime)) as client:

            def query(token: dict[str, str], text: str) -> Any:
                params = {"query": text, "time": str(at)}
                return _data(client.get("/api/v1/query", params=params, headers=token))

            mine = query(alice, f"sum by (gpu) ({GAUGE})")
            assert [(r["metric"], r["value"]) for r in mine["result"]] == [
                ({"gpu": "0"}, [at, "1"]),
                ({"gpu": "1"}, [at, "1"]),
            ]
            theirs = query(bob, f"sum({GAUGE})")["result"]
            assert [r["value"] for r in theirs] == [[at, "18"]]
            # A matcher on the project label narrows; it never reaches another project.
            sneaky = query(alice, f'{GAUGE}{{{remote.project_label}="{beta}"}}')
            assert sneaky["result"] == []
            # 11 increments of 1; extrapolation stops where the counter would reach zero.
            increase = query(alice, f"increase({COUNTER}[2m])")["result"]
            assert len(increase) == 1 and float(increase[0]["value"][1]) == 11
            raw = query(alice, f'{GAUGE}{{gpu="0"}}[30s]')
            assert raw["resultType"] == "matrix"
            assert [v for _, v in raw["result"][0]["values"]] == ["1", "1", "1"]
            ranged = _data(
                client.get(
                    "/api/v1/query_range",
                    params={"query": f"count({GAUGE})", "start": at - 60, "end": at, "step": "60"},
                    headers=bob,
                )
            )
            assert ranged["result"] == [{"metric": {}, "values": [[at - 60, "2"], [at, "2"]]}]
            span = {"start": str(at - 300), "end": str(at)}
            series = _data(
                client.get("/api/v1/series", params={"match[]": GAUGE, **span}, headers=alice)
            )
            assert sorted(s["gpu"] for s in series) == ["0", "1"]
            values = client.get("/api/v1/label/gpu/values", params=span, headers=bob)
            assert _data(values) == ["0", "7"]
            names = _data(client.get("/api/v1/labels", params=span, headers=alice))
            assert names == ["__name__", "gpu"]
            meta = _data(client.get("/api/v1/metadata", headers=alice))
            assert meta[COUNTER][0]["type"] == "counter" and meta[GAUGE][0]["type"] == "gauge"
    finally:
        runtime.close()
