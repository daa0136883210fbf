"""Jobs of a project and the config versions people and agents write: plain functions, the
caller commits. The desired -> released -> observed protocol itself is
:mod:`tuneloop.job_configs`; the functions here that change something take the ``actor`` (who
asked: :func:`tuneloop.accounts.actor_name` of a token, or ``"cli"``) and write its audit
entry themselves, so no caller writes it again.

A job is addressed by name or by id: a reference made only of digits is an id, anything else
a name (job names therefore may not be all digits).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, Literal

from sqlalchemy import false, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tuneloop import job_configs
from tuneloop.accounts import record_job_audit
from tuneloop.errors import Conflict, InvalidInput, NotFound
from tuneloop.storage.models import Job, JobConfig, Project
from tuneloop.storage.types import row_id

JobKind = Literal["training", "inference"]
JobStatus = Literal["pending", "running", "paused", "succeeded", "failed", "cancelled"]

JOB_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}")
LABEL_NAME_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")
MAX_LABELS: Final = 64
MAX_LABEL_VALUE_LEN: Final = 1024


def validate_job_name(name: str) -> str:
    if not JOB_NAME_RE.fullmatch(name) or name.isdigit():
        raise InvalidInput(
            f"invalid job name {name!r}: use 1-200 letters, digits, '.', '_', ':', '@' or '-', "
            "starting with a letter or digit and not all digits"
        )
    return name


def validate_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """Labels are string pairs with Prometheus-style names, so they can join metric series."""
    if len(labels) > MAX_LABELS:
        raise InvalidInput(f"at most {MAX_LABELS} labels")
    for key, value in labels.items():
        if not LABEL_NAME_RE.fullmatch(key):
            raise InvalidInput(
                f"invalid label name {key!r}: use letters, digits and '_', not starting with "
                "a digit, at most 100 characters"
            )
        if len(value) > MAX_LABEL_VALUE_LEN:
            raise InvalidInput(f"label {key!r}: value longer than {MAX_LABEL_VALUE_LEN}")
    return dict(labels)


def create_job(
    session: Session,
    project: Project,
    name: str,
    *,
    kind: str = "training",
    labels: Mapping[str, str] | None = None,
    status: str = "pending",
    actor: str | None = None,
) -> Job:
    """Create a job; with ``actor`` the audit log says who did."""
    validate_job_name(name)
    if _find_job(session, project, name) is not None:
        raise Conflict(f"job {name!r} already exists in project {project.name!r}")
    job = Job(
        project_id=project.id,
        name=name,
        kind=kind,
        labels=validate_labels(labels or {}),
        status=status,
    )
    try:
        with session.begin_nested():
            session.add(job)
    except IntegrityError:
        raise Conflict(f"job {name!r} already exists in project {project.name!r}") from None
    if actor is not None:
        details = {"name": name, "kind": kind, "labels": dict(job.labels), "status": status}
        record_job_audit(session, actor, "job.create", job, details)
    return job


def get_job(session: Session, project: Project, ref: str) -> Job:
    """The job of ``project`` named ``ref``, or with id ``ref`` when it is all digits."""
    job = _find_job(session, project, ref)
    if job is None:
        raise NotFound(
            f"job {ref!r} not found in project {project.name!r}: its agent creates it when it "
            f"registers, or create it with POST /api/v1/projects/{project.name}/jobs "
            '{"name": ...}'
        )
    return job


def _find_job(session: Session, project: Project, ref: str) -> Job | None:
    found_id = row_id(ref)
    if found_id is not None:
        by = Job.id == found_id
    elif ref.isascii() and ref.isdigit():
        by = false()  # all digits is an id (names never are), here past any id's range
    else:
        by = Job.name == ref
    query = select(Job).where(Job.project_id == project.id, by)
    return session.scalars(query).one_or_none()


def list_jobs(
    session: Session,
    project: Project,
    *,
    status: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[Job]:
    query = (
        select(Job).where(Job.project_id == project.id).order_by(Job.id).limit(limit).offset(offset)
    )
    if status is not None:
        query = query.where(Job.status == status)
    return list(session.scalars(query))


def update_job(
    session: Session,
    job: Job,
    *,
    status: str | None = None,
    labels: Mapping[str, str] | None = None,
    actor: str | None = None,
) -> dict[str, Any]:
    """Set the given fields (``labels`` replaces the whole set); returns what changed. With
    ``actor`` a change (none when nothing changed) goes to the audit log."""
    changes: dict[str, Any] = {}
    if status is not None and status != job.status:
        changes["status"] = {"from": job.status, "to": status}
        job.status = status
    if labels is not None:
        new_labels = validate_labels(labels)
        if new_labels != job.labels:
            changes["labels"] = {"from": dict(job.labels), "to": new_labels}
            job.labels = new_labels
    if changes:
        session.flush()
        if actor is not None:
            record_job_audit(session, actor, "job.update", job, changes)
    return changes


# --------------------------------------------------------------------------- config versions


def set_desired_config(
    session: Session,
    job: Job,
    config: Mapping[str, Any],
    *,
    source: str,
    actor: str,
    expected_version: int | None = None,
) -> JobConfig:
    """Store ``config`` as the job's next desired version (bounds-checked by
    :func:`tuneloop.job_configs.propose`) and audit it. The actuator's source is its own.
    ``expected_version``: only if the latest desired version is that one (0: none yet), else
    :class:`~tuneloop.job_configs.VersionMismatch` (a conflict)."""
    if source == job_configs.ACTUATOR_SOURCE:
        raise InvalidInput(f"source {source!r} is reserved for the actuator's own versions")
    row = job_configs.propose(
        session,
        job,
        dict(config),
        origin="api",
        source=source,
        expected_version=expected_version,
    )
    _audit_config(session, actor, job, row)
    return row


def report_observed_config(
    session: Session,
    job: Job,
    config: Mapping[str, Any],
    *,
    acknowledged_version: int | None,
    status: job_configs.ObservedStatus | None,
    reason: str | None,
    origin: job_configs.Origin,
    source: str,
    actor: str,
) -> JobConfig:
    """Store ``config`` as the job's next observed version with what the job says of it (the
    desired version it acknowledges, its status and why) and audit it. The agents' older wire
    format, those keys inside ``config``, is read the same way."""
    settings, report = job_configs.split_wire_body(
        config, acknowledged_version=acknowledged_version, status=status, reason=reason
    )
    row = job_configs.report_observed(session, job, settings, report, origin=origin, source=source)
    _audit_config(session, actor, job, row)
    return row


def _audit_config(session: Session, actor: str, job: Job, row: JobConfig) -> None:
    details: dict[str, Any] = {
        "version": row.version,
        "source": row.source,
        "origin": row.origin,
        "config": row.config,
    }
    if row.kind == "observed":
        details.update(
            acknowledged_version=row.acknowledged_version, status=row.status, reason=row.reason
        )
    record_job_audit(session, actor, f"job.config.{row.kind}", job, details)
