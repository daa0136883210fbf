"""``/api/v1/prices`` and ``/api/v1/projects/{p}/prices`` on both backends: who may write,
which scope a row lands in and can be deleted from, and bad input refused naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import Minter, bearer

GLOBAL = "/api/v1/prices"
PROJECT = "/api/v1/projects/lab/prices"
ROW = {"model": "NVIDIA H100*", "capacity_type": "spot", "price_per_gpu_hour": "2.10",
       "currency": "USD"}  # fmt: skip


def test_admins_set_server_wide_prices_members_their_projects(
    client: TestClient, mint: Minter
) -> None:
    mint.project("lab")
    admin = bearer(mint.admin())
    member = bearer(mint.token("lab", "member"))
    agent = bearer(mint.token("lab", "agent", "a"))

    assert client.post(GLOBAL, json=ROW, headers=member).status_code == 403
    created = client.post(GLOBAL, json=ROW, headers=admin)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["project_id"] is None and body["price_per_gpu_hour"] == 2.1
    assert body["capacity_type"] == "spot" and body["valid_from"] is None
    assert [row["id"] for row in client.get(GLOBAL, headers=admin).json()] == [body["id"]]

    assert client.post(PROJECT, json=ROW, headers=agent).status_code == 403
    own = client.post(PROJECT, json={**ROW, "valid_from": "2026-12-01T00:00:00Z"}, headers=member)
    assert own.status_code == 201, own.text
    assert own.json()["valid_from"].startswith("2026-12-01T00:00:00")
    assert [row["id"] for row in client.get(PROJECT, headers=agent).json()] == [own.json()["id"]]

    # Each route changes and deletes rows of its own scope only.
    changed = {**ROW, "price_per_gpu_hour": "2.30", "capacity_type": "reserved"}
    updated = client.put(f"{PROJECT}/{own.json()['id']}", json=changed, headers=member)
    assert updated.status_code == 200, updated.text
    assert (updated.json()["price_per_gpu_hour"], updated.json()["capacity_type"]) == (
        2.3,
        "reserved",
    )
    assert updated.json()["valid_from"] is None, "a PUT replaces every field"
    assert (
        client.put(f"{PROJECT}/{own.json()['id']}", json=changed, headers=agent).status_code == 403
    )
    assert client.put(f"{PROJECT}/{body['id']}", json=changed, headers=member).status_code == 404
    assert (
        client.put(f"{GLOBAL}/{own.json()['id']}", json=changed, headers=admin).status_code == 404
    )
    assert client.put(f"{GLOBAL}/{body['id']}", json=changed, headers=admin).status_code == 200
    bad = client.put(f"{GLOBAL}/{body['id']}", json={**changed, "currency": "$"}, headers=admin)
    assert bad.status_code == 422 and "currency" in bad.text
    assert client.delete(f"{PROJECT}/{body['id']}", headers=member).status_code == 404
    assert client.delete(f"{GLOBAL}/{own.json()['id']}", headers=admin).status_code == 404
    assert client.delete(f"{PROJECT}/{own.json()['id']}", headers=agent).status_code == 403
    assert client.delete(f"{PROJECT}/{own.json()['id']}", headers=member).status_code == 204
    assert client.delete(f"{GLOBAL}/{body['id']}", headers=admin).status_code == 204
    assert client.get(PROJECT, headers=member).json() == []
    assert client.get(GLOBAL, headers=admin).json() == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"price_per_gpu_hour": "-1"}, "price_per_gpu_hour"),
        ({"price_per_gpu_hour": "1.0000001"}, "price_per_gpu_hour"),
        ({"price_per_gpu_hour": "NaN"}, "price_per_gpu_hour"),
        ({"capacity_type": "preemptible"}, "capacity_type"),
        ({"currency": "usd"}, "currency"),
        ({"currency": "DOLLARS"}, "currency"),
        ({"model": ""}, "model"),
        ({"model": "NVIDIA * 80GB"}, "model"),
        ({"valid_from": "2026-12-01T00:00:00"}, "valid_from"),
        ({"colour": "green"}, "colour"),
    ],
)
def test_bad_rows_get_422_naming_the_field(
    client: TestClient, mint: Minter, change: dict[str, Any], field: str
) -> None:
    mint.project("lab")
    member = bearer(mint.token("lab", "member"))
    response = client.post(PROJECT, json={**ROW, **change}, headers=member)
    assert response.status_code == 422, response.text
    assert field in response.text
    assert client.get(PROJECT, headers=member).json() == [], "nothing stored"


def test_valid_from_must_be_a_whole_minute(client: TestClient, mint: Minter) -> None:
    mint.project("lab")
    member = bearer(mint.token("lab", "member"))
    row = {**ROW, "valid_from": "2026-12-01T00:00:30Z"}
    response = client.post(PROJECT, json=row, headers=member)
    assert response.status_code == 422
    assert "valid_from" in response.json()["detail"]
