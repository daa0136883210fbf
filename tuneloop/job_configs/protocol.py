"""The desired -> released -> observed protocol of a job's config: the one way every side uses.

The tuner, the actuator and people propose desired versions (:func:`propose`, which checks
them against the job's bounds and wakes long-polling agents), the actuator releases them
(:func:`release`), agents fetch the released one (:func:`released_config`) and acknowledge it
(:func:`acknowledge`) with an observed version that names it (``acknowledged_version``), or
report what they run (:func:`report_observed`). :func:`state` reads all of it for a job.
Plain functions; the caller owns the transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tuneloop.config_bounds import Bound, bound_problems, parse_bounds
from tuneloop.config_events import changed_after_commit
from tuneloop.errors import Conflict, InvalidInput
from tuneloop.job_configs.observed import ACK_KEY, ObservedReport, UnknownVersion
from tuneloop.job_configs.origins import Origin
from tuneloop.job_configs.versions import (
    append_version,
    config_version,
    latest_config,
    lock_job,
    runs_config,
)
from tuneloop.storage.models import Job, JobActuator, JobConfig, JobConfigMark, JobConfigRelease

ReleaseReason = Literal["goal", "step", "rollback"]

ACTUATOR_SOURCE: Final = "actuator"
"""``source`` text of the versions the actuator writes itself (origin ``actuator``); reserved,
so that the audit trail does not show a person's change as the actuator's."""


def actuator_row(session: Session, job: Job) -> JobActuator | None:
    return session.get(JobActuator, job.id)


def job_bounds(session: Session, job: Job) -> dict[str, Bound]:
    """The bounds of the job's actuation policy; none when it has no policy."""
    row = actuator_row(session, job)
    return parse_bounds((row.policy or {}).get("bounds") if row is not None else None)


def propose(
    session: Session,
    job: Job,
    config: Mapping[str, Any],
    *,
    origin: Origin = "api",
    study_id: int | None = None,
    source: str | None = None,
    expected_version: int | None = None,
) -> JobConfig:
    """Write ``config`` as the job's next desired version, written by ``origin`` (``study_id``:
    the study behind a study's version; ``source``: free text for the audit trail). One outside
    the job's bounds is refused with :class:`InvalidInput` naming every key out of bounds.
    Agents long-polling the job are woken once the caller commits. With ``expected_version``
    the write is conditional (:class:`~tuneloop.job_configs.versions.VersionMismatch` unless
    the latest desired version is that one; 0: none yet)."""
    problems = bound_problems(job_bounds(session, job), config)
    if problems:
        raise InvalidInput(
            f"desired config outside the bounds of job {job.name!r}: {'; '.join(problems)} "
            "(change the config, or the bounds of the job's actuation policy: PUT "
            ".../actuator)"
        )
    changed_after_commit(session, job.id)
    return append_version(
        session,
        job,
        "desired",
        config,
        origin=origin,
        study_id=study_id,
        source=source,
        expected_version=expected_version,
    )


def report_observed(
    session: Session,
    job: Job,
    config: Mapping[str, Any],
    report: ObservedReport | None = None,
    *,
    origin: Origin = "api",
    source: str | None = None,
) -> JobConfig:
    """Write ``config`` (the job's settings) as the job's next observed version. A ``report``
    that names the desired version the job runs is an acknowledgement, which the tuner trusts:
    refused with :class:`UnknownVersion` unless that version was released to this job, as
    :func:`acknowledge` refuses it."""
    acked = report.acknowledged_version if report is not None else None
    if acked is not None and (
        config_version(session, job, "desired", acked) is None
        or not is_released(session, job, acked)
    ):
        raise UnknownVersion(f"{ACK_KEY} {acked!r} was never released to job {job.name!r}")
    return append_version(
        session, job, "observed", config, origin=origin, source=source, report=report
    )


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


def acknowledge(session: Session, job: Job, version: int) -> JobConfig:
    """Record that the job now runs released desired ``version``: the next observed version,
    with the desired config and ``acknowledged_version`` = ``version``. Repeating an ack
    returns the same row.

    :class:`UnknownVersion` when ``version`` was never released to this job; :class:`Conflict`
    when a newer version was acknowledged already (a late or replayed ack)."""
    desired = config_version(session, job, "desired", version)
    if desired is None or not is_released(session, job, version):
        raise UnknownVersion(f"version {version} was never released to job {job.name!r}")
    # Held until the caller commits, so two agents acking at once write one row.
    lock_job(session, job)
    existing = session.scalars(
        select(JobConfig)
        .where(
            JobConfig.job_id == job.id,
            JobConfig.kind == "observed",
            JobConfig.acknowledged_version == version,
        )
        .order_by(JobConfig.version)
        .limit(1)
    ).first()
    if existing is not None:
        return existing
    newest = session.scalar(
        select(func.max(JobConfig.acknowledged_version)).where(
            JobConfig.job_id == job.id, JobConfig.kind == "observed"
        )
    )
    if newest is not None and newest > version:
        raise Conflict(
            f"job {job.name!r} already acknowledged version {newest}, newer than {version}"
        )
    return append_version(
        session,
        job,
        "observed",
        desired.config,
        origin="agent",
        report=ObservedReport(acknowledged_version=version),
    )


@dataclass(frozen=True, slots=True)
class ConfigState:
    """Where a job stands in the protocol: its latest desired, released and observed versions,
    and whether what it runs is the latest desired one."""

    desired: JobConfig | None
    released: JobConfig | None
    observed: JobConfig | None

    @property
    def acknowledged_version(self) -> int | None:
        """The desired version the job last said it runs, if it said one."""
        return None if self.observed is None else self.observed.acknowledged_version

    @property
    def in_sync(self) -> bool:
        """The job says it runs the latest desired version (an ack), or reports running its
        settings (a report that it could not run them is not in sync)."""
        if self.desired is None or self.observed is None:
            return False
        if self.acknowledged_version == self.desired.version:
            return True
        return self.observed.status == "running" and runs_config(
            self.observed.config, self.desired.config
        )


def state(session: Session, job: Job) -> ConfigState:
    return ConfigState(
        desired=latest_config(session, job, "desired"),
        released=released_config(session, job),
        observed=latest_config(session, job, "observed"),
    )


def config_marks(session: Session, job: Job, verdict: str | None = "bad") -> list[JobConfigMark]:
    """Verdicts on configs the job ran (``bad`` ones by default), oldest first: what the tuner
    reads so it does not propose a rolled-back config again."""
    query = select(JobConfigMark).where(JobConfigMark.job_id == job.id)
    if verdict is not None:
        query = query.where(JobConfigMark.verdict == verdict)
    return list(session.scalars(query.order_by(JobConfigMark.version)))
