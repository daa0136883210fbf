"""Bodies of ``/api/v1/projects/{project}/jobs``: jobs and their config versions."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from tuneloop.job_configs import ConfigKind, ObservedStatus, Origin
from tuneloop.jobs import JobKind, JobStatus, validate_job_name, validate_labels
from tuneloop.storage.types import INTEGER_MAX

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


class ConfigIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    config: dict[str, Any] = Field(examples=[{"batch_size": 64, "lr": 0.0003}])
    source: str = Field(default="api", min_length=1, max_length=50)


class DesiredConfigIn(ConfigIn):
    expected_version: int | None = Field(
        default=None,
        ge=0,
        le=INTEGER_MAX,
        description="Write only if the latest desired version is this one (0: none yet), "
        "else 409; the same as If-Match with the ETag of GET .../config",
    )


class ObservedIn(ConfigIn):
    """An observed config. What it says about the desired versions goes in the typed fields;
    the keys ``desired_version``, ``status`` and ``reason`` inside ``config`` (the agents'
    older wire format) are accepted too and stored the same way."""

    acknowledged_version: int | None = Field(
        default=None,
        ge=1,
        le=INTEGER_MAX,
        description="The released desired version the job now runs",
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
    pass (:class:`actuators.holds.Hold`)."""

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


class JobConfigOut(BaseModel):
    """The latest desired and latest observed config of a job."""

    desired: ConfigVersionOut | None
    observed: ConfigVersionOut | None
    in_sync: bool = Field(description="Whether the latest observed config equals the desired one")
    held: HeldOut | None = Field(
        default=None, description="Why the latest desired version waits; null when it does not"
    )
