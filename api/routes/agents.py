"""The job agent protocol: ``/api/v1/projects/{project}/jobs/{job}/...``.

1. ``POST .../agents``: the agent registers (host, ranks, GPU UUIDs, its starting config).
2. ``GET .../config/next?after=V``: long-poll for a released desired version newer than V.
3. ``POST .../config/ack``: the job now runs version V (from the step it names).

The long-poll holds no database connection while it waits: it re-reads the store when a
write in this process wakes it, and every :data:`RECHECK_S` for writes made elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response, status
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from actuators.holds import hold
from actuators.job import adopt_initial
from actuators.tasks import reconcile_now
from api.deps import (
    API_PREFIX,
    AUTH_ERRORS,
    BearerCredentials,
    CurrentToken,
    ProjectDep,
    RuntimeDep,
    SessionDep,
    get_current_token,
    get_project,
)
from api.routes.jobs import JOB_REF_DOC, JobDep
from api.schemas.agents import AckIn, AgentCreate, AgentOut, GpuOwnerOut, RankOut
from api.schemas.jobs import ConfigVersionOut, ReleasedConfigOut
from tuneloop import accounts, job_agents, job_configs, jobs
from tuneloop.config_events import EVENTS
from tuneloop.errors import Conflict, NotFound
from tuneloop.storage import session_scope
from tuneloop.storage.models import ApiToken, Job, JobAgent
from tuneloop.storage.types import INTEGER_MAX
from tuner.knobs import parse_knobs, stored_knobs

log = logging.getLogger(__name__)

router = APIRouter(
    prefix=f"{API_PREFIX}/projects/{{project}}", tags=["agents"], responses=AUTH_ERRORS
)

RECHECK_S = 1.0
"""How often a waiting long-poll re-reads the store for writes from other processes."""
MAX_POLL_S = 120.0


def _agent_out(session: Session, agent: JobAgent, job: Job) -> AgentOut:
    ranks: dict[int, list[str]] = {int(rank): [] for rank in agent.rank_hosts}
    for gpu in job_agents.agent_gpus(session, agent):
        ranks.setdefault(gpu.rank, []).append(gpu.gpu_uuid)
    released = _released_out(session, job)
    return AgentOut(
        id=agent.id,
        job_id=agent.job_id,
        host=agent.host,
        pid=agent.pid,
        world_size=agent.world_size,
        ranks=[
            RankOut(rank=r, gpu_uuids=u, host=agent.rank_hosts.get(str(r)))
            for r, u in sorted(ranks.items())
        ],
        details=agent.details,
        knobs=[{"name": name, **declared} for name, declared in agent.knobs.items()],
        registered_at=agent.registered_at,
        last_seen_at=agent.last_seen_at,
        released=released,
    )


def _released_out(session: Session, job: Job) -> ReleasedConfigOut | None:
    """The version the job should run, and what holds back a newer one."""
    released = job_configs.released_config(session, job)
    if released is None:
        return None
    return ReleasedConfigOut(
        **ConfigVersionOut.model_validate(released).model_dump(),
        held=hold(job_configs.actuator_row(session, job)),
    )


@router.post(
    "/jobs/{job}/agents", status_code=status.HTTP_201_CREATED, summary="Register a job's agent"
)
def register_agent(
    body: AgentCreate, job: JobDep, session: SessionDep, token: CurrentToken
) -> AgentOut:
    """Records the host, ranks and GPU UUIDs (so GPU metrics are attributed to the job) and,
    with ``config``, adopts the job's starting config as desired version 1 when nothing was
    released yet. ``released`` in the answer is the version the job should run. ``knobs``
    are refused with 422 naming the first bad declaration."""
    knobs = stored_knobs(parse_knobs(body.knobs))
    agent = job_agents.register_agent(
        session,
        job,
        host=body.host,
        world_size=body.world_size,
        ranks=[job_agents.RankGpus(r.rank, r.gpu_uuids, r.host) for r in body.ranks],
        pid=body.pid,
        details=body.details,
        knobs=knobs,
        actor=accounts.actor_name(token),
    )
    if body.config is not None:
        adopt_initial(session, job, body.config)
    return _agent_out(session, agent, job)


@router.get("/jobs/{job}/agents", summary="A job's agent registrations, newest last")
def list_agents(job: JobDep, session: SessionDep) -> list[AgentOut]:
    return [_agent_out(session, agent, job) for agent in job_agents.list_agents(session, job)]


@router.get("/gpus", summary="Which job uses each GPU (by UUID)")
def gpu_owners(
    project: ProjectDep,
    session: SessionDep,
    uuid: Annotated[list[str], Query(min_length=1, max_length=1000, description="GPU UUIDs")],
) -> list[GpuOwnerOut]:
    """The job (and its labels, e.g. team) that last registered each GPU; unknown UUIDs are
    left out. The same join, in SQL, is in ``docs/agent.md``."""
    return [
        GpuOwnerOut(
            gpu_uuid=owner.gpu_uuid,
            job_id=owner.job.id,
            job=owner.job.name,
            labels=owner.job.labels,
            rank=owner.rank,
            host=owner.host,
            agent_id=owner.agent_id,
        )
        for owner in job_agents.gpu_owners(session, project, uuid)
    ]


# --------------------------------------------------------------------------- long-poll


@dataclass(frozen=True)
class _JobRef:
    job_id: int
    project_id: int
    name: str


def _resolve_job(
    runtime: RuntimeDep,
    credentials: BearerCredentials,
    project: Annotated[str, Path()],
    job: Annotated[str, Path(description=JOB_REF_DOC)],
) -> _JobRef:
    """Authenticate and find the job in a short session of its own (not held while waiting)."""
    with session_scope(runtime.sessions) as session:
        token = get_current_token(session, credentials)
        found_project = get_project(project, session, token)
        found = jobs.get_job(session, found_project, job)
        return _JobRef(found.id, found_project.id, found.name)


def _check(
    runtime: RuntimeDep, ref: _JobRef, after: int, agent_id: int | None
) -> ReleasedConfigOut | None:
    """Reconcile the job (releases a waiting desired version at once) and return the released
    version if it is newer than ``after``."""
    # A conflict means another reconciler acted: what it released is read below.
    reconcile_now(runtime.sessions, ref.job_id, series=runtime.remote_series)
    with session_scope(runtime.sessions) as session:
        job = session.get(Job, ref.job_id)
        if job is None:
            raise NotFound(f"job {ref.name!r} not found")
        if agent_id is not None:
            agent = job_agents.agent_of_job(session, job, agent_id)
            job_agents.touch(agent)
        released = _released_out(session, job)
        if released is None or released.version <= after:
            return None
        return released


@router.get(
    "/jobs/{job}/config/next",
    summary="Long-poll for a released config newer than a version",
    responses={204: {"description": "No newer version within the timeout"}},
)
async def next_config(
    request: Request,
    ref: Annotated[_JobRef, Depends(_resolve_job)],
    runtime: RuntimeDep,
    after: Annotated[
        int, Query(ge=0, le=INTEGER_MAX, description="The version the job runs (0: none)")
    ] = 0,
    timeout: Annotated[float, Query(ge=0, le=MAX_POLL_S, description="Seconds to wait")] = 30.0,
    agent: Annotated[
        int | None, Query(ge=1, le=INTEGER_MAX, description="The asking agent's id")
    ] = None,
) -> Response:
    """Answers at once with the released desired version when it is newer than ``after``,
    else waits up to ``timeout`` seconds for one and answers 204 if none came. ``held`` says
    why a newer desired version is not released yet (freeze, approval, ...) and until when."""
    deadline = time.monotonic() + timeout
    while True:
        with EVENTS.subscribe(ref.job_id) as changed:
            try:
                found = await run_in_threadpool(_check, runtime, ref, after, agent)
            except OperationalError as exc:
                # A busy SQLite writer lock or a database blip: the waiting agent is better
                # served by another look in a moment than by an error.
                log.info("job %s: long-poll check failed, retrying: %s", ref.name, exc)
                found = None
            if found is not None:
                return Response(found.model_dump_json(), media_type="application/json")
            remaining = deadline - time.monotonic()
            if remaining <= 0 or await request.is_disconnected():
                return Response(status_code=status.HTTP_204_NO_CONTENT)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=min(remaining, RECHECK_S))


# --------------------------------------------------------------------------- ack


def _refuse(runtime: RuntimeDep, token: ApiToken, job: Job, body: AckIn, why: str) -> None:
    """Log and audit a refused ack in a transaction of its own (the request's rolls back)."""
    log.warning(
        "job %s: refused ack of version %d by agent %d: %s",
        job.name,
        body.version,
        body.agent_id,
        why,
    )
    with session_scope(runtime.sessions) as session:
        job_agents.audit_refused_ack(
            session, job, **body.model_dump(), reason=why, actor=accounts.actor_name(token)
        )


@router.post(
    "/jobs/{job}/config/ack",
    status_code=status.HTTP_201_CREATED,
    summary="Acknowledge the released version the job now runs",
    responses={
        409: {"description": "A version never released to this job, or another job's agent"}
    },
)
def acknowledge(
    body: AckIn, job: JobDep, session: SessionDep, token: CurrentToken, runtime: RuntimeDep
) -> ConfigVersionOut:
    """Stores the job's next observed version: the desired config of ``version``, with
    ``acknowledged_version`` = ``version`` (repeating the ack answers the same one). Refused with
    409, and written to the audit log, when the version was never released to this job or the
    agent is registered to another job."""
    try:
        observed = job_agents.acknowledge(
            session, job, **body.model_dump(), actor=accounts.actor_name(token)
        )
    except (Conflict, NotFound) as exc:
        _refuse(runtime, token, job, body, str(exc))
        raise
    return ConfigVersionOut.model_validate(observed)
