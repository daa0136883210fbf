"""Projects, tokens, policy and audit in ``tuneloop.accounts``, on real SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from tuneloop import accounts
from tuneloop.storage import session_factory
from tuneloop.storage.models import ApiToken, AuditEntry, Project
from tuneloop.storage.types import utcnow


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    with session_factory(engine)() as session:
        yield session


# --------------------------------------------------------------------------- projects


def test_create_and_find_project(session: Session) -> None:
    project = accounts.create_project(session, "vision-team_2", max_series=1000)
    session.commit()
    found = accounts.get_project_by_name(session, "vision-team_2")
    assert found is not None
    assert found.id == project.id
    assert found.max_series == 1000
    assert accounts.get_project_by_name(session, "other") is None
    assert accounts.get_project(session, project.id) is found


def test_duplicate_project_is_a_conflict_and_leaves_the_session_usable(session: Session) -> None:
    accounts.create_project(session, "alpha")
    with pytest.raises(accounts.Conflict):
        accounts.create_project(session, "alpha")
    accounts.create_project(session, "beta")
    session.commit()
    assert [p.name for p in accounts.list_projects(session)] == ["alpha", "beta"]


@pytest.mark.parametrize(
    "name", ["", "Alpha", "has space", "x" * 101, "a'b", "'; DROP TABLE projects; --", "é", "a.b"]
)
def test_invalid_project_names_are_rejected(session: Session, name: str) -> None:
    with pytest.raises(accounts.InvalidInput):
        accounts.create_project(session, name)
    assert session.scalar(select(func.count()).select_from(Project)) == 0


def test_list_projects_pages_and_scopes(session: Session) -> None:
    ids = [accounts.create_project(session, f"p{i}").id for i in range(5)]
    session.commit()
    assert [p.id for p in accounts.list_projects(session, limit=2, offset=1)] == ids[1:3]
    assert [p.id for p in accounts.list_projects(session, only_id=ids[3])] == [ids[3]]


def test_ensure_default_project_creates_once(session: Session) -> None:
    project, secret = accounts.ensure_default_project(session, "default")
    session.commit()
    assert secret is not None
    token = accounts.authenticate(session, secret)
    assert token is not None
    assert (token.role, token.project_id) == ("member", project.id)

    again, no_secret = accounts.ensure_default_project(session, "default")
    session.commit()
    assert again.id == project.id
    assert no_secret is None
    assert len(accounts.list_tokens(session, project)) == 1
    assert [e.action for e in accounts.list_audit(session)] == ["project.create"]


# --------------------------------------------------------------------------- tokens


def test_only_the_hash_of_a_secret_is_stored(session: Session) -> None:
    project = accounts.create_project(session, "alpha")
    token, secret = accounts.create_token(session, project, "ci", "agent")
    session.commit()
    assert secret.startswith("tl_")
    assert len(secret) == len("tl_") + 43  # 32 bytes, URL-safe base64 without padding
    assert token.token_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert token.prefix == secret[:11]
    stored = session.execute(select(ApiToken.__table__)).one()._asdict()
    assert secret not in {str(value) for value in stored.values()}


def test_each_secret_is_unique(session: Session) -> None:
    project = accounts.create_project(session, "alpha")
    secrets = {accounts.create_token(session, project, "t", "agent")[1] for _ in range(20)}
    assert len(secrets) == 20


def test_authenticate(session: Session) -> None:
    project = accounts.create_project(session, "alpha")
    token, secret = accounts.create_token(session, project, "ci", "member")
    session.commit()
    assert accounts.authenticate(session, secret) is token
    for wrong in (
        "",
        "tl_",
        secret + "x",
        secret[:-1],
        "garbage",
        "' OR 1=1 --",
        "tl_" + "a" * 300,
    ):
        assert accounts.authenticate(session, wrong) is None


def test_revoked_and_expired_tokens_do_not_authenticate(session: Session) -> None:
    project = accounts.create_project(session, "alpha")
    revoked, revoked_secret = accounts.create_token(session, project, "old", "member")
    expiring, expiring_secret = accounts.create_token(
        session, project, "tmp", "agent", expires_at=utcnow() + timedelta(minutes=5)
    )
    session.commit()
    assert accounts.authenticate(session, expiring_secret) is expiring
    later = utcnow() + timedelta(minutes=6)
    assert accounts.authenticate(session, expiring_secret, now=later) is None

    first = accounts.revoke_token(session, revoked.id)
    session.commit()
    assert first.revoked_at is not None
    when = first.revoked_at
    assert accounts.revoke_token(session, revoked.id).revoked_at == when  # idempotent
    assert accounts.authenticate(session, revoked_secret) is None
    with pytest.raises(accounts.NotFound):
        accounts.revoke_token(session, 999_999)


def test_last_used_at_is_written_at_most_once_a_minute(session: Session) -> None:
    project = accounts.create_project(session, "alpha")
    token, secret = accounts.create_token(session, project, "ci", "agent")
    session.commit()
    start = utcnow()
    accounts.authenticate(session, secret, now=start)
    assert token.last_used_at == start
    session.commit()
    accounts.authenticate(session, secret, now=start + timedelta(seconds=30))
    assert token not in session.dirty
    assert token.last_used_at == start
    accounts.authenticate(session, secret, now=start + timedelta(seconds=61))
    assert token.last_used_at == start + timedelta(seconds=61)


@pytest.mark.parametrize(
    ("with_project", "role", "name"),
    [
        (True, "admin", "x"),  # admin tokens belong to no project
        (False, "member", "x"),  # member and agent tokens need one
        (False, "agent", "x"),
        (True, "owner", "x"),
        (True, "agent", ""),
        (True, "agent", "a\nb"),
        (True, "agent", "x" * 101),
    ],
)
def test_invalid_tokens_are_rejected(
    session: Session, with_project: bool, role: str, name: str
) -> None:
    project = accounts.create_project(session, "alpha") if with_project else None
    with pytest.raises(accounts.InvalidInput):
        accounts.create_token(session, project, name, role)


def test_expiry_must_be_aware_and_in_the_future(session: Session) -> None:
    project = accounts.create_project(session, "alpha")
    with pytest.raises(accounts.InvalidInput):
        accounts.create_token(session, project, "t", "agent", expires_at=utcnow() - timedelta(1))
    with pytest.raises(accounts.InvalidInput):
        naive = utcnow().replace(tzinfo=None) + timedelta(days=1)
        accounts.create_token(session, project, "t", "agent", expires_at=naive)


def test_hostile_token_names_are_stored_verbatim(session: Session) -> None:
    project = accounts.create_project(session, "alpha")
    name = "'); DROP TABLE api_tokens; --\"%_\\"
    token, _ = accounts.create_token(session, project, name, "agent")
    session.commit()
    session.expire_all()
    assert accounts.list_tokens(session, project)[0].name == name
    assert accounts.get_token(session, token.id) is not None


def test_list_tokens(session: Session) -> None:
    alpha = accounts.create_project(session, "alpha")
    beta = accounts.create_project(session, "beta")
    admin, _ = accounts.create_token(session, None, "root", "admin")
    a1, _ = accounts.create_token(session, alpha, "a1", "member")
    a2, _ = accounts.create_token(session, alpha, "a2", "agent")
    b1, _ = accounts.create_token(session, beta, "b1", "member")
    accounts.revoke_token(session, a1.id)
    session.commit()
    assert accounts.list_tokens(session, alpha) == [a1, a2]
    assert accounts.list_tokens(session, alpha, include_revoked=False) == [a2]
    assert accounts.list_tokens(session, alpha, limit=1, offset=1) == [a2]
    assert accounts.list_tokens(session, None) == [admin]
    assert accounts.list_all_tokens(session) == [admin, a1, a2, b1]
    assert accounts.list_all_tokens(session, include_revoked=False) == [admin, a2, b1]


# --------------------------------------------------------------------------- policy (pure)


def _token(role: str, project_id: int | None) -> ApiToken:
    return ApiToken(id=7, name="t", role=role, project_id=project_id)


ALPHA = Project(id=1, name="alpha")
BETA = Project(id=2, name="beta")


@pytest.mark.parametrize(
    ("role", "project_id", "reaches_alpha", "manages_alpha", "creates"),
    [
        ("admin", None, True, True, {"admin", "member", "agent"}),
        ("member", 1, True, True, {"agent"}),
        ("agent", 1, True, False, set()),
        ("member", 2, False, False, set()),
        ("agent", 2, False, False, set()),
    ],
)
def test_policy(
    role: str, project_id: int | None, reaches_alpha: bool, manages_alpha: bool, creates: set[str]
) -> None:
    actor = _token(role, project_id)
    assert accounts.can_access_project(actor, ALPHA) is reaches_alpha
    assert accounts.can_manage_tokens(actor, ALPHA) is manages_alpha
    assert {r for r in accounts.ROLES if accounts.can_create_token(actor, ALPHA, r)} == creates
    assert accounts.can_write_desired_config(actor) is (role != "agent")


@pytest.mark.parametrize(
    ("actor", "target", "visible"),
    [
        (_token("admin", None), _token("member", 2), True),
        (_token("admin", None), _token("admin", None), True),
        (_token("member", 1), _token("agent", 1), True),
        (_token("member", 1), _token("agent", 2), False),
        (_token("member", 1), _token("admin", None), False),
    ],
)
def test_token_visibility(actor: ApiToken, target: ApiToken, visible: bool) -> None:
    assert accounts.can_see_token(actor, target) is visible


# --------------------------------------------------------------------------- audit


def test_record_audit(session: Session) -> None:
    project = accounts.create_project(session, "alpha")
    token, _ = accounts.create_token(session, project, "x" * 100, "member")
    accounts.record_audit(
        session,
        actor=accounts.actor_name(token),
        action="job.create",
        target="job:train",
        project_id=project.id,
        details={"labels": {"team": "nlp"}},
    )
    accounts.record_audit(session, actor="cli", action="project.create", target="project:alpha")
    session.commit()
    newest, oldest = accounts.list_audit(session)
    assert (newest.actor, newest.action, newest.project_id) == ("cli", "project.create", None)
    assert len(oldest.actor) == 100
    assert oldest.actor.startswith(f"token:{token.id}:")
    assert oldest.details == {"labels": {"team": "nlp"}}
    assert [e.id for e in accounts.list_audit(session, project_id=project.id)] == [oldest.id]
    assert session.scalar(select(func.count()).select_from(AuditEntry)) == 2


def test_changes_with_an_actor_write_their_own_audit_entry_once(session: Session) -> None:
    project = accounts.create_project(session, "alpha", max_series=10, actor="cli")
    token, _ = accounts.create_token(session, project, "ci", "agent", actor="cli")
    accounts.revoke_token(session, token.id, actor="token:1:root")
    accounts.create_token(session, project, "quiet", "agent")  # no actor: no entry
    session.commit()
    entries = [
        (e.actor, e.action, e.target, e.project_id, e.details)
        for e in reversed(accounts.list_audit(session))
    ]
    token_details = {"name": "ci", "role": "agent", "prefix": token.prefix}
    assert entries == [
        ("cli", "project.create", "project:alpha", project.id, {"name": "alpha", "max_series": 10}),
        ("cli", "token.create", f"token:{token.id}", project.id, token_details),
        ("token:1:root", "token.revoke", f"token:{token.id}", project.id, token_details),
    ]
