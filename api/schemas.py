"""Request and response bodies of the HTTP API, kept apart from the tables."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from api.services.jobs import JobKind, JobStatus, validate_job_name, validate_labels
from tuneloop.accounts import Role, validate_project_name, validate_token_name
from tuneloop.job_configs import ConfigKind, ObservedStatus, Origin

ProjectName = Annotated[
    str,
    AfterValidator(validate_project_name),
    Field(description="1-100 lowercase letters, digits, '-' or '_'", examples=["vision-team"]),
]
TokenName = Annotated[
    str,
    AfterValidator(validate_token_name),
    Field(description="1-100 characters, no control characters", examples=["ci-agent"]),
]
JobName = Annotated[
    str,
    AfterValidator(validate_job_name),
    Field(
        description="1-200 letters, digits, '.', '_', ':', '@' or '-'; not all digits",
        examples=["llama-70b-sft"],
    ),
]
Labels = Annotated[
    dict[str, str],
    AfterValidator(validate_labels),
    Field(description="String labels, Prometheus-style names", examples=[{"team": "vision"}]),
]


class ErrorBody(BaseModel):
    """Every error response: a message (or a list of validation problems) and a stable code."""

    detail: str | list[Any]
    code: str = Field(examples=["not_found"])


T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    """One page of a list. ``next_offset`` is ``None`` on the last page."""

    items: list[T]
    limit: int
    offset: int
    next_offset: int | None


# --------------------------------------------------------------------------- projects


class ProjectCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: ProjectName
    max_series: int | None = Field(default=None, ge=1)


class ProjectOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    max_series: int | None
    created_at: datetime


# --------------------------------------------------------------------------- tokens


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: TokenName
    role: Role = Field(
        default="agent",
        description="member or agent under a project; admin tokens via POST /api/v1/tokens",
    )
    expires_at: AwareDatetime | None = None


class AdminTokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: TokenName
    expires_at: AwareDatetime | None = None


class TokenOut(BaseModel):
    """A token as listed: never its secret or hash, only the first characters (``prefix``)."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    role: Role
    project_id: int | None
    prefix: str
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None
    revoked_at: datetime | None


class TokenCreated(TokenOut):
    secret: str = Field(description="The bearer secret. Shown only in this response.")


# --------------------------------------------------------------------------- jobs


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: JobName
    kind: JobKind = "training"
    labels: Labels = Field(default_factory=dict)
    status: JobStatus = "pending"


class JobUpdate(BaseModel):
    """Fields to change; ``labels`` replaces the whole label set."""

    model_config = ConfigDict(extra="forbid")

    status: JobStatus | None = None
    labels: Labels | None = None


class JobOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    project_id: int
    name: str
    kind: str
    labels: dict[str, str]
    status: str
    created_at: datetime
    updated_at: datetime


class ConfigWrite(BaseModel):
    model_config = ConfigDict(extra="forbid")

    config: dict[str, Any] = Field(examples=[{"batch_size": 64, "lr": 0.0003}])
    source: str = Field(default="api", min_length=1, max_length=50)


class ObservedWrite(ConfigWrite):
    """An observed config. What it says about the desired versions goes in the typed fields;
    the keys ``desired_version``, ``status`` and ``reason`` inside ``config`` (the agents'
    older wire format) are accepted too and stored the same way."""

    acknowledged_version: int | None = Field(
        default=None, ge=1, description="The released desired version the job now runs"
    )
    status: ObservedStatus | None = Field(
        default=None, description="running (the default), or oom / failed: it could not run it"
    )
    reason: str | None = Field(default=None, max_length=2000, description="Why it could not")


class ConfigVersionOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    kind: ConfigKind
    version: int = Field(
        description="Desired: the number agents run and acknowledge. Observed: the n-th report "
        "of the job; which desired version it runs is acknowledged_version"
    )
    config: dict[str, Any] = Field(description="The job's settings")
    source: str = Field(description="Free text of the writer, for the audit trail")
    origin: Origin = Field(
        description="Who wrote it: api, agent, tuner-trial, study-outcome or actuator"
    )
    origin_study_id: int | None = Field(
        default=None, description="The study behind a tuner-trial or study-outcome version"
    )
    acknowledged_version: int | None = Field(
        default=None,
        description="Observed: the desired version the job says it runs (null: it did not "
        "say); null on desired versions",
    )
    status: ObservedStatus | None = Field(
        default=None, description="Observed: running, oom or failed; null on desired versions"
    )
    reason: str | None = Field(
        default=None, description="Observed: why the job could not run it; null on desired"
    )
    created_at: datetime

    @model_validator(mode="after")
    def _only_observed_report(self) -> ConfigVersionOut:
        # Desired rows carry the columns' defaults, which say nothing about them.
        if self.kind == "desired":
            self.status = self.reason = None
        return self


class HeldOut(BaseModel):
    """Why the job's newest desired version is not released yet, as of the actuator's last
    pass (:class:`tuner.actuators.holds.Hold`)."""

    model_config = ConfigDict(from_attributes=True)

    reason: str = Field(
        description="frozen, awaiting_approval, dry_run, out_of_bounds, verifying, "
        "awaiting_measurements or measuring_baseline"
    )
    version: int | None = Field(description="The desired version held")
    until: datetime | None = Field(
        description="When the hold ends by itself; null when only a person ends it"
    )
    message: str


class ReleasedConfigOut(ConfigVersionOut):
    """The desired version a job should run, and what holds back a newer one."""

    held: HeldOut | None = Field(
        default=None, description="Why a newer desired version waits; null when none does"
    )


class JobConfigState(BaseModel):
    """The latest desired and latest observed config of a job."""

    desired: ConfigVersionOut | None
    observed: ConfigVersionOut | None
    in_sync: bool = Field(description="Whether the latest observed config equals the desired one")
    held: HeldOut | None = Field(
        default=None, description="Why the latest desired version waits; null when it does not"
    )


# --------------------------------------------------------------------------- health


class CheckResult(BaseModel):
    ok: bool | None = Field(description="None when the dependency is not configured")
    latency_ms: float | None = None
    error: str | None = None


class CollectorCheck(BaseModel):
    """One source of a collector running in this process (host, GPUs, exporters)."""

    ok: bool | None = Field(description="None until its first poll")
    last_error: str | None = None
    last_success_at: datetime | None = None
    consecutive_failures: int = 0


class NotifierCheck(BaseModel):
    """One alert receiver (``project/receiver``): failing after 3 failed attempts in a row."""

    ok: bool
    kind: str
    consecutive_failures: int
    last_success_at: datetime | None = None
    last_error: str | None = None


class HealthOut(BaseModel):
    status: Literal["ok", "degraded"]
    checks: dict[str, CheckResult]
    collectors: dict[str, CollectorCheck] = Field(
        default_factory=dict,
        description="Sources polled by this process; a failing one makes the status "
        "degraded but never the response 503",
    )
    notifiers: dict[str, NotifierCheck] = Field(
        default_factory=dict,
        description="Alert receivers; one that keeps failing makes the status degraded but "
        "never the response 503",
    )


# --------------------------------------------------------------------------- agents and actuator


class RankIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rank: int = Field(ge=0)
    gpu_uuids: list[str] = Field(
        default_factory=list, examples=[["GPU-5c4ec6a1-3b2f-8e2d-7f0a-1b2c3d4e5f60"]]
    )


class AgentRegister(BaseModel):
    """What a job's agent reports when it starts."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(min_length=1, max_length=255, examples=["gpu-node-7"])
    pid: int | None = Field(default=None, ge=0)
    world_size: int = Field(ge=1, examples=[8])
    ranks: list[RankIn] = Field(description="The ranks this agent speaks for, with their GPUs")
    config: dict[str, Any] | None = Field(
        default=None,
        description="The config the job started with: becomes desired version 1 (released "
        "and good) when the job has no released version yet, so a rollback can return to it",
    )
    details: dict[str, Any] = Field(default_factory=dict, examples=[{"framework": "torch"}])


class RankOut(BaseModel):
    rank: int
    gpu_uuids: list[str]


class AgentOut(BaseModel):
    id: int
    job_id: int
    host: str
    pid: int | None
    world_size: int
    ranks: list[RankOut]
    details: dict[str, Any]
    registered_at: datetime
    last_seen_at: datetime
    released: ReleasedConfigOut | None = Field(
        default=None, description="The desired version the job should run now"
    )


class AckIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_id: int = Field(ge=1)
    version: int = Field(ge=1, description="The released desired version the job now runs")
    step: int | None = Field(default=None, ge=0, description="The step it took effect at")


class GpuOwnerOut(BaseModel):
    gpu_uuid: str
    job_id: int
    job: str
    labels: dict[str, str]
    rank: int
    host: str
    agent_id: int


class ActuatorOut(BaseModel):
    """A job's actuation policy and the reconcile loop's progress."""

    policy: dict[str, Any]
    goal_version: int | None
    released_version: int | None
    last_good_version: int | None
    approved_version: int | None
    changed_at: datetime | None
    conditions: dict[str, Any]
    held: HeldOut | None = Field(
        default=None, description="Why the goal is not released yet; null when nothing waits"
    )


class ApproveIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=1, description="Allow desired versions up to this one")


class ConfigMarkOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    version: int
    config: dict[str, Any]
    verdict: str
    reason: str
    evidence: dict[str, Any]
    created_at: datetime
