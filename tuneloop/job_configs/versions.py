"""Desired and observed config versions of a job: their numbering, raw reads and writes.

Desired configs are written by the tuner loop, the API or a person; observed configs are what
the job's agent reports running. Versions only grow and rows are never updated. Plain
functions; the caller owns the transaction. :mod:`tuneloop.job_configs.protocol` is what
writers call: it checks a desired config against the job's bounds before
:func:`append_version` numbers it.

Who wrote a version is :mod:`tuneloop.job_configs.origins`; what an observed version says
about the desired ones (the version it acknowledges, ``status``, ``reason``) is
:mod:`tuneloop.job_configs.observed`. Both are columns; ``config`` holds only the settings.

An observed row's ``version`` is its own sequence (the n-th report of the job); the desired
version it runs is ``acknowledged_version``, the one number to compare with desired versions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tuneloop.errors import Conflict
from tuneloop.job_configs.observed import ObservedReport
from tuneloop.job_configs.origins import Origin, check_origin, default_source
from tuneloop.storage.models import Job, JobConfig

ConfigKind = Literal["desired", "observed"]

CONFIG_WRITE_ATTEMPTS: Final = 5


class VersionMismatch(Conflict):
    """A conditional write found another latest version than the one it expected."""


def lock_job(session: Session, job: Job) -> None:
    """Hold the job's row until the transaction ends (``FOR UPDATE`` on PostgreSQL), so its
    config writers take turns; SQLite serializes writers itself."""
    session.scalars(select(Job.id).where(Job.id == job.id).with_for_update()).one()


def append_version(
    session: Session,
    job: Job,
    kind: ConfigKind,
    config: Mapping[str, Any],
    *,
    origin: Origin = "api",
    study_id: int | None = None,
    source: str | None = None,
    report: ObservedReport | None = None,
    expected_version: int | None = None,
) -> JobConfig:
    """Add the next ``kind`` version of ``job``'s config (previous + 1, starting at 1), with no
    check of its content: :func:`tuneloop.job_configs.protocol.propose` checks desired ones.
    ``report`` is an observed version's typed part; ``source`` defaults to a text naming the
    origin (and the study).

    The job row is locked first (``FOR UPDATE`` on PostgreSQL), so concurrent writers get
    consecutive versions. SQLite has no row locks: a writer that loses the race retries with
    the next number, and after :data:`CONFIG_WRITE_ATTEMPTS` gets :class:`Conflict`.

    ``expected_version`` makes the write conditional: :class:`VersionMismatch` unless the
    latest ``kind`` version is that one (0: none yet), so two people editing the same version
    cannot silently overwrite each other.
    """
    check_origin(origin, study_id)
    if report is not None and kind != "observed":
        raise ValueError("only an observed version carries a report")
    typed = report or ObservedReport()
    lock_job(session, job)
    for _ in range(CONFIG_WRITE_ATTEMPTS):
        current = session.scalar(
            select(func.max(JobConfig.version)).where(
                JobConfig.job_id == job.id, JobConfig.kind == kind
            )
        )
        if expected_version is not None and (current or 0) != expected_version:
            raise VersionMismatch(
                f"the {kind} config of job {job.name!r} is at version {current or 0}, not "
                f"{expected_version} as expected: read it again (GET .../config) and retry"
            )
        row = JobConfig(
            job_id=job.id,
            kind=kind,
            version=(current or 0) + 1,
            config=dict(config),
            source=source or default_source(origin, study_id),
            origin=origin,
            origin_study_id=study_id,
            acknowledged_version=typed.acknowledged_version,
            status=typed.status,
            reason=typed.reason,
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


def runs_config(observed: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether an observed config reports the same settings as ``desired``: a desired version
    equal to what already runs is in sync without a release of its own."""
    return dict(observed) == dict(desired)


def first_acknowledgement(session: Session, job: Job, desired_version: int) -> JobConfig | None:
    """The earliest observed config that acknowledges ``desired_version`` or a later one."""
    return session.scalars(
        select(JobConfig)
        .where(
            JobConfig.job_id == job.id,
            JobConfig.kind == "observed",
            JobConfig.acknowledged_version >= desired_version,
        )
        .order_by(JobConfig.version)
        .limit(1)
    ).first()
