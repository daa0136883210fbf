"""Money in ``/api/v1/projects/{p}/cost`` on both backends: prices change the figures as the
price table says (on demand vs spot, a project's override, a MIG instance's share, a price
coming into force inside the period, a GPU with no price)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.api import price_fleet as fleet
from tests.api.conftest import Minter, bearer
from tuneloop.runtime import Runtime

URL = "/api/v1/projects/priced/cost"
WHOLE = {"start": "2026-11-25T09:00:00Z", "end": "2026-11-25T10:00:00Z"}


def money(body: dict[str, Any]) -> dict[str | None, tuple[float | None, float | None, int]]:
    return {
        group["key"]: (group["cost"], group["idle_cost"], group["unpriced_gpus"])
        for group in body["groups"]
    }


def setup(client: TestClient, runtime: Runtime, mint: Minter) -> tuple[dict[str, str], ...]:
    fleet.fill(runtime.engine, mint.project("priced"))
    admin = bearer(mint.admin())
    member = bearer(mint.token("priced", "member"))
    for row in fleet.GLOBAL_PRICES:
        assert client.post("/api/v1/prices", json=row, headers=admin).status_code == 201
    return admin, member


def report(client: TestClient, headers: dict[str, str], by: str) -> dict[str, Any]:
    response = client.get(URL, params={**WHOLE, "by": by}, headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_on_demand_spot_mig_share_and_unpriced(
    client: TestClient, runtime: Runtime, mint: Minter
) -> None:
    _, member = setup(client, runtime, mint)

    by_gpu = report(client, member, "gpu")
    assert by_gpu["currency"] == "USD"
    assert money(by_gpu) == {
        "node-1/0/GPU-od": (4.0, 0.0, 0),  # an hour on demand
        "node-1/1/GPU-spot": (1.5, 1.5, 0),  # an idle hour on spot
        "node-1/3/GPU-mig/3g.40gb/1": (1.5, 0.0, 0),  # half the A100's 3.00
        "node-1/3/GPU-mig/3g.40gb/2": (1.5, 1.5, 0),
        "node-1/2/GPU-l4": (None, None, 1),  # no price: unknown, not 0
    }
    assert by_gpu["unpriced"] == [
        {"gpu": "node-1/2/GPU-l4", "model": "NVIDIA L4", "capacity_type": "on_demand"}
    ]

    by_team = report(client, member, "team")
    assert money(by_team) == {
        "nlp": (7.0, 1.5, 0),
        "vision": (1.5, 1.5, 0),
        "infer": (None, None, 1),
    }
    total = by_team["total"]
    assert (total["cost"], total["idle_cost"], total["unpriced_gpus"]) == (None, None, 1)
    assert (total["gpu_hours"], total["idle_gpu_hours"]) == (5.0, 2.0), "GPU time unchanged"


def test_project_rows_override_and_prices_change_inside_the_period(
    client: TestClient, runtime: Runtime, mint: Minter
) -> None:
    _, member = setup(client, runtime, mint)
    project_url = "/api/v1/projects/priced/prices"
    rows = [
        # An exact model of the project's beats the server-wide prefix.
        {"model": fleet.H100, "price_per_gpu_hour": "5.00", "currency": "USD"},
        # Spot doubles half way through the hour.
        {"model": "NVIDIA H100*", "capacity_type": "spot", "price_per_gpu_hour": "3.00",
         "currency": "USD", "valid_from": "2026-11-25T09:30:00Z"},
        # Any model on demand: the project's row, so it beats even an exact server-wide one.
        {"model": "*", "price_per_gpu_hour": "1.00", "currency": "USD"},
    ]  # fmt: skip
    for row in rows:
        created = client.post(project_url, json=row, headers=member)
        assert created.status_code == 201, created.text

    by_gpu = report(client, member, "gpu")
    assert money(by_gpu) == {
        "node-1/0/GPU-od": (5.0, 0.0, 0),
        "node-1/1/GPU-spot": (2.25, 2.25, 0),  # 30 min at 1.50, then at 3.00 (the global row)
        "node-1/3/GPU-mig/3g.40gb/1": (0.5, 0.0, 0),  # half of the project's 1.00
        "node-1/3/GPU-mig/3g.40gb/2": (0.5, 0.5, 0),
        "node-1/2/GPU-l4": (1.0, 0.0, 0),
    }
    body = report(client, member, "project")
    assert body["unpriced"] == []
    assert (body["total"]["cost"], body["total"]["idle_cost"]) == (9.25, 2.75)
    assert [item["model"] for item in client.get(project_url, headers=member).json()] == [
        fleet.H100,
        "NVIDIA H100*",
        "*",
    ]

    # Another project sees only the server-wide prices.
    mint.project("other")
    other = client.get("/api/v1/projects/other/prices", headers=bearer(mint.token("other")))
    assert other.json() == []

    # A second currency cannot be added up with the first.
    euro = {"model": "NVIDIA L4", "price_per_gpu_hour": "0.80", "currency": "EUR"}
    assert client.post(project_url, json=euro, headers=member).status_code == 201
    mixed = client.get(URL, params=WHOLE, headers=member)
    assert mixed.status_code == 409
    assert "EUR and USD" in mixed.json()["detail"]
