"""Desired and observed config versions of a job: their numbering, raw reads and writes.

Desired configs are written by the tuner loop, the API or a person; observed configs are what
the job's agent reports running. Versions only grow and rows are never updated. Plain
functions; the caller owns the transaction. :mod:`tuneloop.job_configs.protocol` is what
writers call: it checks a desired config against the job's bounds before
:func:`append_version` numbers it.

The agent acknowledges a desired version by reporting an observed config whose
:data:`ACK_KEY` is that version (or a later one), and reports a configuration it could not run
with :data:`STATUS_KEY` set to one of :data:`FAILED_STATUSES` (``oom`` for out of memory) and
an optional :data:`REASON_KEY`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tuneloop.errors import Conflict
from tuneloop.storage.models import Job, JobConfig

ConfigKind = Literal["desired", "observed"]

CONFIG_WRITE_ATTEMPTS: Final = 5

ACK_KEY: Final = "desired_version"
"""Key of an observed config: the desired version the job now runs."""
STUDY_SOURCE_PREFIX: Final = "tuner:study:"
"""``JobConfig.source`` of the desired configs a tuning study writes for its trials (then the
study's id): exploration, released without verification and never the last good version."""
STUDY_OUTCOME_SUFFIX: Final = ":outcome"
"""Ends the source of the one desired config a study writes when it ends: the pre-study config
it restores, or the best config after it beat the pre-study one by more than the noise. Either
was measured as good, so the actuator releases it as the job's last good version."""
STATUS_KEY: Final = "status"
"""Key of an observed config: ``running``, or one of :data:`FAILED_STATUSES`."""
REASON_KEY: Final = "reason"
FAILED_STATUSES: Final = ("oom", "failed")


def study_trial_source(study_id: int) -> str:
    """``JobConfig.source`` of a study's trial configs."""
    return f"{STUDY_SOURCE_PREFIX}{study_id}"


def study_outcome_source(study_id: int) -> str:
    """``JobConfig.source`` of the config a study leaves the job on when it ends."""
    return f"{STUDY_SOURCE_PREFIX}{study_id}{STUDY_OUTCOME_SUFFIX}"


def is_study_trial(source: str | None) -> bool:
    return (
        source is not None
        and source.startswith(STUDY_SOURCE_PREFIX)
        and not source.endswith(STUDY_OUTCOME_SUFFIX)
    )


def is_study_outcome(source: str | None) -> bool:
    return (
        source is not None
        and source.startswith(STUDY_SOURCE_PREFIX)
        and source.endswith(STUDY_OUTCOME_SUFFIX)
    )


def append_version(
    session: Session,
    job: Job,
    kind: ConfigKind,
    config: Mapping[str, Any],
    *,
    source: str = "api",
) -> JobConfig:
    """Add the next ``kind`` version of ``job``'s config (previous + 1, starting at 1), with no
    check of its content: :func:`tuneloop.job_configs.protocol.propose` checks desired ones.

    The job row is locked first (``FOR UPDATE`` on PostgreSQL), so concurrent writers get
    consecutive versions. SQLite has no row locks: a writer that loses the race retries with
    the next number, and after :data:`CONFIG_WRITE_ATTEMPTS` gets :class:`Conflict`.
    """
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


def config_version(session: Session, job: Job, kind: ConfigKind, version: int) -> JobConfig | None:
    return session.scalars(
        select(JobConfig).where(
            JobConfig.job_id == job.id, JobConfig.kind == kind, JobConfig.version == version
        )
    ).one_or_none()


def acknowledged_version(config: Mapping[str, Any]) -> int | None:
    """The desired version an observed config says the job runs, if it says one."""
    value = config.get(ACK_KEY)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def runs_config(observed: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether an observed config reports the same settings as ``desired`` (the
    acknowledgement it carries aside): a desired version equal to what already runs is in
    sync without a release of its own."""
    return {k: v for k, v in observed.items() if k != ACK_KEY} == dict(desired)


def first_acknowledgement(session: Session, job: Job, desired_version: int) -> JobConfig | None:
    """The earliest observed config that reports ``desired_version`` or a later one."""
    rows = session.scalars(
        select(JobConfig)
        .where(JobConfig.job_id == job.id, JobConfig.kind == "observed")
        .order_by(JobConfig.version)
    )
    for row in rows:
        acked = acknowledged_version(row.config)
        if acked is not None and acked >= desired_version:
            return row
    return None
