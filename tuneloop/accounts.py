"""Projects, API tokens, who may do what, and the audit log: plain functions, no web framework.

Every function takes an open :class:`~sqlalchemy.orm.Session` and only flushes; the caller owns
the transaction (the API commits once per request, the CLI uses ``session_scope``).

A token secret is ``tl_`` followed by 32 random bytes (URL-safe base64). Only its SHA-256 is
stored, so a database dump reveals no usable credential; the secret is shown once, at creation.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from sqlalchemy import and_, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tuneloop.errors import Conflict, InvalidInput, NotFound
from tuneloop.storage.models import ApiToken, AuditEntry, Job, Project
from tuneloop.storage.types import utcnow

Role = Literal["admin", "member", "agent"]
ROLES: Final[tuple[Role, ...]] = ("admin", "member", "agent")

SECRET_PREFIX: Final = "tl_"  # noqa: S105 - a marker, not a secret
DISPLAY_PREFIX_LEN: Final = 11
"""Characters of the secret kept in clear for listings: ``tl_`` plus 8 random ones."""
TOUCH_INTERVAL: Final = timedelta(minutes=1)
"""``last_used_at`` is written at most this often per token, not on every request."""

PROJECT_NAME_RE: Final = re.compile(r"[a-z0-9_-]{1,100}")
_TOKEN_NAME_RE: Final = re.compile(r"[^\x00-\x1f\x7f]{1,100}")


# --------------------------------------------------------------------------- validation


def validate_project_name(name: str) -> str:
    """Return ``name`` if it is 1-100 of lowercase letters, digits, ``-`` and ``_``."""
    if not PROJECT_NAME_RE.fullmatch(name):
        raise InvalidInput(
            f"invalid project name {name!r}: use 1-100 lowercase letters, digits, '-' or '_'"
        )
    return name


def validate_token_name(name: str) -> str:
    """Return ``name`` if it is 1-100 characters without control characters (stored verbatim)."""
    if not _TOKEN_NAME_RE.fullmatch(name):
        raise InvalidInput("invalid token name: use 1-100 characters, no control characters")
    return name


def validate_role(role: str) -> Role:
    for known in ROLES:
        if role == known:
            return known
    raise InvalidInput(f"invalid role {role!r}: use one of {', '.join(ROLES)}")


# --------------------------------------------------------------------------- projects


def create_project(
    session: Session, name: str, *, max_series: int | None = None, actor: str | None = None
) -> Project:
    """Create a project; raises :class:`Conflict` if the name is taken. With ``actor`` (who
    asked: :func:`actor_name` of a token, or ``"cli"``) the audit log says so."""
    validate_project_name(name)
    if get_project_by_name(session, name) is not None:
        raise Conflict(f"project {name!r} already exists")
    project = Project(name=name, max_series=max_series)
    try:
        # A savepoint, so losing a race to a concurrent insert leaves the caller's
        # transaction usable.
        with session.begin_nested():
            session.add(project)
    except IntegrityError:
        raise Conflict(f"project {name!r} already exists") from None
    if actor is not None:
        record_audit(
            session,
            actor=actor,
            action="project.create",
            target=f"project:{name}",
            project_id=project.id,
            details={"name": name, "max_series": max_series},
        )
    return project


def get_project_by_name(session: Session, name: str) -> Project | None:
    return session.scalars(select(Project).where(Project.name == name)).one_or_none()


def get_project(session: Session, project_id: int) -> Project | None:
    return session.get(Project, project_id)


def list_projects(
    session: Session, *, only_id: int | None = None, limit: int = 100, offset: int = 0
) -> list[Project]:
    """Projects by id; ``only_id`` restricts the list to that one project (a scoped token)."""
    query = select(Project).order_by(Project.id).limit(limit).offset(offset)
    if only_id is not None:
        query = query.where(Project.id == only_id)
    return list(session.scalars(query))


def ensure_default_project(session: Session, name: str) -> tuple[Project, str | None]:
    """Return the project ``name``, creating it and a first ``member`` token if it is missing.

    The secret is returned only when the project was created now (it cannot be recovered
    later); otherwise it is ``None``.
    """
    project = get_project_by_name(session, name)
    if project is not None:
        return project, None
    try:
        project = create_project(session, name)
    except Conflict:  # created concurrently by another process
        existing = get_project_by_name(session, name)
        assert existing is not None
        return existing, None
    _, secret = create_token(session, project, "default", "member")
    record_audit(
        session,
        actor="system",
        action="project.create",
        target=f"project:{name}",
        project_id=project.id,
        details={"reason": "default project", "first_token": "default"},
    )
    return project, secret


# --------------------------------------------------------------------------- tokens


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def create_token(
    session: Session,
    project: Project | None,
    name: str,
    role: str,
    *,
    expires_at: datetime | None = None,
    actor: str | None = None,
) -> tuple[ApiToken, str]:
    """Create a token and return it with its secret (shown once, never stored).

    Admin tokens belong to no project (``project`` must be ``None``); member and agent tokens
    belong to exactly one. With ``actor`` the audit log says who created it.
    """
    checked_role = validate_role(role)
    validate_token_name(name)
    if checked_role == "admin" and project is not None:
        raise InvalidInput("admin tokens reach every project and cannot belong to one")
    if checked_role != "admin" and project is None:
        raise InvalidInput(f"a {checked_role} token needs a project")
    if expires_at is not None:
        if expires_at.tzinfo is None:
            raise InvalidInput("expires_at needs a timezone")
        if expires_at <= utcnow():
            raise InvalidInput("expires_at is in the past")
    secret = new_secret()
    token = ApiToken(
        project_id=project.id if project is not None else None,
        name=name,
        role=checked_role,
        token_hash=hash_secret(secret),
        prefix=secret[:DISPLAY_PREFIX_LEN],
        expires_at=expires_at,
    )
    session.add(token)
    session.flush()
    if actor is not None:
        _audit_token(session, actor, "token.create", token)
    return token, secret


def authenticate(session: Session, secret: str, *, now: datetime | None = None) -> ApiToken | None:
    """The live token whose secret is ``secret``, or ``None`` (unknown, revoked or expired).

    Sets ``last_used_at`` when it is older than :data:`TOUCH_INTERVAL`; the caller commits.
    """
    if not secret.startswith(SECRET_PREFIX) or len(secret) > 256:
        return None
    token = session.scalars(
        select(ApiToken).where(ApiToken.token_hash == hash_secret(secret))
    ).one_or_none()
    if token is None or token.revoked_at is not None:
        return None
    now = now or utcnow()
    if token.expires_at is not None and token.expires_at <= now:
        return None
    if token.last_used_at is None or now - token.last_used_at >= TOUCH_INTERVAL:
        token.last_used_at = now
    return token


def get_token(session: Session, token_id: int) -> ApiToken | None:
    return session.get(ApiToken, token_id)


def list_tokens(
    session: Session,
    project: Project | None,
    *,
    include_revoked: bool = True,
    limit: int = 100,
    offset: int = 0,
) -> list[ApiToken]:
    """Tokens of ``project`` by id; ``None`` lists the admin tokens (those of no project)."""
    query = select(ApiToken).order_by(ApiToken.id).limit(limit).offset(offset)
    if project is None:
        query = query.where(ApiToken.project_id.is_(None))
    else:
        query = query.where(ApiToken.project_id == project.id)
    if not include_revoked:
        query = query.where(ApiToken.revoked_at.is_(None))
    return list(session.scalars(query))


def list_all_tokens(
    session: Session, *, include_revoked: bool = True, limit: int = 100, offset: int = 0
) -> list[ApiToken]:
    """Every token of every project, admin tokens included, by id."""
    query = select(ApiToken).order_by(ApiToken.id).limit(limit).offset(offset)
    if not include_revoked:
        query = query.where(ApiToken.revoked_at.is_(None))
    return list(session.scalars(query))


def refused_token_hashes(session: Session, since: datetime) -> list[str]:
    """Hashes of the tokens revoked, or expired, from ``since`` until now: what a memory of
    confirmed tokens must drop before an outage makes it the only judge."""
    now = utcnow()
    query = select(ApiToken.token_hash).where(
        or_(
            ApiToken.revoked_at >= since,
            and_(ApiToken.expires_at >= since, ApiToken.expires_at <= now),
        )
    )
    return list(session.scalars(query))


def revoke_token(session: Session, token_id: int, *, actor: str | None = None) -> ApiToken:
    """Revoke a token (idempotent: a revoked token keeps its first ``revoked_at``). With
    ``actor`` the audit log says who revoked it."""
    token = get_token(session, token_id)
    if token is None:
        raise NotFound(f"token {token_id} not found")
    if token.revoked_at is None:
        token.revoked_at = utcnow()
        session.flush()
    if actor is not None:
        _audit_token(session, actor, "token.revoke", token)
    return token


def _audit_token(session: Session, actor: str, action: str, token: ApiToken) -> None:
    record_audit(
        session,
        actor=actor,
        action=action,
        target=f"token:{token.id}",
        project_id=token.project_id,
        details={"name": token.name, "role": token.role, "prefix": token.prefix},
    )


# --------------------------------------------------------------------------- who may do what


def can_access_project(token: ApiToken, project: Project) -> bool:
    """Admin tokens reach every project; others only their own."""
    return token.role == "admin" or token.project_id == project.id


def can_see_token(actor: ApiToken, target: ApiToken) -> bool:
    """Whether ``actor`` may learn that ``target`` exists (otherwise: not found)."""
    return actor.role == "admin" or (
        target.project_id is not None and target.project_id == actor.project_id
    )


def can_manage_tokens(actor: ApiToken, project: Project) -> bool:
    """List and revoke the tokens of ``project``: admins, and members of that project."""
    return actor.role == "admin" or (actor.role == "member" and actor.project_id == project.id)


def can_create_token(actor: ApiToken, project: Project | None, role: str) -> bool:
    """Admins create any token; a member creates ``agent`` tokens for its own project."""
    if actor.role == "admin":
        return True
    return (
        actor.role == "member"
        and role == "agent"
        and project is not None
        and actor.project_id == project.id
    )


def can_write_desired_config(actor: ApiToken) -> bool:
    """Desired config comes from people and the tuner, never from a job's own agent."""
    return actor.role in ("admin", "member")


# --------------------------------------------------------------------------- audit


def actor_name(token: ApiToken) -> str:
    """How a token appears in the audit log: ``token:<id>:<name>``."""
    return f"token:{token.id}:{token.name}"[:100]


def record_audit(
    session: Session,
    *,
    actor: str,
    action: str,
    target: str = "",
    project_id: int | None = None,
    details: Mapping[str, Any] | None = None,
) -> AuditEntry:
    """Append one entry to the audit log. Never put secrets in ``details``."""
    entry = AuditEntry(
        project_id=project_id,
        actor=actor[:100],
        action=action[:100],
        target=target[:200],
        details=dict(details or {}),
    )
    session.add(entry)
    return entry


def record_job_audit(
    session: Session,
    actor: str,
    action: str,
    job: Job,
    details: Mapping[str, Any] | None = None,
) -> AuditEntry:
    """Append what ``actor`` did to ``job``: the target names it, the details carry its id."""
    return record_audit(
        session,
        actor=actor,
        action=action,
        target=f"job:{job.name}",
        project_id=job.project_id,
        details={"job_id": job.id, **(details or {})},
    )


def list_audit(
    session: Session, *, project_id: int | None = None, limit: int = 100
) -> Sequence[AuditEntry]:
    """The most recent audit entries first (all projects when ``project_id`` is ``None``)."""
    query = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)
    if project_id is not None:
        query = query.where(AuditEntry.project_id == project_id)
    return list(session.scalars(query))
