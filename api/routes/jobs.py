"""Jobs of a project and their config versions: ``/api/v1/projects/{project}/jobs``.

Every role of the project may create, list and update jobs (agents register their own) and
report observed config; desired config is written by members and admins only.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Query, Response, status

from actuators.holds import hold
from api.deps import (
    API_PREFIX,
    AUTH_ERRORS,
    CurrentToken,
    PageDep,
    ProjectDep,
    RuntimeDep,
    SessionDep,
    require_member,
)
from api.query_params import duration_param, time_param
from api.read_limits import ClientWatchDep, bounded_read
from api.schemas.common import ErrorOut, Page
from api.schemas.diagnosis import DiagnosisOut
from api.schemas.jobs import (
    ConfigVersionOut,
    DesiredConfigIn,
    JobConfigOut,
    JobCreate,
    JobOut,
    JobUpdate,
    ObservedIn,
)
from api.services.knobs import declared_knobs
from tuneloop import accounts, job_configs, jobs
from tuneloop.errors import InvalidInput
from tuneloop.jobs import JobStatus
from tuneloop.storage.models import Job
from tuneloop.storage.types import utcnow
from tuner.diagnosis import Diagnosis
from tuner.diagnosis_reading import job_diagnosis
from tuner.knobs import check_values

router = APIRouter(
    prefix=f"{API_PREFIX}/projects/{{project}}/jobs", tags=["jobs"], responses=AUTH_ERRORS
)

JOB_REF_DOC = "Job name, or job id when all digits (job names are never all digits)"


def get_job(
    job: Annotated[str, Path(description=JOB_REF_DOC)], project: ProjectDep, session: SessionDep
) -> Job:
    return jobs.get_job(session, project, job)


JobDep = Annotated[Job, Depends(get_job)]


@router.post("", status_code=status.HTTP_201_CREATED, summary="Register a job")
def create_job(
    body: JobCreate, project: ProjectDep, session: SessionDep, token: CurrentToken
) -> JobOut:
    job = jobs.create_job(
        session,
        project,
        body.name,
        kind=body.kind,
        labels=body.labels,
        status=body.status,
        actor=accounts.actor_name(token),
    )
    return JobOut.model_validate(job)


@router.get("", summary="List a project's jobs")
def list_jobs(
    project: ProjectDep,
    session: SessionDep,
    _token: CurrentToken,
    page: PageDep,
    status_filter: Annotated[JobStatus | None, Query(alias="status")] = None,
) -> Page[JobOut]:
    rows = jobs.list_jobs(
        session, project, status=status_filter, limit=page.fetch, offset=page.offset
    )
    return page.build(rows, JobOut.model_validate)


@router.get("/{job}", summary="One job")
def read_job(job: JobDep) -> JobOut:
    return JobOut.model_validate(job)


@router.patch("/{job}", summary="Change a job's status or labels")
def update_job(body: JobUpdate, job: JobDep, session: SessionDep, token: CurrentToken) -> JobOut:
    """``labels`` replaces the whole label set. A change is written to the audit log."""
    jobs.update_job(
        session, job, status=body.status, labels=body.labels, actor=accounts.actor_name(token)
    )
    return JobOut.model_validate(job)


def desired_etag(version: int | None) -> str:
    """The ETag of a job's config: its latest desired version (``"0"``: none yet)."""
    return f'"{version or 0}"'


def expected_version(if_match: str | None, in_body: int | None) -> int | None:
    """The desired version a conditional write expects, from ``If-Match`` (an ETag of
    GET .../config; ``*`` is no condition) or the body's ``expected_version``."""
    from_header = None
    if if_match is not None and if_match.strip() != "*":
        tag = if_match.strip().removeprefix("W/").strip('"')
        if not (tag.isascii() and tag.isdigit() and len(tag) <= 10):
            raise InvalidInput(f'If-Match {if_match[:40]!r}: expected an ETag like "3"')
        from_header = int(tag)
    if from_header is not None and in_body is not None and from_header != in_body:
        raise InvalidInput("If-Match and expected_version name different versions")
    return from_header if from_header is not None else in_body


@router.put(
    "/{job}/config",
    summary="Set a new desired config (next version)",
    responses={409: {"model": ErrorOut, "description": "Not the expected version"}},
)
def set_desired_config(
    body: DesiredConfigIn,
    job: JobDep,
    session: SessionDep,
    token: CurrentToken,
    response: Response,
    if_match: Annotated[
        str | None, Header(description='Write only if the ETag of GET .../config is this ("3")')
    ] = None,
) -> ConfigVersionOut:
    """Stores ``config`` as desired version previous + 1 (the first is 1) and returns it.
    With ``If-Match`` or ``expected_version`` the write happens only if the latest desired
    version is that one: 409 otherwise (someone else wrote meanwhile; read and retry). A
    value outside the range of a knob the job declared is refused with 422 naming it."""
    require_member(token, "setting a desired config")
    check_values(declared_knobs(session, job), body.config)
    row = jobs.set_desired_config(
        session,
        job,
        body.config,
        source=body.source,
        actor=accounts.actor_name(token),
        expected_version=expected_version(if_match, body.expected_version),
    )
    response.headers["ETag"] = desired_etag(row.version)
    return ConfigVersionOut.model_validate(row)


@router.post(
    "/{job}/config/observed",
    status_code=status.HTTP_201_CREATED,
    summary="Report the config the job runs (next observed version)",
)
def report_observed_config(
    body: ObservedIn, job: JobDep, session: SessionDep, token: CurrentToken
) -> ConfigVersionOut:
    """``acknowledged_version`` (or ``desired_version`` in the config) must be one released to
    this job (409 otherwise): the tuner takes it as the job's acknowledgement. ``status`` oom or
    failed says the job could not run it."""
    row = jobs.report_observed_config(
        session,
        job,
        body.config,
        acknowledged_version=body.acknowledged_version,
        status=body.status,
        reason=body.reason,
        origin="agent" if token.role == "agent" else "api",
        source=body.source,
        actor=accounts.actor_name(token),
    )
    return ConfigVersionOut.model_validate(row)


@router.get("/{job}/config", summary="Latest desired and latest observed config")
def read_config(job: JobDep, session: SessionDep, response: Response) -> JobConfigOut:
    """``held``: why the latest desired version is not released yet, and until when. The
    ``ETag`` header is the latest desired version, for a conditional PUT (``If-Match``)."""
    now = job_configs.state(session, job)
    response.headers["ETag"] = desired_etag(now.desired.version if now.desired else None)
    return JobConfigOut(
        held=hold(job_configs.actuator_row(session, job)),
        desired=ConfigVersionOut.model_validate(now.desired) if now.desired else None,
        observed=ConfigVersionOut.model_validate(now.observed) if now.observed else None,
        in_sync=now.in_sync,
    )


MAX_DIAGNOSIS_WINDOW_S = 86_400
"""A day of step timings at most: a diagnosis is about how a job runs now."""


@router.get(
    "/{job}/diagnosis",
    summary="Where the job's step time goes, what bounds it, which ranks lag",
    responses={400: {"model": ErrorOut}},
)
def read_diagnosis(
    job: JobDep,
    runtime: RuntimeDep,
    session: SessionDep,
    client: ClientWatchDep,
    window: Annotated[str, Query(description="Window length, e.g. 5m, 300")] = "5m",
    end: Annotated[str | None, Query(description="Window end (RFC 3339 or Unix); now")] = None,
) -> DiagnosisOut:
    """Phase shares, a verdict with its evidence, stragglers, and the ranks whose timings were
    left out as impossible (docs/diagnosis.md). A job without step timings: ``no_data``."""
    until = utcnow() if end is None else time_param(end, "end")
    found = diagnose(job, runtime, session, client, window, until)
    span = timedelta(seconds=duration_param(window, "window"))
    return DiagnosisOut.of(job.name, until - span, until, found)


def diagnose(
    job: Job,
    runtime: RuntimeDep,
    session: SessionDep,
    client: ClientWatchDep,
    window: str,
    end: datetime | None,
) -> Diagnosis:
    """The job's diagnosis over ``window`` (a duration) ending at ``end`` (default: now)."""
    window_s = duration_param(window, "window")
    if not 0 < window_s <= MAX_DIAGNOSIS_WINDOW_S:
        raise InvalidInput(f"window must be between 1s and {MAX_DIAGNOSIS_WINDOW_S}s")
    until = utcnow() if end is None else end
    with bounded_read(session, client) as connection:
        return job_diagnosis(
            runtime.series(connection),
            connection,
            job,
            end=until,
            window=timedelta(seconds=window_s),
            peak_flops=runtime.settings.peak_flops,
        )
