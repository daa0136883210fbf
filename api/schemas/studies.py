"""Request and response bodies of the studies API (``api/routes/studies.py``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from api.schemas.common import Int64
from tuneloop.storage.models import Study, Trial
from tuneloop.storage.types import INTEGER_MAX
from tuner.memory import DEFAULT_HEADROOM
from tuner.study_options import DEFAULT_ACK_TIMEOUT_S
from tuner.trial_measurements import TrialMeasurements

Bounds = tuple[Int64, Int64]


class SpaceIn(BaseModel):
    """The standard training space (``SearchSpace.training``) and the job's own declared knobs;
    bounds are inclusive."""

    model_config = ConfigDict(extra="forbid")

    batch_size: Bounds | None = Field(
        default=None,
        description="Per-device batch size [low, high]; without it the space has no "
        "learning-rate rule and needs knobs",
    )
    knobs: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Knobs the job's agent declared, each searched over its declared range "
        "or choices (docs/agent.md, 'Knobs')",
        examples=[["loader_workers", "prefetch_factor"]],
    )
    sync_period: Bounds | None = Field(
        default=None, description="Micro-steps between gradient synchronisations [low, high]"
    )
    bucket_mb: Bounds | None = Field(default=None, description="All-reduce bucket size, MB")
    power_limit_w: Bounds | None = Field(
        default=None,
        description="The GPUs' power limit in watts [low, high], within the range the job's "
        "agent registered (docs/energy.md)",
    )
    batch_powers_of_two: bool = True
    sync_powers_of_two: bool = False
    lr_scaling: Literal["linear", "sqrt"] | None = "linear"
    base_lr: float | None = Field(default=None, description="Learning rate at base_batch")
    base_batch: int | None = Field(
        default=None, le=INTEGER_MAX, description="Global batch of base_lr (M0)"
    )
    sync_mode: Literal["accumulate", "local_sgd"] = "accumulate"


class MemoryIn(BaseModel):
    """The GPU memory bound on the batch size (docs/tuner.md, "Memory headroom")."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        default=True,
        description="Fit peak framebuffer use = fixed + per-sample x batch over the trials and "
        "stop proposing batch sizes predicted not to leave the headroom free",
    )
    headroom: float = Field(
        default=DEFAULT_HEADROOM,
        ge=0,
        lt=1,
        description="Fraction of the GPU framebuffer (used + free) a proposal must leave free",
    )


class GuardIn(BaseModel):
    """Guarded trials of an slo_throughput study (docs/tuner.md, "Guarded trials")."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        default=True,
        description="End a trial early once its P99 is over p99_factor x the SLO, and put the "
        "job back on the incumbent (the best feasible config so far, else the pre-study one)",
    )
    p99_factor: float = Field(default=1.0, gt=0, description="Of the SLO")
    after_s: float = Field(default=3.0, ge=0, description="Trial seconds before it is judged")
    hold_s: float = Field(
        default=10.0,
        ge=0,
        description="The incumbent runs this long before the next trial (doubling after each "
        "further guarded trial in a row, at most 8 x)",
    )
    explore_below: float = Field(
        default=0.8,
        gt=0,
        description="A trial starts only while the P99 of the last hold_s is at most this "
        "fraction of the SLO",
    )


class StudyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, examples=["batch-and-sync"])
    objective: str | None = Field(
        default=None,
        description="goodput, throughput, slo_throughput, step_time, samples_per_joule, "
        "tokens_per_joule or promql; default by job kind",
    )
    objective_expr: str | None = Field(
        default=None,
        description="The promql objective's expression, $job standing for the job's name "
        "(docs/tuner.md); direction is then required",
        examples=["sum(rate(tokens_total{job=$job}[1m]))"],
    )
    strategy: str = Field(default="bayesian", description="bayesian, bandit, grid or random")
    direction: Literal["maximize", "minimize"] | None = None
    seed: int | None = Field(default=None, ge=0, le=INTEGER_MAX)
    space: SpaceIn
    strategy_options: dict[str, Any] = Field(default_factory=dict)
    measurement: dict[str, Int64 | float] = Field(
        default_factory=dict,
        description="warmup_s, warmup_samples, window_s, min_samples, max_rel_stderr, "
        "max_age_s, max_extensions, budget_s",
    )
    ranks: int | None = Field(
        default=None, ge=1, le=INTEGER_MAX, description="Default: ranks seen reporting"
    )
    slo_s: float | None = Field(default=None, gt=0, description="P99 bound (slo_throughput)")
    throughput_floor: float | None = Field(
        default=None,
        gt=0,
        description="samples_per_joule / tokens_per_joule: a configuration slower than this "
        "(samples/s or tokens/s) is infeasible",
    )
    driven_by: Literal["tuner", "agent"] = "tuner"
    max_trials: int | None = Field(default=None, ge=1, le=INTEGER_MAX)
    ack_timeout_s: float = Field(default=DEFAULT_ACK_TIMEOUT_S, gt=0)
    memory: MemoryIn = Field(default_factory=MemoryIn)
    guard: GuardIn = Field(default_factory=GuardIn)
    warm_start: bool = Field(
        default=True, description="Start from earlier studies of jobs with the same signature"
    )


class StudyFromDiagnosisIn(BaseModel):
    """A study over the knobs the job's diagnosis points at (docs/diagnosis.md)."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Default: diagnosis-<verdict>-<time>",
    )
    window: str = Field(default="5m", description="The diagnosis window, e.g. 5m, 300")
    strategy: str = Field(default="bayesian", description="bayesian, bandit, grid or random")
    seed: int | None = Field(default=None, ge=0, le=INTEGER_MAX)
    strategy_options: dict[str, Any] = Field(default_factory=dict)
    measurement: dict[str, Int64 | float] = Field(default_factory=dict)
    max_trials: int | None = Field(default=None, ge=1, le=INTEGER_MAX)
    ack_timeout_s: float = Field(default=DEFAULT_ACK_TIMEOUT_S, gt=0)
    warm_start: bool = True


class StudyOut(BaseModel):
    id: int
    job_id: int
    name: str
    objective: str
    direction: str
    strategy: str
    state: Literal["running", "stopped", "complete", "failed", "cancelled"] = Field(
        description="running or stopped (resumable), or how it ended: complete, failed, cancelled"
    )
    seed: int | None
    space: dict[str, Any]
    options: dict[str, Any]
    created_at: datetime
    baseline_version: int | None = Field(
        description="The job's desired version before the first trial (the pre-study config, "
        "measured by the study's baseline trial)"
    )
    end_reason: str = Field(
        description="Why the study ended or was stopped, and which config it left the job on"
    )
    ended_at: datetime | None
    outcome_version: int | None = Field(
        description="The desired version the study left the job on (None: it wrote none, the "
        "job stays on its pre-study config or on one someone else wrote)"
    )

    @classmethod
    def of(cls, study: Study) -> StudyOut:
        return cls(
            id=study.id,
            job_id=study.job_id,
            name=study.name,
            objective=study.objective,
            direction=study.direction,
            strategy=study.strategy,
            state=study.state,
            seed=study.seed,
            space=dict(study.space),
            options=dict(study.options or {}),
            created_at=study.created_at,
            baseline_version=study.baseline_version,
            end_reason=study.end_reason or "",
            ended_at=study.ended_at,
            outcome_version=study.outcome_version,
        )


class DiagnosedStudyOut(StudyOut):
    """A study started from a diagnosis, with the verdict that chose its knobs."""

    verdict: str = Field(description="The job's diagnosis when the study was created")
    knobs: list[str] = Field(description="The knobs the verdict points at that the job declared")


class TrialOut(BaseModel):
    number: int
    state: str
    baseline: bool = Field(description="Measures the job's pre-study config")
    params: dict[str, Any] = Field(description="The configuration, with its learning_rate")
    value: float | None
    stderr: float | None
    reason: str
    desired_version: int | None
    applied_at: datetime | None
    extensions: int
    started_at: datetime
    completed_at: datetime | None
    measurements: dict[str, Any]

    @classmethod
    def of(cls, trial: Trial) -> TrialOut:
        stored = TrialMeasurements.from_json(trial.measurements)
        return cls(
            number=trial.number,
            state=trial.state,
            baseline=trial.baseline,
            params=dict(trial.params),
            value=trial.value,
            stderr=stored.stderr,
            reason=stored.reason,
            desired_version=trial.desired_version,
            applied_at=trial.applied_at,
            extensions=trial.extensions,
            started_at=trial.started_at,
            completed_at=trial.completed_at,
            measurements=dict(stored.data),
        )


class StudyUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    state: Literal["running", "stopped"] = Field(
        description="stopped: no new trials (the running one fails) and the job goes back on "
        "its pre-study config; running: resume"
    )


class AskIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    context: dict[str, float] = Field(
        default_factory=dict, description="Current conditions (load, contention)"
    )


class TellIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    state: Literal["complete", "infeasible", "failed"]
    value: float | None = Field(default=None, description="Required for complete, else absent")
    stderr: float | None = Field(default=None, ge=0)
    reason: str | None = Field(
        default=None, max_length=1000, description="Required unless complete; 'oom' for OOM"
    )
    measurements: dict[str, Any] = Field(default_factory=dict)
