"""Autoscalers of a project in the store: checked definitions in, rows out. Plain functions;
the caller owns the transaction. Who may change what is the API's to decide (see
``api/routes/autoscalers.py``); :func:`target_changes` tells it whether a change touches the
target. A function that changes an autoscaler takes the ``actor`` (a token's
:func:`tuneloop.accounts.actor_name`) and writes the audit entry itself; without one (tests)
nothing is audited."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from actuators.autoscaler.spec import (
    check_selector,
    check_signals,
    check_target,
    policy_from_dict,
    policy_to_dict,
)
from tuneloop.accounts import record_audit
from tuneloop.errors import Conflict, NotFound
from tuneloop.storage.models import Autoscaler, Project
from tuneloop.storage.types import utcnow

TARGET_FIELDS = ("target_kind", "target")
"""What decides where the server sends requests: only admins set these."""


@dataclass(frozen=True, slots=True)
class Definition:
    """Everything about an autoscaler a person chooses, checked and normalized (the policy
    with every field, so what is shown is what runs)."""

    target_kind: str
    target: dict[str, Any]
    policy: dict[str, Any]
    p99_selector: dict[str, Any] | None
    queue_selector: dict[str, Any] | None
    dry_run: bool
    enabled: bool


def check_definition(
    *,
    target_kind: str,
    target: Mapping[str, Any],
    policy: Mapping[str, Any],
    p99: Mapping[str, Any] | None,
    queue: Mapping[str, Any] | None,
    dry_run: bool,
    enabled: bool,
) -> Definition:
    """Raises :class:`SpecError`, an :class:`InvalidInput` (HTTP 422), with the first
    problem found."""
    checked_target = check_target(target_kind, target)
    parsed = policy_from_dict(policy)
    p99_selector = check_selector("p99", p99) if p99 is not None else None
    queue_selector = check_selector("queue", queue) if queue is not None else None
    check_signals(parsed, p99_selector, queue_selector)
    return Definition(
        target_kind=target_kind,
        target=checked_target,
        policy=policy_to_dict(parsed),
        p99_selector=p99_selector,
        queue_selector=queue_selector,
        dry_run=dry_run,
        enabled=enabled,
    )


def definition_of(row: Autoscaler) -> Definition:
    return Definition(
        target_kind=row.target_kind,
        target=dict(row.target),
        policy=dict(row.policy),
        p99_selector=row.p99_selector,
        queue_selector=row.queue_selector,
        dry_run=row.dry_run,
        enabled=row.enabled,
    )


def get_autoscaler(session: Session, project: Project, name: str) -> Autoscaler:
    row = session.scalars(
        select(Autoscaler).where(Autoscaler.project_id == project.id, Autoscaler.name == name)
    ).one_or_none()
    if row is None:
        raise NotFound(f"autoscaler {name!r} not found in project {project.name!r}")
    return row


def list_autoscalers(
    session: Session, project: Project, *, limit: int = 100, offset: int = 0
) -> list[Autoscaler]:
    query = (
        select(Autoscaler)
        .where(Autoscaler.project_id == project.id)
        .order_by(Autoscaler.name)
        .limit(limit)
        .offset(offset)
    )
    return list(session.scalars(query))


def _audit(
    session: Session,
    actor: str | None,
    row: Autoscaler,
    action: str,
    details: Mapping[str, Any] | None = None,
) -> None:
    if actor is not None:
        record_audit(
            session,
            actor=actor,
            action=action,
            target=f"autoscaler:{row.name}",
            project_id=row.project_id,
            details=details,
        )


def create_autoscaler(
    session: Session,
    project: Project,
    name: str,
    definition: Definition,
    *,
    actor: str | None = None,
) -> Autoscaler:
    row = Autoscaler(project_id=project.id, name=name, **asdict(definition))
    try:
        # A savepoint: losing a race for the name leaves the caller's transaction usable.
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        raise Conflict(f"autoscaler {name!r} already exists in project {project.name!r}") from None
    _audit(session, actor, row, "autoscaler.create", asdict(definition))
    return row


def target_changes(row: Autoscaler, definition: Definition) -> bool:
    return (row.target_kind, dict(row.target)) != (definition.target_kind, definition.target)


def replace_autoscaler(
    session: Session, row: Autoscaler, definition: Definition, *, actor: str | None = None
) -> dict[str, Any]:
    """Make ``row`` the ``definition``; returns the fields that changed, with their new
    values (what is audited; nothing when nothing changed). A new target starts from no
    remembered state: the old one's recommendations and scale events say nothing about it."""
    old, new = asdict(definition_of(row)), asdict(definition)
    changes = {field: value for field, value in new.items() if old[field] != value}
    if not changes:
        return {}
    if target_changes(row, definition):
        row.state = {}
        row.replicas = row.last_decision = row.last_reason = None
        row.last_decision_at = row.last_error = row.last_error_at = None
    for field, value in changes.items():
        setattr(row, field, value)
    row.updated_at = utcnow()
    session.flush()
    _audit(session, actor, row, "autoscaler.update", changes)
    return changes


def delete_autoscaler(session: Session, row: Autoscaler, *, actor: str | None = None) -> None:
    session.delete(row)
    _audit(session, actor, row, "autoscaler.delete")
