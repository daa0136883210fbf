"""The desired -> released -> observed protocol of a job's config: the one way every side uses.

The tuner and people write desired versions (:func:`append_config`, which checks them against
the job's actuation bounds and wakes long-polling agents), the actuator releases them
(:func:`release`), agents fetch the released one (:func:`released_config`) and acknowledge it
(:func:`acknowledge`) as the observed version of the same number. Plain functions; the caller
owns the transaction. Version numbering and the raw reads and writes are the core's
(:mod:`tuneloop.job_configs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tuneloop import job_configs
from tuneloop.config_events import changed_after_commit
from tuneloop.errors import Conflict, InvalidInput
from tuneloop.job_configs import ACK_KEY, ConfigKind, latest_config
from tuneloop.storage.models import Job, JobActuator, JobConfig, JobConfigMark, JobConfigRelease
from tuner.actuators.policy_config import ActuationPolicy

ReleaseReason = Literal["goal", "step", "rollback"]

ACTUATOR_SOURCE: Final = "actuator"
"""Source of the desired versions the actuator writes itself (steps and rollbacks); reserved."""


def append_config(
    session: Session,
    job: Job,
    kind: ConfigKind,
    config: Mapping[str, Any],
    *,
    source: str = "api",
) -> JobConfig:
    """:func:`tuneloop.job_configs.append_config`, and for a desired config first the job's
    actuation bounds: one outside them is refused with :class:`InvalidInput` naming every key
    out of bounds. Agents long-polling the job are woken once the caller commits."""
    if kind == "desired":
        problems = actuation_policy(session, job).bound_problems(config)
        if problems:
            raise InvalidInput(
                f"desired config outside the bounds of job {job.name!r}: {'; '.join(problems)} "
                "(change the config, or the bounds of the job's actuation policy: PUT "
                ".../actuator)"
            )
        changed_after_commit(session, job.id)
    return job_configs.append_config(session, job, kind, config, source=source)


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
        job_id=job.id,
        kind="observed",
        version=version,
        config={**desired.config, ACK_KEY: version},
        source="agent",
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
