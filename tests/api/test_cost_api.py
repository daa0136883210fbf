"""``/api/v1/projects/{p}/cost`` on both backends, with the known fleet's exact figures."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import Minter, bearer
from tests.dashboards import known_data as kd
from tuneloop.runtime import Runtime


def iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def figures(body: dict[str, Any]) -> dict[str | None, tuple[int, float, float, float]]:
    return {
        group["key"]: (
            group["gpus"],
            round(group["gpu_hours"], 9),
            round(group["idle_gpu_hours"], 9),
            round(group["energy_kwh"], 9),
        )
        for group in body["groups"]
    }


def test_cost_per_team_job_gpu_and_project(
    client: TestClient, runtime: Runtime, mint: Minter
) -> None:
    kd.fill(runtime.engine)
    headers = bearer(mint.token(kd.PROJECT, "member"))
    url = f"/api/v1/projects/{kd.PROJECT}/cost"
    whole = {"start": iso(kd.T0), "end": iso(kd.END)}

    response = client.get(url, params=whole, headers=headers)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["by"] == "team" and body["idle_below_percent"] == 5.0
    # Hour 0 from 1-minute rollups, hours 1-2 from raw samples; a counter reset at 90 min.
    assert figures(body) == {
        "nlp": (2, 6.0, 0.0, 1.8),
        None: (2, 6.0, 1.0, 1.8),
        "vision": (1, 3.0, 0.0, 0.9),
    }
    assert list(figures(body)) == ["nlp", None, "vision"]
    assert body["total"] == {
        "key": "project",
        "gpus": 5,
        "gpu_hours": 15.0,
        "idle_gpu_hours": 1.0,
        "energy_kwh": pytest.approx(4.5),
        "cost": None,  # no prices: unknown, never 0
        "idle_cost": None,
        "unpriced_gpus": 5,
    }
    assert body["currency"] is None and len(body["unpriced"]) == 5

    by_job = client.get(url, params={**whole, "by": "job"}, headers=headers).json()
    assert figures(by_job) == {
        "llama": (2, 6.0, 0.0, 1.8),
        None: (2, 6.0, 1.0, 1.8),
        "bert": (1, 3.0, 0.0, 0.9),
    }
    by_gpu = client.get(url, params={**whole, "by": "gpu"}, headers=headers).json()
    assert len(by_gpu["groups"]) == 5
    assert any(group["key"].startswith(kd.HOSTILE) for group in by_gpu["groups"])

    # The last hour only: past both rollup watermarks, and after the counter reset.
    last_hour = {"start": iso(kd.T0 + timedelta(hours=2)), "end": iso(kd.END), "by": "project"}
    body = client.get(url, params=last_hour, headers=headers).json()
    assert figures(body) == {"project": (5, 5.0, 1.0, 1.5)}
    # Half an hour around the reset, not aligned to rollup buckets' hours.
    around = {"start": iso(kd.at(75)), "end": iso(kd.at(105)), "by": "job"}
    assert figures(client.get(url, params=around, headers=headers).json())["llama"] == (
        2,
        1.0,
        0.0,
        0.3,
    )
    # Nothing is below 0 %; everything is below 100 %.
    nothing = client.get(url, params={**whole, "idle_below": 0}, headers=headers).json()
    assert nothing["total"]["idle_gpu_hours"] == 0.0
    everything = client.get(url, params={**whole, "idle_below": 100}, headers=headers).json()
    assert everything["total"]["idle_gpu_hours"] == 15.0
    # Before the fleet existed.
    empty = {"start": iso(kd.T0 - timedelta(days=2)), "end": iso(kd.T0 - timedelta(days=1))}
    body = client.get(url, params=empty, headers=headers).json()
    assert body["groups"] == [] and body["total"]["gpus"] == 0


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        ({"start": "2026-11-16T01:00:00Z", "end": "2026-11-16T00:00:00Z"}, "after start"),
        ({"start": "2025-01-01T00:00:00Z", "end": "2026-11-16T00:00:00Z"}, "at most 400"),
        ({"start": "yesterday", "end": "2026-11-16T00:00:00Z"}, "RFC 3339"),
        ({"start": "0", "end": "60", "by": "planet"}, "by"),
        ({"start": "0", "end": "60", "idle_below": "101"}, "idle_below"),
    ],
)
def test_bad_parameters_get_422(
    client: TestClient, mint: Minter, params: dict[str, str], reason: str
) -> None:
    mint.project("solo")
    response = client.get(
        "/api/v1/projects/solo/cost", params=params, headers=bearer(mint.token("solo"))
    )
    assert response.status_code == 422
    assert reason in response.text


def test_other_projects_cost_is_not_found(client: TestClient, mint: Minter) -> None:
    mint.project("mine")
    mint.project("theirs")
    params = {"start": "0", "end": "60"}
    headers = bearer(mint.token("mine"))
    assert (
        client.get("/api/v1/projects/theirs/cost", params=params, headers=headers).status_code
        == 404
    )
    assert client.get("/api/v1/projects/mine/cost", params=params).status_code == 401
    assert (
        client.get("/api/v1/projects/mine/cost", params=params, headers=headers).status_code == 200
    )
