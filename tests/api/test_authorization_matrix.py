"""An authorization matrix over every route of the app, on real SQLite and PostgreSQL.

Two projects, alpha and beta, each with a member and an agent token, and a server-wide admin.
Every operation whose path names a project's object is called with real objects of beta (a
job, by name and by id, a study and its trial, an alert rule, a silence, a receiver, an
inhibition, an autoscaler, a token):

- with alpha's tokens the answer is 403 or 404, never beta's data;
- with beta's tokens each role gets what the code grants it (``authz_routes.ROLE_NEEDED``).

The routes are listed from the app itself, so a route added without a fixture value for its
path parameters, or without a role in the table, fails :func:`test_the_matrix_covers_every_route`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from httpx import Response

from api.main import create_app
from tests.api import authz_routes as routes
from tests.api.authz_routes import RANK, ROLE_NEEDED, Operation, Role
from tests.api.conftest import Minter, bearer
from tests.tuner import jobsim
from tuneloop.runtime import Runtime
from tuneloop.storage.types import utcnow

MARKER = "beta-private-7f3a9c"
"""Text only beta's objects hold (labels, annotations, comments, a token name): never in an
answer to alpha."""

BETA = "/api/v1/projects/beta"

UNSCOPED: dict[Operation, str] = {
    ("GET", "/healthz"): "receiver details only for their project's tokens",
    ("GET", "/metrics"): "receiver details only for their project's tokens",
    ("POST", "/api/v1/projects"): "admin only",
    ("GET", "/api/v1/projects"): "lists the token's own project",
    ("POST", "/api/v1/tokens"): "admin only",
    ("GET", "/api/v1/tokens"): "admin only",
    ("GET", "/api/v1/tokens/self"): "the caller's own token",
    ("POST", "/v1/metrics"): "writes to the token's project, named by no parameter",
    ("POST", "/v1/traces"): "writes to the token's project, named by no parameter",
    ("POST", "/api/v1/write"): "writes to the token's project, named by no parameter",
    **{
        (method, f"/api/v1/{path}"): "Prometheus' API: reads the token's project, named by no "
        "parameter (tests/promql/test_api.py)"
        for method in ("GET", "POST")
        for path in ("query", "query_range", "series", "labels")
    },
    ("GET", "/api/v1/label/{name}/values"): "Prometheus' API: reads the token's project",
    ("GET", "/api/v1/metadata"): "Prometheus' API: reads the token's project",
    ("GET", "/api/v1/status/buildinfo"): "the version, nothing of any project",
    ("GET", "/api/v1/query_exemplars"): "always empty: nothing of any project",
    ("POST", "/api/v1/query_exemplars"): "always empty: nothing of any project",
    ("GET", "/api/v1/rules"): "always empty: nothing of any project",
    ("POST", "/api/v1/prices"): "admin only: server-wide prices",
    ("GET", "/api/v1/prices"): "admin only: server-wide prices",
}
"""Operations whose path names no object, and why they cannot reach another project."""


@dataclass
class World:
    alpha: dict[str, dict[str, str]]
    """alpha's tokens (headers) by role: the outsiders."""
    beta: dict[Role, dict[str, str]]
    """beta's agent and member tokens, and the server-wide admin."""
    values: dict[str, tuple[str, ...]]
    """Each path slot (``collection/{param}``) and the beta objects that fill it."""


def _created(response: Response, code: int = 201) -> Any:
    assert response.status_code == code, response.text
    return response.json()


@pytest.fixture
def world(client: TestClient, mint: Minter, runtime: Runtime) -> World:
    mint.project("alpha")
    beta_id = mint.project("beta")
    admin = bearer(mint.admin())
    member = bearer(mint.token("beta", "member", "beta-member"))
    agent = bearer(mint.token("beta", "agent", MARKER))
    alpha = {
        "member": bearer(mint.token("alpha", "member", "alpha-member")),
        "agent": bearer(mint.token("alpha", "agent", "alpha-agent")),
    }

    job = _created(
        client.post(
            f"{BETA}/jobs", json={"name": "train", "labels": {"owner": MARKER}}, headers=member
        )
    )
    now = utcnow()
    # Step timings in the store: a study needs them to start from.
    jobsim.write_steps(
        runtime.engine, beta_id, "train", start=now - timedelta(seconds=30), end=now,
        per_rank=100.0, ranks=2,
    )  # fmt: skip
    job_url = f"{BETA}/jobs/train"
    _created(client.post(f"{job_url}/agents", json=routes.agent_body(), headers=agent))
    _created(client.post(f"{job_url}/studies", json=routes.study_body("tune"), headers=member))
    trial = _created(client.post(f"{job_url}/studies/tune/ask", headers=agent))
    told = {"state": "complete", "value": 800.0}
    tell_url = f"{job_url}/studies/tune/trials/{trial['number']}/tell"
    _created(client.post(tell_url, json=told, headers=agent), 200)

    rule = routes.rule_body("BetaHot", MARKER)
    _created(client.post(f"{BETA}/alerts/rules", json=rule, headers=member))
    silence = _created(
        client.post(
            f"{BETA}/alerts/silences",
            json={"matchers": ['alertname="BetaHot"'], "duration": "2h", "comment": MARKER},
            headers=member,
        )
    )
    receiver = routes.receiver_body("pager", MARKER)
    _created(client.post(f"{BETA}/alerts/receivers", json=receiver, headers=admin))
    inhibition = _created(
        client.post(
            f"{BETA}/alerts/inhibitions",
            json={"source": ['alertname="BetaDown"'], "target": ['gpu=~".+"']},
            headers=member,
        )
    )
    autoscaler = routes.autoscaler_body("scaler", MARKER)
    _created(client.post(f"{BETA}/autoscalers", json=autoscaler, headers=admin))
    agent_token = _created(client.get("/api/v1/tokens/self", headers=agent), 200)
    price = _created(client.post(f"{BETA}/prices", json=routes.price_body(), headers=member))

    values: dict[str, tuple[str, ...]] = {
        "projects/{project}": ("beta",),
        "jobs/{job}": ("train", str(job["id"])),  # a job is named by name or by id
        "studies/{study}": ("tune",),
        "trials/{number}": (str(trial["number"]),),
        "autoscalers/{name}": ("scaler",),
        "rules/{rule}": ("BetaHot",),
        "silences/{silence_id}": (str(silence["id"]),),
        "receivers/{name}": ("pager",),
        "inhibitions/{inhibition_id}": (str(inhibition["id"]),),
        "tokens/{token_id}": (str(agent_token["id"]),),
        "prices/{price_id}": (str(price["id"]),),
    }
    assert values.keys() == routes.PATH_SLOTS.keys()
    beta: dict[Role, dict[str, str]] = {"agent": agent, "member": member, "admin": admin}
    return World(alpha=alpha, beta=beta, values=values)


def filled(path: str, values: dict[str, tuple[str, ...]]) -> list[str]:
    """``path`` with its parameters replaced by beta's objects: every combination."""
    choices = []
    for slot in routes.slots(path):
        if slot not in values:
            pytest.fail(f"{path}: no fixture value for {slot}; add a beta object to the matrix")
        choices.append(values[slot])
    paths = []
    for combination in itertools.product(*choices):
        parts = iter(combination)
        paths.append(routes.SLOT.sub(lambda m: f"{m.group(1)}/{next(parts)}", path))
    return paths


def call(client: TestClient, operation: Operation, path: str, headers: dict[str, str]) -> Response:
    method = operation[0]
    body = routes.bodies(MARKER).get(operation)
    response: Response = client.request(
        method, path, params=routes.QUERIES.get(operation), json=body, headers=headers
    )
    return response


def scoped_operations(client: TestClient) -> list[Operation]:
    app = client.app
    assert isinstance(app, FastAPI)
    operations = routes.app_operations(app)
    return sorted(op for op in operations if routes.has_path_parameters(op[1]))


# --------------------------------------------------------------------------- completeness


def test_the_matrix_covers_every_route() -> None:
    app = create_app()
    operations = routes.app_operations(app)
    assert operations == routes.schema_operations(app), "a route is hidden from the listing"
    scoped = {op for op in operations if routes.has_path_parameters(op[1])}
    assert scoped - ROLE_NEEDED.keys() == set(), "give each new route its role in ROLE_NEEDED"
    assert ROLE_NEEDED.keys() - scoped == set(), "ROLE_NEEDED names a route the app lacks"
    assert operations - scoped == UNSCOPED.keys(), "say in UNSCOPED why a new route is safe"
    unknown = {slot for _, path in scoped for slot in routes.slots(path)} - routes.PATH_SLOTS.keys()
    assert unknown == set(), f"path parameters without a beta object in the fixture: {unknown}"
    unfilled = [path for _, path in scoped if path.count("{") != len(routes.slots(path))]
    assert unfilled == [], "a path parameter that follows no collection name"


# --------------------------------------------------------------------------- across projects


def test_another_projects_tokens_reach_nothing(client: TestClient, world: World) -> None:
    found = []
    for operation in scoped_operations(client):
        for path in filled(operation[1], world.values):
            for role, headers in world.alpha.items():
                response = call(client, operation, path, headers)
                if response.status_code not in (403, 404) or MARKER in response.text:
                    found.append(f"alpha {role}: {operation[0]} {path} -> {response.status_code}")
    assert found == [], "\n".join(found)
    # Nothing of beta's was changed or removed by those requests, and every object is real
    # (a 404 above is not just a missing fixture).
    assert _beta_reads(client, world, "admin") == []


def test_unscoped_routes_show_nothing_of_another_project(client: TestClient, world: World) -> None:
    for role, headers in world.alpha.items():
        projects = client.get("/api/v1/projects", headers=headers)
        assert [p["name"] for p in projects.json()["items"]] == ["alpha"], role
        assert client.get("/api/v1/tokens", headers=headers).status_code == 403
        assert client.post("/api/v1/tokens", json={"name": "x"}, headers=headers).status_code == 403
        assert client.get("/api/v1/prices", headers=headers).status_code == 403
        price = routes.price_body()
        assert client.post("/api/v1/prices", json=price, headers=headers).status_code == 403
        created = client.post("/api/v1/projects", json={"name": "gamma"}, headers=headers)
        assert created.status_code == 403
        assert (
            client.get("/api/v1/tokens/self", headers=headers).json()["project_id"]
            != (
                client.get("/api/v1/tokens/self", headers=world.beta["member"]).json()["project_id"]
            )
        )
        for path in ("/healthz", "/metrics"):
            answer = client.get(path, headers=headers)
            assert answer.status_code == 200 and MARKER not in answer.text, (role, path)
            assert "pager" not in answer.text, "beta's receiver is named only to beta"


# --------------------------------------------------------------------------- roles in a project


def test_each_role_gets_what_the_code_grants(client: TestClient, world: World) -> None:
    found = []
    for operation in scoped_operations(client):
        needed = ROLE_NEEDED[operation]
        for role, headers in world.beta.items():
            if RANK[role] >= RANK[needed]:
                continue  # allowed reads are checked below; allowed writes in their own tests
            for path in filled(operation[1], world.values):
                response = call(client, operation, path, headers)
                if response.status_code != 403:
                    found.append(f"beta {role}: {operation[0]} {path} -> {response.status_code}")
    assert found == [], "\n".join(found)
    for role in world.beta:
        assert _beta_reads(client, world, role) == [], role


def _beta_reads(client: TestClient, world: World, role: Role) -> list[str]:
    """Every read beta's ``role`` token is allowed, answered: the problems found."""
    problems = []
    for operation in scoped_operations(client):
        if operation[0] != "GET" or RANK[role] < RANK[ROLE_NEEDED[operation]]:
            continue
        for path in filled(operation[1], world.values):
            response = call(client, operation, path, world.beta[role])
            # The long-poll answers 204 when nothing newer than ``after`` was released.
            if response.status_code not in (200, 204):
                problems.append(f"beta {role}: GET {path} -> {response.status_code}")
    return problems
