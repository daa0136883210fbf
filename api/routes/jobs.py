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
    ObservedWrite,
    Page,
)
from api.services import jobs as job_service
from api.services.jobs import JobStatus
from tuneloop import accounts, job_configs
from tuneloop.errors import InvalidInput
from tuneloop.storage.models import ApiToken, Job, JobConfig, Project
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


def _audited(
    session: Session, token: ApiToken, project: Project, job: Job, row: JobConfig
) -> ConfigVersionOut:
    """Audit the config version just written and answer it."""
    accounts.record_job_audit(
        session,
        token,
        project,
        f"job.config.{row.kind}",
        job,
        {
            "version": row.version,
            "source": row.source,
            "origin": row.origin,
            "config": row.config,
            **(
                {
                    "acknowledged_version": row.acknowledged_version,
                    "status": row.status,
                    "reason": row.reason,
                }
                if row.kind == "observed"
                else {}
            ),
        },
    )
    return _config_out(row)


@router.put("/{job}/config", summary="Set a new desired config (next version)")
def set_desired_config(
    body: ConfigWrite, job: JobDep, project: ProjectDep, session: SessionDep, token: CurrentToken
) -> ConfigVersionOut:
    """Stores ``config`` as desired version previous + 1 (the first is 1) and returns it."""
    require_member(token, "setting a desired config")
    if body.source == job_configs.ACTUATOR_SOURCE:
        raise InvalidInput(f"source {body.source!r} is reserved for the actuator's own versions")
    row = job_configs.propose(session, job, body.config, origin="api", source=body.source)
    return _audited(session, token, project, job, row)


@router.post(
    "/{job}/config/observed",
    status_code=status.HTTP_201_CREATED,
    summary="Report the config the job runs (next observed version)",
)
def report_observed_config(
    body: ObservedWrite, job: JobDep, project: ProjectDep, session: SessionDep, token: CurrentToken
) -> ConfigVersionOut:
    """``acknowledged_version`` (or ``desired_version`` in the config) must be one released to
    this job (409 otherwise): the tuner takes it as the job's acknowledgement. ``status`` oom or
    failed says the job could not run it."""
    settings, report = job_configs.split_wire_body(
        body.config,
        acknowledged_version=body.acknowledged_version,
        status=body.status,
        reason=body.reason,
    )
    origin: job_configs.Origin = "agent" if token.role == "agent" else "api"
    row = job_configs.report_observed(
        session, job, settings, report, origin=origin, source=body.source
    )
    return _audited(session, token, project, job, row)


@router.get("/{job}/config", summary="Latest desired and latest observed config")
def read_config(job: JobDep, session: SessionDep) -> JobConfigState:
    """``held``: why the latest desired version is not released yet, and until when."""
    now = job_configs.state(session, job)
    return JobConfigState(
        held=hold(job_configs.actuator_row(session, job)),
        desired=_config_out(now.desired) if now.desired else None,
        observed=_config_out(now.observed) if now.observed else None,
        in_sync=now.in_sync,
    )
