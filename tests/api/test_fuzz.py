"""Every operation of the OpenAPI schema, fuzzed with schemathesis: no request may get a server
error, with a member's token or an admin's, on SQLite and on PostgreSQL.

Bounded to run in a couple of minutes: a few examples per operation, data that fits the schema
and data that does not. Half the cases are aimed at the token's project and a job that exists,
so fuzzed bodies and ids reach the store rather than stopping at the project lookup. Every
operation is run and each one's first server error reported, not only the first of the run.
"""

from __future__ import annotations

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation.case import Case
from schemathesis.generation.modes import GenerationMode

from api.main import create_app
from tests.api.conftest import Minter, bearer
from tuneloop.runtime import Runtime

PROJECT = "fuzz"
JOB = "trainer"
EXAMPLES_PER_MODE = 6


@schemathesis.serializer("application/x-protobuf")
def _binary(ctx: object, value: object) -> bytes:
    """Binary bodies (Prometheus remote write) sent as generated: bytes, or a value's text."""
    return value if isinstance(value, bytes) else str(value).encode()


@pytest.fixture(params=["member", "admin"])
def secret(request: pytest.FixtureRequest, mint: Minter) -> str:
    mint.project(PROJECT)
    if request.param == "admin":
        return mint.admin()
    return mint.token(PROJECT, "member")


def _aim(case: Case, own_token_id: int) -> None:
    """Half the cases on the token's project and job, so they get past the lookups; never a
    revocation of the fuzzing token itself, which would leave only 401s to see; long-polls
    kept short."""
    query = case.query or {}
    if isinstance(query.get("timeout"), int | float) and query["timeout"] > 1:
        query["timeout"] = 1  # a long-poll waits as long as asked: not a server error
    params = case.path_parameters or {}
    if params.get("token_id") == own_token_id:
        params["token_id"] = own_token_id + 1_000
    if "project" in params and len(str(params["project"])) % 2 == 0:
        params["project"] = PROJECT
        if "job" in params and len(str(params["job"])) % 2 == 0:
            params["job"] = JOB


def _first_server_error(
    operation: schemathesis.APIOperation, mode: GenerationMode, secret: str, own_token_id: int
) -> str | None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES_PER_MODE,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def call(case: Case) -> None:
        _aim(case, own_token_id)
        response = case.call(headers=bearer(secret))
        assert response.status_code < 500, (
            f"{response.status_code}: {response.text[:300]}\n{case.as_curl_command()}"
        )

    try:
        call()
    except Unsatisfiable:
        return None  # nothing to get wrong (no parameters or body): only fitting requests
    except Exception as exc:  # a server exception is a finding too, not the end of the run
        return f"{operation.method.upper()} {operation.path} ({mode}): {exc!r}"[:2000]
    return None


def test_no_operation_answers_a_server_error(runtime: Runtime, secret: str) -> None:
    app = create_app(runtime)
    with TestClient(app) as client:
        created = client.post(
            f"/api/v1/projects/{PROJECT}/jobs", json={"name": JOB}, headers=bearer(secret)
        )
        assert created.status_code == 201
        own_token_id = client.get("/api/v1/tokens/self", headers=bearer(secret)).json()["id"]
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        found = [
            error
            for result in schema.get_all_operations()
            for mode in GenerationMode
            if (error := _first_server_error(result.ok(), mode, secret, own_token_id))
        ]
    assert found == [], "\n\n".join(found)
