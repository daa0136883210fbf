"""Job agents: registration of a job's host, ranks and the GPUs each rank uses.

The ``job_gpus`` rows are what attributes GPU metrics to jobs, projects and teams without
Kubernetes: every GPU series carries the GPU's ``UUID`` label (dcgm-exporter, DCGM and NVML
sources alike), and a join on it finds the job (see ``docs/agent.md``).

Registering and acknowledging take the ``actor`` and write their audit entries themselves.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tuneloop import job_configs
from tuneloop.accounts import record_job_audit
from tuneloop.errors import Conflict, InvalidInput, NotFound
from tuneloop.storage.models import Job, JobAgent, JobConfig, JobGpu, Project
from tuneloop.storage.types import utcnow

GPU_UUID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,99}")
HOST_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,254}")
MAX_RANKS_PER_AGENT: Final = 4096
MAX_GPUS_PER_RANK: Final = 64


@dataclass(frozen=True, slots=True)
class RankGpus:
    """One rank of a job and the UUIDs of the GPUs it uses (none on a CPU job)."""

    rank: int
    gpu_uuids: Sequence[str] = ()
    host: str | None = None
    """The rank's own host; ``None``: the registering agent's."""


def validate_ranks(ranks: Sequence[RankGpus], world_size: int) -> None:
    if world_size < 1:
        raise InvalidInput(f"world_size must be >= 1, got {world_size}")
    if len(ranks) > MAX_RANKS_PER_AGENT:
        raise InvalidInput(f"at most {MAX_RANKS_PER_AGENT} ranks per registration")
    seen: set[int] = set()
    for entry in ranks:
        if not 0 <= entry.rank < world_size:
            raise InvalidInput(f"rank {entry.rank} is outside 0..{world_size - 1}")
        if entry.rank in seen:
            raise InvalidInput(f"rank {entry.rank} is listed twice")
        seen.add(entry.rank)
        if entry.host is not None and not HOST_RE.fullmatch(entry.host):
            raise InvalidInput(f"rank {entry.rank}: invalid host name {entry.host!r}")
        if len(entry.gpu_uuids) > MAX_GPUS_PER_RANK:
            raise InvalidInput(f"rank {entry.rank}: at most {MAX_GPUS_PER_RANK} GPUs")
        for uuid in entry.gpu_uuids:
            if not GPU_UUID_RE.fullmatch(uuid):
                raise InvalidInput(
                    f"rank {entry.rank}: invalid GPU UUID {uuid!r} (as nvidia-smi -L prints "
                    "it, e.g. GPU-5c4ec6a1-...)"
                )


def register_agent(
    session: Session,
    job: Job,
    *,
    host: str,
    world_size: int,
    ranks: Sequence[RankGpus],
    pid: int | None = None,
    details: Mapping[str, Any] | None = None,
    knobs: Mapping[str, Mapping[str, Any]] | None = None,
    actor: str | None = None,
) -> JobAgent:
    """Record a job's agent, the host and GPUs of its ranks and the knobs the job declares
    (name -> declaration, validated by the caller: ``tuner.knobs.parse_knobs``). A job
    restarted on other GPUs registers again; earlier registrations stay, for attributing past
    metrics. With ``actor`` the audit log says who registered it."""
    if not HOST_RE.fullmatch(host):
        raise InvalidInput(f"invalid host name {host!r}")
    validate_ranks(ranks, world_size)
    agent = JobAgent(
        job_id=job.id,
        host=host,
        pid=pid,
        world_size=world_size,
        details=dict(details or {}),
        knobs={name: dict(declared) for name, declared in (knobs or {}).items()},
        rank_hosts={str(r.rank): r.host or host for r in ranks},
    )
    session.add(agent)
    session.flush()
    for entry in ranks:
        for uuid in dict.fromkeys(entry.gpu_uuids):
            session.add(
                JobGpu(
                    agent_id=agent.id,
                    job_id=job.id,
                    rank=entry.rank,
                    host=entry.host or host,
                    gpu_uuid=uuid,
                )
            )
    session.flush()
    if actor is not None:
        registered = {
            "agent_id": agent.id,
            "host": host,
            "pid": pid,
            "world_size": world_size,
            "ranks": [
                {"rank": r.rank, "gpu_uuids": list(r.gpu_uuids), "host": r.host or host}
                for r in ranks
            ],
            "details": dict(details or {}),
            "knobs": dict(knobs or {}),
        }
        record_job_audit(session, actor, "job.agent.register", job, registered)
    return agent


def acknowledge(
    session: Session, job: Job, *, agent_id: int, version: int, step: int | None, actor: str
) -> JobConfig:
    """Agent ``agent_id`` of ``job`` runs released version ``version`` (from ``step``): store
    it as observed (:func:`tuneloop.job_configs.acknowledge`) and audit it. Raises
    :class:`NotFound` or :class:`Conflict` for a version never released to the job or an agent
    of another job; :func:`audit_refused_ack` records those."""
    agent = agent_of_job(session, job, agent_id)
    observed = job_configs.acknowledge(session, job, version)
    touch(agent)
    ack = {"agent_id": agent_id, "version": version, "step": step}
    record_job_audit(session, actor, "job.config.ack", job, ack)
    return observed


def audit_refused_ack(
    session: Session,
    job: Job,
    *,
    agent_id: int,
    version: int,
    step: int | None,
    reason: str,
    actor: str,
) -> None:
    """Audit an acknowledgement :func:`acknowledge` refused (in a transaction of the caller's
    that outlives the refused one)."""
    refused = {"agent_id": agent_id, "version": version, "step": step, "reason": reason}
    record_job_audit(session, actor, "job.config.ack_refused", job, refused)


def agent_of_job(session: Session, job: Job, agent_id: int) -> JobAgent:
    """The registration ``agent_id`` of ``job``: :class:`NotFound` when there is none in the
    job's project, :class:`Conflict` when it belongs to another job."""
    agent = session.get(JobAgent, agent_id)
    if agent is None:
        raise NotFound(f"agent {agent_id} not found")
    if agent.job_id != job.id:
        owner = session.get(Job, agent.job_id)
        if owner is None or owner.project_id != job.project_id:
            raise NotFound(f"agent {agent_id} not found")
        raise Conflict(f"agent {agent_id} is registered to job {owner.name!r}, not {job.name!r}")
    return agent


def touch(agent: JobAgent) -> None:
    agent.last_seen_at = utcnow()


def last_seen(session: Session, job: Job) -> datetime | None:
    """When any agent of ``job`` last registered, long-polled or acknowledged (``None``: never)."""
    return session.scalar(select(func.max(JobAgent.last_seen_at)).where(JobAgent.job_id == job.id))


def require_live_agent(session: Session, job: Job, within_s: float) -> None:
    """Refuse (:class:`InvalidInput`) to tune a job whose agent has not been heard from
    (registered, long-polled or acknowledged) within ``within_s`` (a study's
    ``ack_timeout_s``): nothing would apply its trials, and each would time out."""
    seen = last_seen(session, job)
    if seen is None:
        raise InvalidInput(
            f"job {job.name!r} has no agent: start the job with the tuneloop agent "
            "(docs/agent.md), which registers it, before creating a study"
        )
    silent = (utcnow() - seen).total_seconds()
    if silent > within_s:
        raise InvalidInput(
            f"job {job.name!r}: its agent was last seen {silent:.0f} s ago, more than "
            f"ack_timeout_s ({within_s:g} s); restart the job's agent (docs/agent.md)"
        )


def list_agents(session: Session, job: Job) -> list[JobAgent]:
    return list(
        session.scalars(select(JobAgent).where(JobAgent.job_id == job.id).order_by(JobAgent.id))
    )


def latest_agent(session: Session, job: Job) -> JobAgent | None:
    """The job's newest registration: what the job runs now declares its knobs there."""
    return session.scalars(
        select(JobAgent).where(JobAgent.job_id == job.id).order_by(JobAgent.id.desc()).limit(1)
    ).first()


def agent_gpus(session: Session, agent: JobAgent) -> list[JobGpu]:
    return list(
        session.scalars(
            select(JobGpu).where(JobGpu.agent_id == agent.id).order_by(JobGpu.rank, JobGpu.id)
        )
    )


@dataclass(frozen=True, slots=True)
class GpuOwner:
    gpu_uuid: str
    job: Job
    rank: int
    host: str
    agent_id: int


def gpu_owners(session: Session, project: Project, uuids: Sequence[str]) -> list[GpuOwner]:
    """The jobs of ``project`` that most recently registered each GPU of ``uuids``."""
    rows = session.execute(
        select(JobGpu, Job)
        .join(Job, Job.id == JobGpu.job_id)
        .where(Job.project_id == project.id, JobGpu.gpu_uuid.in_(list(uuids)))
        .order_by(JobGpu.gpu_uuid, JobGpu.agent_id.desc())
    ).all()
    latest: dict[str, GpuOwner] = {}
    for gpu, job in rows:
        latest.setdefault(
            gpu.gpu_uuid, GpuOwner(gpu.gpu_uuid, job, gpu.rank, gpu.host, gpu.agent_id)
        )
    return list(latest.values())
