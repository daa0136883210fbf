"""Jobs and their desired/observed config versions: plain functions, the caller commits.

A job is addressed by name or by id: a reference made only of digits is an id, anything else
a name (job names therefore may not be all digits).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, Literal

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from actuators.policy import ActuationPolicy
from api.services.config_events import changed_after_commit
from tuneloop.accounts import Conflict, InvalidInput, NotFound
from tuneloop.storage.models import (
    Job,
    JobActuator,
    JobConfig,
    JobConfigMark,
    JobConfigRelease,
    Project,
)

JobKind = Literal["training", "inference"]
JobStatus = Literal["pending", "running", "paused", "succeeded", "failed", "cancelled"]
ConfigKind = Literal["desired", "observed"]
ReleaseReason = Literal["goal", "step", "rollback"]

ACTUATOR_SOURCE: Final = "actuator"
"""Source of the desired versions the actuator writes itself (steps and rollbacks); reserved."""

JOB_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}")
LABEL_NAME_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")
MAX_LABELS: Final = 64
MAX_LABEL_VALUE_LEN: Final = 1024
CONFIG_WRITE_ATTEMPTS: Final = 5


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
) -> Job:
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
    return job


def get_job(session: Session, project: Project, ref: str) -> Job:
    """The job of ``project`` named ``ref``, or with id ``ref`` when it is all digits."""
    job = _find_job(session, project, ref)
    if job is None:
        raise NotFound(f"job {ref!r} not found")
    return job


def _find_job(session: Session, project: Project, ref: str) -> Job | None:
    by = Job.id == int(ref) if ref.isdigit() else Job.name == ref
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
) -> dict[str, Any]:
    """Set the given fields (``labels`` replaces the whole set); returns what changed."""
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
    return changes


def append_config(
    session: Session,
    job: Job,
    kind: ConfigKind,
    config: Mapping[str, Any],
    *,
    source: str = "api",
) -> JobConfig:
    """Add the next ``kind`` version of ``job``'s config (previous + 1, starting at 1).

    The job row is locked first (``FOR UPDATE`` on PostgreSQL), so concurrent writers get
    consecutive versions. SQLite has no row locks: a writer that loses the race retries with
    the next number, and after :data:`CONFIG_WRITE_ATTEMPTS` gets :class:`Conflict`.

    A desired config outside the bounds of the job's actuation policy is refused with
    :class:`InvalidInput` naming every key out of bounds. Agents long-polling the job are woken
    once the caller commits.
    """
    if kind == "desired":
        problems = actuation_policy(session, job).bound_problems(config)
        if problems:
            raise InvalidInput(
                f"desired config outside the bounds of job {job.name!r}: {'; '.join(problems)}"
            )
        changed_after_commit(session, job.id)
    session.scalars(select(Job.id).where(Job.id == job.id).with_for_update()).one()
    for _ in range(CONFIG_WRITE_ATTEMPTS):
        current = session.scalar(
            select(func.max(JobConfig.version)).where(
                JobConfig.job_id == job.id, JobConfig.kind == kind
            )
        )
        row = JobConfig(
            job_id=job.id,
            kind=kind,
            version=(current or 0) + 1,
            config=dict(config),
            source=source,
        )
        try:
            with session.begin_nested():
                session.add(row)
        except IntegrityError:
            continue
        return row
    raise Conflict(f"another {kind} config of job {job.name!r} was written meanwhile; retry")


def latest_config(session: Session, job: Job, kind: ConfigKind) -> JobConfig | None:
    return session.scalars(
        select(JobConfig)
        .where(JobConfig.job_id == job.id, JobConfig.kind == kind)
        .order_by(JobConfig.version.desc())
        .limit(1)
    ).first()


# --------------------------------------------------------------------------- agent protocol
# The desired -> released -> observed protocol every side uses: the tuner and people write
# desired versions (append_config), the actuator releases them (release), agents fetch the
# released one (released_config) and acknowledge it (acknowledge) as the observed version of
# the same number.


def actuator_row(session: Session, job: Job) -> JobActuator | None:
    return session.get(JobActuator, job.id)


def actuation_policy(session: Session, job: Job) -> ActuationPolicy:
    """The job's policy; the default (no bounds, no limits) when none was set."""
    row = actuator_row(session, job)
    return ActuationPolicy.from_dict(row.policy if row is not None else None)


def config_version(session: Session, job: Job, kind: ConfigKind, version: int) -> JobConfig | None:
    return session.scalars(
        select(JobConfig).where(
            JobConfig.job_id == job.id, JobConfig.kind == kind, JobConfig.version == version
        )
    ).one_or_none()


def is_released(session: Session, job: Job, version: int) -> bool:
    found = session.scalar(
        select(JobConfigRelease.id).where(
            JobConfigRelease.job_id == job.id, JobConfigRelease.version == version
        )
    )
    return found is not None


def release(session: Session, job: Job, version: int, reason: ReleaseReason) -> JobConfigRelease:
    """Record that agents may run desired ``version`` (idempotent) and wake their pollers."""
    existing = session.scalars(
        select(JobConfigRelease).where(
            JobConfigRelease.job_id == job.id, JobConfigRelease.version == version
        )
    ).one_or_none()
    if existing is not None:
        return existing
    row = JobConfigRelease(job_id=job.id, version=version, reason=reason)
    session.add(row)
    session.flush()
    changed_after_commit(session, job.id)
    return row


def released_config(session: Session, job: Job) -> JobConfig | None:
    """The desired version agents should run now: the latest released one."""
    latest = session.scalar(
        select(func.max(JobConfigRelease.version)).where(JobConfigRelease.job_id == job.id)
    )
    return None if latest is None else config_version(session, job, "desired", latest)


class UnknownVersion(Conflict):
    """An agent acknowledged a version that was never released to its job."""


def acknowledge(session: Session, job: Job, version: int) -> JobConfig:
    """Record that the job now runs released desired ``version``: the observed version of the
    same number, with the same config. Repeating an ack returns the same row.

    :class:`UnknownVersion` when ``version`` was never released to this job; :class:`Conflict`
    when a newer version was acknowledged already (a late or replayed ack)."""
    desired = config_version(session, job, "desired", version)
    if desired is None or not is_released(session, job, version):
        raise UnknownVersion(f"version {version} was never released to job {job.name!r}")
    existing = config_version(session, job, "observed", version)
    if existing is not None:
        return existing
    latest = latest_config(session, job, "observed")
    if latest is not None and latest.version > version:
        raise Conflict(
            f"job {job.name!r} already acknowledged version {latest.version}, newer than {version}"
        )
    row = JobConfig(
        job_id=job.id, kind="observed", version=version, config=dict(desired.config), source="agent"
    )
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        raced = config_version(session, job, "observed", version)
        if raced is None:
            raise
        return raced
    return row


def config_marks(session: Session, job: Job, verdict: str | None = "bad") -> list[JobConfigMark]:
    """Verdicts on configs the job ran (``bad`` ones by default), oldest first: what the tuner
    reads so it does not propose a rolled-back config again."""
    query = select(JobConfigMark).where(JobConfigMark.job_id == job.id)
    if verdict is not None:
        query = query.where(JobConfigMark.verdict == verdict)
    return list(session.scalars(query.order_by(JobConfigMark.version)))
