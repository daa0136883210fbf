"""Jobs of a project and their config versions: ``/api/v1/projects/{project}/jobs``.

Every role of the project may create, list and update jobs (agents register their own) and
report observed config; desired config is written by members and admins only.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, status
from sqlalchemy.orm import Session

from api.deps import (
    API_PREFIX,
    AUTH_ERRORS,
    CurrentToken,
    PageDep,
    ProjectDep,
    SessionDep,
    require_member,
)
from api.schemas import (
    ConfigVersionOut,
    ConfigWrite,
    JobConfigState,
    JobCreate,
    JobOut,
    JobUpdate,
    Page,
)
from api.services import jobs as job_service
from api.services.jobs import ConfigKind, JobStatus
from tuneloop import accounts
from tuneloop.errors import InvalidInput
from tuneloop.job_configs import acknowledged_version, runs_config
from tuneloop.storage.models import ApiToken, Job, Project
from tuner.actuators.holds import hold

router = APIRouter(
    prefix=f"{API_PREFIX}/projects/{{project}}/jobs", tags=["jobs"], responses=AUTH_ERRORS
)

JOB_REF_DOC = "Job name, or job id when all digits (job names are never all digits)"


def get_job(
    job: Annotated[str, Path(description=JOB_REF_DOC)], project: ProjectDep, session: SessionDep
) -> Job:
    return job_service.get_job(session, project, job)


JobDep = Annotated[Job, Depends(get_job)]


@router.post("", status_code=status.HTTP_201_CREATED, summary="Register a job")
def create_job(
    body: JobCreate, project: ProjectDep, session: SessionDep, token: CurrentToken
) -> JobOut:
    job = job_service.create_job(
        session, project, body.name, kind=body.kind, labels=body.labels, status=body.status
    )
    accounts.record_job_audit(session, token, project, "job.create", job, body.model_dump())
    return JobOut.model_validate(job)


@router.get("", summary="List a project's jobs")
def list_jobs(
    project: ProjectDep,
    session: SessionDep,
    _token: CurrentToken,
    page: PageDep,
    status_filter: Annotated[JobStatus | None, Query(alias="status")] = None,
) -> Page[JobOut]:
    rows = job_service.list_jobs(
        session, project, status=status_filter, limit=page.fetch, offset=page.offset
    )
    return page.build(rows, JobOut.model_validate)


@router.get("/{job}", summary="One job")
def read_job(job: JobDep) -> JobOut:
    return JobOut.model_validate(job)


@router.patch("/{job}", summary="Change a job's status or labels")
def update_job(
    body: JobUpdate, job: JobDep, project: ProjectDep, session: SessionDep, token: CurrentToken
) -> JobOut:
    """``labels`` replaces the whole label set. A change is written to the audit log."""
    changes = job_service.update_job(session, job, status=body.status, labels=body.labels)
    if changes:
        accounts.record_job_audit(session, token, project, "job.update", job, changes)
    return JobOut.model_validate(job)


def _config_out(row: object) -> ConfigVersionOut:
    return ConfigVersionOut.model_validate(row)


def _write_config(
    session: Session,
    token: ApiToken,
    project: Project,
    job: Job,
    kind: ConfigKind,
    body: ConfigWrite,
) -> ConfigVersionOut:
    row = job_service.append_config(session, job, kind, body.config, source=body.source)
    accounts.record_job_audit(
        session,
        token,
        project,
        f"job.config.{kind}",
        job,
        {"version": row.version, "source": row.source, "config": body.config},
    )
    return _config_out(row)


@router.put("/{job}/config", summary="Set a new desired config (next version)")
def set_desired_config(
    body: ConfigWrite, job: JobDep, project: ProjectDep, session: SessionDep, token: CurrentToken
) -> ConfigVersionOut:
    """Stores ``config`` as desired version previous + 1 (the first is 1) and returns it."""
    require_member(token, "setting a desired config")
    if body.source == job_service.ACTUATOR_SOURCE:
        raise InvalidInput(f"source {body.source!r} is reserved for the actuator's own versions")
    return _write_config(session, token, project, job, "desired", body)


@router.post(
    "/{job}/config/observed",
    status_code=status.HTTP_201_CREATED,
    summary="Report the config the job runs (next observed version)",
)
def report_observed_config(
    body: ConfigWrite, job: JobDep, project: ProjectDep, session: SessionDep, token: CurrentToken
) -> ConfigVersionOut:
    """A ``desired_version`` in the config must be one released to this job (409 otherwise):
    the tuner takes it as the job's acknowledgement."""
    job_service.check_reported_acknowledgement(session, job, body.config)
    return _write_config(session, token, project, job, "observed", body)


@router.get("/{job}/config", summary="Latest desired and latest observed config")
def read_config(job: JobDep, session: SessionDep) -> JobConfigState:
    """``held``: why the latest desired version is not released yet, and until when."""
    desired = job_service.latest_config(session, job, "desired")
    observed = job_service.latest_config(session, job, "observed")
    return JobConfigState(
        held=hold(job_service.actuator_row(session, job)),
        desired=_config_out(desired) if desired else None,
        observed=_config_out(observed) if observed else None,
        in_sync=desired is not None
        and observed is not None
        # The job says which desired version it runs (an ack), or reports the same config.
        and (
            acknowledged_version(observed.config) == desired.version
            or runs_config(observed.config, desired.config)
        ),
    )
