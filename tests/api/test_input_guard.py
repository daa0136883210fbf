"""Input the store cannot hold is a 422, never a 500, on SQLite and PostgreSQL: NUL
characters and lone surrogates anywhere, NaN and infinities in JSON bodies, integers past their
column, job references in digits that are not ASCII."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from httpx import Response

from tests.api.conftest import Minter, bearer

JOBS = "/api/v1/projects/alpha/jobs"


@pytest.fixture
def member(mint: Minter, client: TestClient) -> dict[str, str]:
    mint.project("alpha")
    headers = bearer(mint.token("alpha", "member"))
    assert client.post(JOBS, json={"name": "trainer"}, headers=headers).status_code == 201
    return headers


def _refused(response: Response, where: str) -> None:
    body = response.json()
    assert response.status_code == 422, body
    assert body["code"] == "validation_error"
    assert body["detail"][0]["loc"][0] == where


def test_nul_in_the_path_query_or_body_is_refused(
    client: TestClient, member: dict[str, str]
) -> None:
    _refused(client.get(f"{JOBS}/train%00er", headers=member), "path")
    series = "/api/v1/projects/alpha/series"
    _refused(client.get(series, params={"match": 'gpu="0\x00"'}, headers=member), "query")
    config = {"config": {"optimizer": "ad\x00am"}}
    _refused(client.put(f"{JOBS}/trainer/config", json=config, headers=member), "body")


@pytest.mark.parametrize("text", ['"\\ud800"', '"a\\udfffb"'])
def test_lone_surrogates_in_a_body_are_refused(
    client: TestClient, member: dict[str, str], text: str
) -> None:
    body = f'{{"config": {{"optimizer": {text}}}}}'.encode()
    response = client.put(
        f"{JOBS}/trainer/config",
        content=body,
        headers={**member, "Content-Type": "application/json"},
    )
    _refused(response, "body")


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_numbers_in_a_body_are_refused(
    client: TestClient, member: dict[str, str], number: str
) -> None:
    response = client.put(
        f"{JOBS}/trainer/config",
        content=f'{{"config": {{"lr": {number}}}}}'.encode(),
        headers={**member, "Content-Type": "application/json"},
    )
    _refused(response, "body")


def test_a_body_without_a_content_type_is_checked_too(
    client: TestClient, member: dict[str, str]
) -> None:
    response = client.put(
        f"{JOBS}/trainer/config", content=b'{"config": {"lr": NaN}}', headers=member
    )
    _refused(response, "body")


def test_integers_past_their_column_are_refused(
    client: TestClient, member: dict[str, str], mint: Minter
) -> None:
    admin = bearer(mint.admin())
    assert client.get(JOBS, params={"offset": 2**63}, headers=member).status_code == 422
    assert client.delete(f"/api/v1/tokens/{2**31}", headers=admin).status_code == 422
    assert client.delete(f"/api/v1/tokens/{2**31 - 1}", headers=admin).status_code == 404
    ack = {"agent_id": 2**31, "version": 1}
    assert client.post(f"{JOBS}/trainer/config/ack", json=ack, headers=member).status_code == 422


@pytest.mark.parametrize("ref", ["²", "١٢", "9" * 30, str(2**31)])
def test_job_references_in_other_digits_or_too_long_are_not_found(
    client: TestClient, member: dict[str, str], ref: str
) -> None:
    assert client.get(f"{JOBS}/{ref}", headers=member).status_code == 404
