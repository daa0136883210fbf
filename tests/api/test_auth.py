"""Bearer authentication, roles and project isolation, on real SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from tests.api.conftest import Minter, bearer
from tuneloop import accounts
from tuneloop.runtime import Runtime
from tuneloop.storage import session_scope
from tuneloop.storage.models import ApiToken, AuditEntry, Project
from tuneloop.storage.types import utcnow


@pytest.fixture
def two_projects(mint: Minter) -> dict[str, str]:
    """Projects ``alpha`` and ``beta``, each with a member and an agent, plus an admin."""
    mint.project("alpha")
    mint.project("beta")
    return {
        "admin": mint.admin(),
        "alpha_member": mint.token("alpha", "member", "alice"),
        "alpha_agent": mint.token("alpha", "agent", "alpha-agent"),
        "beta_member": mint.token("beta", "member", "bob"),
    }


def assert_unauthorized(response_status: int, body: dict[str, object], header: str | None) -> None:
    assert response_status == 401
    assert header == "Bearer"
    assert body["code"] == "unauthorized"
    assert isinstance(body["detail"], str)


# --------------------------------------------------------------------------- 401


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer tl_not-a-real-token"},
        {"Authorization": "Bearer garbage"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer ' OR 1=1 --"},
    ],
    ids=["none", "empty", "unknown", "garbage", "basic", "sql"],
)
def test_requests_without_a_valid_token_get_401(
    client: TestClient, two_projects: dict[str, str], headers: dict[str, str]
) -> None:
    for path in ("/api/v1/projects", "/api/v1/projects/alpha/jobs", "/api/v1/tokens/self"):
        response = client.get(path, headers=headers)
        assert_unauthorized(
            response.status_code, response.json(), response.headers.get("www-authenticate")
        )


def test_revoked_token_gets_401(client: TestClient, two_projects: dict[str, str]) -> None:
    secret = two_projects["alpha_agent"]
    me = client.get("/api/v1/tokens/self", headers=bearer(secret))
    assert me.status_code == 200
    revoked = client.delete(
        f"/api/v1/tokens/{me.json()['id']}", headers=bearer(two_projects["alpha_member"])
    )
    assert revoked.status_code == 204
    response = client.get("/api/v1/projects/alpha/jobs", headers=bearer(secret))
    assert_unauthorized(
        response.status_code, response.json(), response.headers.get("www-authenticate")
    )
    # Revoking again is a no-op that still succeeds.
    again = client.delete(
        f"/api/v1/tokens/{me.json()['id']}", headers=bearer(two_projects["alpha_member"])
    )
    assert again.status_code == 204


def test_expired_token_gets_401(client: TestClient, runtime: Runtime, mint: Minter) -> None:
    mint.project("alpha")
    with session_scope(runtime.sessions) as session:
        project = accounts.get_project_by_name(session, "alpha")
        token, secret = accounts.create_token(
            session, project, "short", "member", expires_at=utcnow() + timedelta(hours=1)
        )
    assert client.get("/api/v1/projects/alpha", headers=bearer(secret)).status_code == 200
    with session_scope(runtime.sessions) as session:
        stored = session.get(ApiToken, token.id)
        assert stored is not None
        stored.expires_at = utcnow() - timedelta(seconds=1)
    assert client.get("/api/v1/projects/alpha", headers=bearer(secret)).status_code == 401


def test_last_used_at_is_recorded(client: TestClient, two_projects: dict[str, str]) -> None:
    first = client.get("/api/v1/tokens/self", headers=bearer(two_projects["alpha_member"]))
    assert first.status_code == 200
    second = client.get("/api/v1/tokens/self", headers=bearer(two_projects["alpha_member"]))
    used = second.json()["last_used_at"]
    assert used is not None
    # Within the minute, the second request does not write it again.
    third = client.get("/api/v1/tokens/self", headers=bearer(two_projects["alpha_member"]))
    assert third.json()["last_used_at"] == used


# --------------------------------------------------------------------------- isolation


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/api/v1/projects/alpha", None),
        ("GET", "/api/v1/projects/alpha/jobs", None),
        ("POST", "/api/v1/projects/alpha/jobs", {"name": "sneaky"}),
        ("GET", "/api/v1/projects/alpha/jobs/train", None),
        ("PATCH", "/api/v1/projects/alpha/jobs/train", {"status": "failed"}),
        ("PUT", "/api/v1/projects/alpha/jobs/train/config", {"config": {"lr": 1}}),
        ("GET", "/api/v1/projects/alpha/jobs/train/config", None),
        ("GET", "/api/v1/projects/alpha/tokens", None),
        ("POST", "/api/v1/projects/alpha/tokens", {"name": "x", "role": "agent"}),
    ],
)
def test_another_projects_token_gets_404_like_a_missing_project(
    client: TestClient,
    two_projects: dict[str, str],
    method: str,
    path: str,
    body: dict[str, object] | None,
) -> None:
    created = client.post(
        "/api/v1/projects/alpha/jobs",
        json={"name": "train"},
        headers=bearer(two_projects["alpha_member"]),
    )
    assert created.status_code == 201
    foreign = client.request(method, path, json=body, headers=bearer(two_projects["beta_member"]))
    missing = client.request(
        method,
        path.replace("/alpha", "/gamma"),
        json=body,
        headers=bearer(two_projects["beta_member"]),
    )
    assert foreign.status_code == 404
    assert missing.status_code == 404
    assert foreign.json()["code"] == missing.json()["code"] == "not_found"
    # The owner still reaches it, and nothing was changed by the foreign requests.
    own = client.get("/api/v1/projects/alpha/jobs/train", headers=bearer(two_projects["admin"]))
    assert own.json()["status"] == "pending"
    assert [
        job["name"]
        for job in client.get(
            "/api/v1/projects/alpha/jobs", headers=bearer(two_projects["alpha_member"])
        ).json()["items"]
    ] == ["train"]


def test_job_ids_of_another_project_are_not_reachable(
    client: TestClient, two_projects: dict[str, str]
) -> None:
    beta_job = client.post(
        "/api/v1/projects/beta/jobs",
        json={"name": "b"},
        headers=bearer(two_projects["beta_member"]),
    ).json()
    response = client.get(
        f"/api/v1/projects/alpha/jobs/{beta_job['id']}",
        headers=bearer(two_projects["alpha_member"]),
    )
    assert response.status_code == 404


def test_tokens_of_other_projects_cannot_be_revoked(
    client: TestClient, two_projects: dict[str, str]
) -> None:
    beta = client.get("/api/v1/tokens/self", headers=bearer(two_projects["beta_member"])).json()
    admin = client.get("/api/v1/tokens/self", headers=bearer(two_projects["admin"])).json()
    for token_id in (beta["id"], admin["id"], 999_999):
        response = client.delete(
            f"/api/v1/tokens/{token_id}", headers=bearer(two_projects["alpha_member"])
        )
        assert response.status_code == 404
    assert client.get("/api/v1/tokens/self", headers=bearer(two_projects["beta_member"])).is_success


def test_project_tokens_list_only_their_project(
    client: TestClient, two_projects: dict[str, str]
) -> None:
    response = client.get("/api/v1/projects", headers=bearer(two_projects["alpha_agent"]))
    assert response.status_code == 200
    assert [p["name"] for p in response.json()["items"]] == ["alpha"]
    everything = client.get("/api/v1/projects", headers=bearer(two_projects["admin"]))
    assert [p["name"] for p in everything.json()["items"]] == ["alpha", "beta"]


# --------------------------------------------------------------------------- roles


def test_member_creates_agent_tokens_only(client: TestClient, two_projects: dict[str, str]) -> None:
    member = bearer(two_projects["alpha_member"])
    url = "/api/v1/projects/alpha/tokens"
    agent = client.post(url, json={"name": "runner", "role": "agent"}, headers=member)
    assert agent.status_code == 201
    assert agent.json()["role"] == "agent"
    assert agent.json()["secret"].startswith("tl_")
    for role in ("admin", "member"):
        response = client.post(url, json={"name": "x", "role": role}, headers=member)
        assert response.status_code == 403, role
        assert response.json()["code"] == "forbidden"
    global_admin = client.post("/api/v1/tokens", json={"name": "x"}, headers=member)
    assert global_admin.status_code == 403
    # The new agent token works and is scoped to alpha.
    new_agent = bearer(agent.json()["secret"])
    assert client.get("/api/v1/projects/alpha/jobs", headers=new_agent).status_code == 200
    assert client.get("/api/v1/projects/beta/jobs", headers=new_agent).status_code == 404


def test_agents_cannot_manage_tokens(client: TestClient, two_projects: dict[str, str]) -> None:
    agent = bearer(two_projects["alpha_agent"])
    url = "/api/v1/projects/alpha/tokens"
    assert client.post(url, json={"name": "x", "role": "agent"}, headers=agent).status_code == 403
    assert client.get(url, headers=agent).status_code == 403
    member = client.get("/api/v1/tokens/self", headers=bearer(two_projects["alpha_member"]))
    revoke = client.delete(f"/api/v1/tokens/{member.json()['id']}", headers=agent)
    assert revoke.status_code == 403


def test_only_admins_create_projects_and_list_all_tokens(
    client: TestClient, two_projects: dict[str, str]
) -> None:
    member = bearer(two_projects["alpha_member"])
    assert client.post("/api/v1/projects", json={"name": "new"}, headers=member).status_code == 403
    assert client.get("/api/v1/tokens", headers=member).status_code == 403


def test_admin_manages_everything(
    client: TestClient, two_projects: dict[str, str], runtime: Runtime
) -> None:
    admin = bearer(two_projects["admin"])
    created = client.post(
        "/api/v1/projects", json={"name": "gamma", "max_series": 10}, headers=admin
    )
    assert created.status_code == 201
    assert created.json()["name"] == "gamma"
    duplicate = client.post("/api/v1/projects", json={"name": "gamma"}, headers=admin)
    assert duplicate.status_code == 409
    assert duplicate.json()["code"] == "conflict"

    member = client.post(
        "/api/v1/projects/gamma/tokens", json={"name": "carol", "role": "member"}, headers=admin
    )
    assert member.status_code == 201
    admin_under_project = client.post(
        "/api/v1/projects/gamma/tokens", json={"name": "nope", "role": "admin"}, headers=admin
    )
    assert admin_under_project.status_code == 422
    second_admin = client.post("/api/v1/tokens", json={"name": "ops"}, headers=admin)
    assert second_admin.status_code == 201
    assert second_admin.json()["role"] == "admin"
    assert second_admin.json()["project_id"] is None

    listed = client.get("/api/v1/tokens", headers=admin, params={"limit": 2})
    assert listed.status_code == 200
    assert len(listed.json()["items"]) == 2
    assert listed.json()["next_offset"] == 2

    for path in ("/api/v1/projects/alpha/jobs", "/api/v1/projects/beta/tokens"):
        assert client.get(path, headers=admin).status_code == 200
    beta_member = client.get("/api/v1/tokens/self", headers=bearer(two_projects["beta_member"]))
    assert (
        client.delete(f"/api/v1/tokens/{beta_member.json()['id']}", headers=admin).status_code
        == 204
    )
    assert (
        client.get("/api/v1/tokens/self", headers=bearer(two_projects["beta_member"])).status_code
        == 401
    )

    with session_scope(runtime.sessions) as session:
        actions = session.scalars(select(AuditEntry.action).order_by(AuditEntry.id)).all()
        actors = set(session.scalars(select(AuditEntry.actor)).all())
    admin_id = client.get("/api/v1/tokens/self", headers=admin).json()["id"]
    assert actions == ["project.create", "token.create", "token.create", "token.revoke"]
    assert actors == {f"token:{admin_id}:root"}


def test_token_listings_never_show_secrets(
    client: TestClient, two_projects: dict[str, str], runtime: Runtime
) -> None:
    response = client.get("/api/v1/projects/alpha/tokens", headers=bearer(two_projects["admin"]))
    assert response.status_code == 200
    items = response.json()["items"]
    assert {item["name"] for item in items} == {"alice", "alpha-agent"}
    for item in items:
        assert set(item) == {
            "id",
            "name",
            "role",
            "project_id",
            "prefix",
            "created_at",
            "expires_at",
            "last_used_at",
            "revoked_at",
        }
        assert item["prefix"].startswith("tl_")
    with session_scope(runtime.sessions) as session:
        hashes = session.scalars(select(ApiToken.token_hash)).all()
    for secret in two_projects.values():
        assert secret not in response.text
        assert secret[len("tl_") + 8 :] not in response.text
    for token_hash in hashes:
        assert token_hash not in response.text


def test_created_secret_is_not_in_the_audit_log(
    client: TestClient, two_projects: dict[str, str], runtime: Runtime
) -> None:
    created = client.post(
        "/api/v1/projects/alpha/tokens",
        json={"name": "x", "role": "agent"},
        headers=bearer(two_projects["alpha_member"]),
    )
    secret = created.json()["secret"]
    with session_scope(runtime.sessions) as session:
        entry = session.scalars(select(AuditEntry)).one()
        assert entry.action == "token.create"
        assert entry.actor.endswith(":alice")
        assert secret not in str(entry.details)
        assert entry.details["prefix"] == secret[:11]


# --------------------------------------------------------------------------- hostile input


@pytest.mark.parametrize(
    "name",
    ["Robert'); DROP TABLE projects;--", "UPPER", "has space", "", "x" * 101, "naïve", "a/b"],
)
def test_bad_project_names_are_rejected(
    client: TestClient, two_projects: dict[str, str], runtime: Runtime, name: str
) -> None:
    response = client.post(
        "/api/v1/projects", json={"name": name}, headers=bearer(two_projects["admin"])
    )
    assert response.status_code == 422
    assert response.json()["code"] == "validation_error"
    with session_scope(runtime.sessions) as session:
        assert session.scalar(select(func.count()).select_from(Project)) == 2


def test_hostile_token_names_are_stored_verbatim(
    client: TestClient, two_projects: dict[str, str]
) -> None:
    name = 'x\'); DELETE FROM api_tokens; -- "quoted"'
    created = client.post(
        "/api/v1/projects/alpha/tokens",
        json={"name": name, "role": "agent"},
        headers=bearer(two_projects["admin"]),
    )
    assert created.status_code == 201
    listed = client.get("/api/v1/projects/alpha/tokens", headers=bearer(two_projects["admin"]))
    assert name in [item["name"] for item in listed.json()["items"]]
    assert len(listed.json()["items"]) == 3


def test_hostile_path_names_are_just_not_found(
    client: TestClient, two_projects: dict[str, str]
) -> None:
    admin = bearer(two_projects["admin"])
    for project in ("alpha' OR '1'='1", "alpha;DROP TABLE jobs", "%27"):
        assert client.get(f"/api/v1/projects/{project}/jobs", headers=admin).status_code == 404
    assert client.get("/api/v1/projects/alpha/jobs", headers=admin).status_code == 200
