"""Studies through the API: turn a request into the tuner's objects and call its service."""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy.orm import Session

from api.schemas.studies import SpaceIn, StudyCreate, StudyFromDiagnosisIn
from api.services.knobs import declared_knobs
from tuneloop import job_agents
from tuneloop.storage.models import Job, Study
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.types import utcnow
from tuner import service
from tuner.diagnosis import Diagnosis
from tuner.knobs import Knob, diagnosis_space
from tuner.objectives import default_objective
from tuner.space import SearchSpace, SpaceError, power_limit_param
from tuner.study_options import GuardPolicy, MemoryPolicy, StudyOptions, measurement_policy


def create_study(
    session: Session,
    job: Job,
    body: StudyCreate,
    *,
    actor: str,
    series: TimeSeriesBackend | None = None,
) -> Study:
    """Validate ``body`` (space, objective, strategy and its options, measurement policy,
    step-timing data of the job, its agent, its pre-study config) and create the study.
    Raises :mod:`tuneloop.errors` kinds with one-line reasons (invalid input, among them a
    loop-driven study of a job no agent is serving; a conflict for a taken name)."""
    objective = body.objective or default_objective(job.kind).name
    space = _space(body.space, declared_knobs(session, job))
    options = StudyOptions(
        strategy_options=body.strategy_options,
        measurement=measurement_policy(body.measurement),
        ranks=body.ranks,
        slo_s=body.slo_s,
        driven_by=body.driven_by,
        max_trials=body.max_trials,
        ack_timeout_s=body.ack_timeout_s,
        memory=MemoryPolicy(enabled=body.memory.enabled, headroom=body.memory.headroom),
        objective_expr=body.objective_expr,
        throughput_floor=body.throughput_floor,
        guard=GuardPolicy(**body.guard.model_dump()),
    )
    return _create(
        session, job, body.name, objective, space, body, options, actor=actor, series=series
    )


def _create(
    session: Session,
    job: Job,
    name: str,
    objective: str,
    space: SearchSpace,
    body: StudyCreate | StudyFromDiagnosisIn,
    options: StudyOptions,
    *,
    actor: str,
    series: TimeSeriesBackend | None,
) -> Study:
    ranks_seen = service.require_step_timing(session, job, objective, series)
    if options.driven_by == "tuner":
        job_agents.require_live_agent(session, job, options.ack_timeout_s)
    if options.ranks is None and ranks_seen:
        options = replace(options, ranks=ranks_seen)
    return service.create_study(
        session,
        job,
        name=name,
        objective=objective,
        space=space,
        strategy=body.strategy,
        direction=getattr(body, "direction", None),
        seed=body.seed,
        options=options,
        warm_start=body.warm_start,
        actor=actor,
    )


def create_from_diagnosis(
    session: Session,
    job: Job,
    body: StudyFromDiagnosisIn,
    found: Diagnosis,
    *,
    actor: str,
    series: TimeSeriesBackend | None = None,
) -> tuple[Study, list[str]]:
    """A tuner-driven study of ``job``'s throughput over the declared knobs its diagnosis
    ``found`` points at (:data:`tuner.knobs.VERDICT_KNOBS`); a conflict naming the verdict when
    it points at none the job declared. Returns the study and its knobs."""
    space = diagnosis_space(found.verdict, declared_knobs(session, job))
    name = body.name or f"diagnosis-{found.verdict.value}-{utcnow():%Y%m%dT%H%M%S}"
    options = StudyOptions(
        strategy_options=body.strategy_options,
        measurement=measurement_policy(body.measurement),
        driven_by="tuner",
        max_trials=body.max_trials,
        ack_timeout_s=body.ack_timeout_s,
        memory=MemoryPolicy(),
    )
    # Throughput, not goodput: a loader or interconnect knob leaves the batch (and with it the
    # statistical efficiency) as it is.
    study = _create(
        session, job, name, "throughput", space, body, options, actor=actor, series=series
    )
    return study, list(space.names)


def _space(body: SpaceIn, declared: list[Knob]) -> SearchSpace:
    """The study's space: the standard training parameters (with ``batch_size``) and the
    declared knobs it names, each over its declared range."""
    by_name = {k.name: k for k in declared}
    unknown = [name for name in body.knobs if name not in by_name]
    if unknown:
        raise SpaceError(
            f"space.knobs: the job declared no knob {unknown[0]!r} (declared: "
            f"{sorted(by_name) or 'none'}; a job declares its knobs through its agent, "
            "docs/agent.md)"
        )
    knobs = [by_name[name].param for name in dict.fromkeys(body.knobs)]
    if body.power_limit_w:
        knobs.insert(0, power_limit_param(*body.power_limit_w))
    if body.batch_size is None:
        _refuse_training_fields(body)
        if not knobs:
            raise SpaceError(
                "the space needs batch_size, or knobs the job declared (declared: "
                f"{sorted(by_name) or 'none'}), or power_limit_w"
            )
        return SearchSpace(tuple(knobs), None)
    return SearchSpace.training(
        batch_size=body.batch_size,
        sync_period=body.sync_period,
        bucket_mb=body.bucket_mb,
        batch_powers_of_two=body.batch_powers_of_two,
        sync_powers_of_two=body.sync_powers_of_two,
        lr_scaling=body.lr_scaling,
        base_lr=body.base_lr,
        base_batch=body.base_batch,
        sync_mode=body.sync_mode,
        extra=knobs,
    )


def _refuse_training_fields(body: SpaceIn) -> None:
    """Without ``batch_size`` there is no learning-rate rule: a training field would be
    ignored, so it is refused instead (a job declares its sync period or bucket size as
    knobs)."""
    given = [
        name
        for name in ("sync_period", "bucket_mb", "base_lr", "base_batch")
        if getattr(body, name) is not None
    ]
    if "lr_scaling" in body.model_fields_set and body.lr_scaling is not None:
        given.append("lr_scaling")
    if given:
        verb = "needs" if len(given) == 1 else "need"
        fields = ", ".join(f"space.{name}" for name in given)
        raise SpaceError(f"{fields} {verb} space.batch_size")
