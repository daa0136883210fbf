"""Studies through the API: turn a request into the tuner's objects and call its service."""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy.orm import Session

from api.schemas.studies import SpaceIn, StudyCreate
from tuneloop import job_agents
from tuneloop.storage.models import Job, Study
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuner import service
from tuner.objectives import default_objective
from tuner.space import IntParam, SearchSpace, SpaceError, power_limit_param
from tuner.study_options import MemoryPolicy, StudyOptions, measurement_policy


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
    space = search_space(body.space)
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
    )
    ranks_seen = service.require_step_timing(session, job, objective, series)
    if options.driven_by == "tuner":
        job_agents.require_live_agent(session, job, options.ack_timeout_s)
    if options.ranks is None and ranks_seen:
        options = replace(options, ranks=ranks_seen)
    return service.create_study(
        session,
        job,
        name=body.name,
        objective=objective,
        space=space,
        strategy=body.strategy,
        direction=body.direction,
        seed=body.seed,
        options=options,
        warm_start=body.warm_start,
        actor=actor,
    )


def search_space(body: SpaceIn) -> SearchSpace:
    """The training space with ``params`` (and the power limit) added, or, without
    ``batch_size``, a space of those alone (a service's knobs: no learning rate travels with
    them)."""
    extra = [IntParam(p.name, p.low, p.high, p.log, p.powers_of_two) for p in body.params]
    if body.power_limit_w:
        extra.append(power_limit_param(*body.power_limit_w))
    if body.batch_size is None:
        training = [
            name
            for name in ("sync_period", "bucket_mb", "base_lr", "base_batch")
            if getattr(body, name) is not None
        ]
        if "lr_scaling" in body.model_fields_set and body.lr_scaling is not None:
            training.append("lr_scaling")
        if training:
            raise SpaceError(f"{', '.join(training)} need(s) batch_size in the space")
        if not extra:
            raise SpaceError("the space needs batch_size or at least one of params")
        return SearchSpace(tuple(extra))
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
        extra=extra,
    )
