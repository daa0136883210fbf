"""Study persistence: the plain functions every entry point (API, Celery task, CLI) calls.

A study is one row of ``studies`` and its trials are rows of ``trials``; nothing lives in
memory between calls. Each :func:`ask` re-reads the history and rebuilds the strategy from the
study row, so a restarted worker or a study resumed days later proposes exactly what it would
have proposed without the interruption (strategies depend only on seed and history).

Storage layout (see docs/tuner.md, "Study persistence"):

- ``Study.space``: ``SearchSpace.to_dict()``; ``Study.seed``: the strategy's seed or ``None``.
- ``Study.options``: :class:`~tuner.study_options.StudyOptions` (strategy options, measurement
  policy, ranks, SLO, who drives the trials, warm-start studies).
- ``Study.baseline_version``: the job's desired version before the first trial (the pre-study
  config, ``tuner.study_baseline``); ``end_reason``, ``ended_at``, ``outcome_version``: how the
  study ended and the desired version it left the job on (``tuner.study_end``).
- ``Trial.params``: the proposed configuration, plus ``learning_rate`` when :func:`ask` was
  given ``ranks`` and the space has a learning-rate rule (a batch change never travels without
  its lr). :func:`history` drops keys that are not parameters of the space. ``Trial.baseline``
  marks the trials of the pre-study config; strategies see them as ordinary observations.
- ``Trial.measurements``: :class:`~tuner.trial_measurements.TrialMeasurements` (the ask's
  context, the told value's standard error, why a trial is infeasible/failed, and the
  caller's raw measurements: stats, verdicts).

Reading the rows is ``tuner.study_records``, warm starts ``tuner.study_priors`` and the memory
bound ``tuner.study_memory``; their public names are re-exported here. The functions flush but
never commit: the caller owns the transaction (``session_scope``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tuneloop.accounts import record_audit
from tuneloop.errors import Conflict, NotFound
from tuneloop.storage.models import Job, Study, Trial
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.timeseries.store_backend import StoreBackend
from tuneloop.storage.types import utcnow
from tuner import promql_objective, readings, study_end, study_records
from tuner.memory import predicted_oom_observations
from tuner.objectives import (
    ENERGY_OBJECTIVES,
    PROMQL,
    SLO_OBJECTIVES,
    check_direction,
    get_objective,
)
from tuner.space import BATCH_SIZE, ParamValue, SearchSpace
from tuner.strategies.base import Observation, SpaceExhausted
from tuner.strategies.registry import make_strategy
from tuner.study_baseline import require_pre_study_config
from tuner.study_memory import (
    memory_details,
    memory_points,
    study_memory_bound,
)
from tuner.study_options import StudyOptions
from tuner.study_priors import (
    SIGNATURE_LABELS,
    job_signature,
    prior_observations,
    warm_start_studies,
)
from tuner.study_records import (
    StudyError,
    best,
    check_state,
    get_study,
    history,
    list_studies,
    list_trials,
    lock_study,
    observation,
    study_options,
    study_space,
    study_strategy,
    study_trials,
)
from tuner.trial_measurements import GPU_MEMORY_KEY, TrialMeasurements

ACTOR = "tuner"
_ASK_RETRIES = 5


# Each is also the tuneloop.errors kind it is, listed first, so the API's one handler answers
# it (404/409) while callers that catch StudyError still catch it.
class DuplicateStudyError(Conflict, StudyError):
    """The job already has a study of that name."""


class UnknownTrialError(NotFound, StudyError):
    """The study has no trial of that number."""


class TrialConflictError(Conflict, StudyError):
    """A different result was told for a trial that is already finished."""


class StudyEndedError(Conflict, StudyError):
    """The study has ended (complete, failed or cancelled): it cannot be changed any more."""


def create_study(
    session: Session,
    job: Job,
    *,
    name: str,
    objective: str,
    space: SearchSpace,
    strategy: str,
    direction: str | None = None,
    seed: int | None = None,
    options: StudyOptions | None = None,
    warm_start: bool = True,
    actor: str = ACTOR,
) -> Study:
    """A new running study of ``job``. ``direction`` defaults to the objective's own.

    A tuner-driven study records the job's latest desired version as its pre-study config;
    refused when there is none or the space excludes it (``tuner.study_baseline``).

    ``options`` default to :class:`StudyOptions` defaults (the loop drives the trials).
    With ``warm_start`` and an empty ``options.warm_start_from``, the latter is filled in here:
    the latest studies of jobs with the same signature (:func:`warm_start_studies`)."""
    goal = get_objective(objective)  # ObjectiveError (a ValueError) names the known ones
    chosen = check_direction(direction if direction is not None else goal.direction)
    if not isinstance(space, SearchSpace):
        raise StudyError(f"space must be a SearchSpace, got {type(space).__name__}")
    options = options if options is not None else StudyOptions()
    if objective == "goodput" and space.base_batch is None:
        raise StudyError(
            "goodput needs base_batch in the space (the global batch the learning rate was "
            "tuned at, Pollux's M0)"
        )
    if objective in SLO_OBJECTIVES and options.slo_s is None:
        raise StudyError(f"{objective} needs slo_s (the P99 latency bound in seconds)")
    _check_promql_objective(objective, direction, options)
    if options.throughput_floor is not None and objective not in ENERGY_OBJECTIVES:
        raise StudyError(
            f"throughput_floor is for the {' and '.join(ENERGY_OBJECTIVES)} objectives, "
            f"not {objective}"
        )
    # Building it checks the name (UnknownStrategyError lists the known ones), the options
    # and the seed.
    make_strategy(strategy, space, direction=chosen, seed=seed, options=options.strategy_options)
    # The loop measures the job's current config first and puts the job back on it when the
    # study ends without a better one; a job the agent drives chooses its configs itself.
    baseline_version = (
        require_pre_study_config(session, job, space).version
        if options.driven_by == "tuner"
        else None
    )
    # Priors of another expression would score a different quantity: a PromQL study starts
    # cold unless warm_start_from names its priors.
    if warm_start and not options.warm_start_from and objective != PROMQL:
        options = replace(
            options,
            warm_start_from=tuple(warm_start_studies(session, job, objective, options.ranks)),
        )
    taken = session.scalar(select(Study.id).where(Study.job_id == job.id, Study.name == name))
    if taken is not None:
        raise DuplicateStudyError(f"job {job.name!r} already has a study named {name!r}")
    study = Study(
        job_id=job.id,
        name=name,
        objective=objective,
        direction=chosen,
        strategy=strategy,
        space=space.to_dict(),
        seed=seed,
        state="running",
        options=options.to_dict(),
        baseline_version=baseline_version,
    )
    try:
        # A savepoint so that losing a race to the unique (job_id, name) keeps the caller's
        # transaction usable and gives the same clear error as the check above.
        with session.begin_nested():
            session.add(study)
    except IntegrityError:
        raise DuplicateStudyError(f"job {job.name!r} already has a study named {name!r}") from None
    record_audit(
        session,
        actor=actor,
        action="study.create",
        target=f"study:{study.id}",
        project_id=job.project_id,
        details={
            "job_id": job.id,
            "name": name,
            "objective": objective,
            "direction": chosen,
            "strategy": strategy,
            "seed": seed,
            "space": space.to_dict(),
            "options": options.to_dict(),
            "baseline_version": baseline_version,
        },
    )
    session.flush()
    return study


def _check_promql_objective(objective: str, direction: str | None, options: StudyOptions) -> None:
    if objective != PROMQL:
        if options.objective_expr is not None:
            raise StudyError(f"objective_expr is for the {PROMQL} objective, not {objective}")
        return
    if options.objective_expr is None:
        raise StudyError(f"objective {PROMQL} needs objective_expr (a PromQL expression)")
    if direction is None:
        raise StudyError(f"objective {PROMQL} needs a direction: maximize or minimize")
    promql_objective.check_expr(options.objective_expr)


def require_step_timing(
    session: Session, job: Job, objective: str, series: TimeSeriesBackend | None = None
) -> int:
    """Refuse a study of a job with no step-timing data in ``series`` (default: the store,
    through ``session``): nothing to measure its trials on. Returns the number of ranks the
    data shows (0 for a step-time-only job). A PromQL objective reads the series its
    expression names, so step timings are not required for it."""
    series = series or StoreBackend(session.connection())
    metric = readings.primary_metric(objective)
    if objective != PROMQL and not readings.has_series(series, job.project_id, job.name, metric):
        raise StudyError(
            f"job {job.name!r} has no step-timing data ({metric}{{job={job.name!r}}}) in the "
            "store: report step timings (docs/step-timing.md) before creating a study"
        )
    return readings.rank_count(series, job.project_id, job.name)


def ask(
    session: Session,
    study: Study,
    *,
    context: Mapping[str, float] | None = None,
    ranks: int | None = None,
    actor: str = ACTOR,
    keep: Callable[[Trial], bool] | None = None,
) -> Trial:
    """Propose the next trial and store it as ``running``; the strategy learns from the
    study's trials that ``keep`` keeps (default: all; a load band's, ``tuner.load_bands``).

    ``ranks``: the job's data-parallel ranks (default: the study's ``ranks`` option); with
    it, and a space with a learning-rate rule, the stored params carry the matching
    ``learning_rate``. The trials of the study's warm-start studies are prepended to its
    history as priors. With the memory bound on (``StudyOptions.memory``), batch sizes the
    study's memory model predicts not to fit reach the strategy as predicted out-of-memory
    observations (:func:`tuner.memory.predicted_oom_observations`), and the audit entry
    records the bound with its figures. Raises ``SpaceExhausted`` (a conflict) when
    nothing is left to propose, its message saying so. Two concurrent asks get different
    numbers and each sees the other's trial: :func:`lock_study` serialises them, and a clash
    on unique (study_id, number) is still retried with fresh history.
    """
    if study.state != "running":
        raise StudyError(f"study {study.name!r} is {study.state}, not running")
    job = session.get(Job, study.job_id)
    project_id = job.project_id if job is not None else None
    strategy = study_strategy(study)
    space = strategy.space
    if ranks is None:
        ranks = study_options(study).ranks
    priors = prior_observations(session, study)
    for attempt in range(_ASK_RETRIES):
        lock_study(session, study)
        rows = [t for t in study_trials(session, study) if keep is None or keep(t)]
        past = [observation(t, space) for t in rows]
        bound = study_memory_bound(study, rows)
        predicted: tuple[Observation, ...] = ()
        if bound is not None and bound.max_batch is not None:
            # Numbered below the priors (-len(priors) .. -1) so that numbers never clash.
            predicted = predicted_oom_observations(
                space, bound.max_batch, first_number=-len(priors) - 1
            )
        try:
            config = strategy.ask([*predicted, *priors, *past], context)
        except SpaceExhausted as exc:
            why = f"nothing left to try: {exc}"
            if predicted and bound is not None:
                why += f" (memory bound: {BATCH_SIZE} <= {bound.max_batch}, {bound.why})"
            raise SpaceExhausted(why) from None
        params: dict[str, ParamValue] = (
            space.desired(config, ranks=ranks) if ranks is not None else dict(config)
        )
        trial = study_records.new_running_trial(session, study, params, context=context)
        try:
            with session.begin_nested():
                session.add(trial)
        except IntegrityError:
            if attempt == _ASK_RETRIES - 1:
                raise
            continue
        break
    record_audit(
        session,
        actor=actor,
        action="trial.ask",
        target=f"study:{study.id}/trial:{trial.number}",
        project_id=project_id,
        details={
            "study_id": study.id,
            "number": trial.number,
            "config": params,
            "context": dict(context or {}),
            "priors": len(priors),
            **memory_details(space, bound, predicted),
        },
    )
    session.flush()
    return trial


def _finite(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise StudyError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def tell(
    session: Session,
    study: Study,
    trial_number: int,
    *,
    state: str,
    value: float | None = None,
    stderr: float | None = None,
    reason: str | None = None,
    measurements: Mapping[str, Any] | None = None,
    actor: str = ACTOR,
) -> Trial:
    """Record a trial's result. Telling the same result again is a no-op (a retried task);
    a different result for a finished trial raises :class:`TrialConflictError`."""
    checked = check_state(state)
    if checked == "running":
        raise StudyError("tell needs a finished state: complete, infeasible or failed")
    number_value = _finite("value", value)
    stderr_value = _finite("stderr", stderr)
    if stderr_value is not None and stderr_value < 0:
        raise StudyError(f"stderr must be >= 0, got {stderr!r}")
    if checked == "complete":
        if number_value is None:
            raise StudyError(f"trial {trial_number}: complete needs a finite value")
    else:
        if number_value is not None:
            # Only a complete trial has a trusted value; anything else would leak into BO.
            raise StudyError(f"trial {trial_number}: a {checked} trial has no value")
        if not reason:
            raise StudyError(f"trial {trial_number}: {checked} needs a reason")
    trial = session.scalar(
        select(Trial)
        .where(Trial.study_id == study.id, Trial.number == trial_number)
        .with_for_update()
    )
    if trial is None:
        raise UnknownTrialError(f"study {study.name!r} has no trial {trial_number}")
    try:
        # Round-trip now so that the idempotency check compares what the store gives back
        # (tuples become lists) and unserialisable input is refused before any write.
        data: dict[str, Any] = json.loads(json.dumps(dict(measurements or {}), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise StudyError(f"trial {trial_number}: measurements must be plain JSON: {exc}") from None
    result = (checked, number_value, stderr_value, reason or "", data)
    stored = TrialMeasurements.from_json(trial.measurements)
    if trial.state != "running":
        told = (trial.state, trial.value, stored.stderr, stored.reason, dict(stored.data))
        if told == result:
            return trial
        raise TrialConflictError(
            f"trial {trial_number} is already {trial.state} with a different result"
        )
    trial.state = checked
    trial.value = number_value
    trial.measurements = stored.told(stderr=stderr_value, reason=reason or "", data=data).to_json()
    trial.completed_at = utcnow()
    job = session.get(Job, study.job_id)
    record_audit(
        session,
        actor=actor,
        action="trial.tell",
        target=f"study:{study.id}/trial:{trial_number}",
        project_id=job.project_id if job is not None else None,
        details={
            "study_id": study.id,
            "number": trial_number,
            "state": checked,
            "value": number_value,
            "stderr": stderr_value,
            "reason": reason or "",
            "measurements": data,
        },
    )
    session.flush()
    return trial


def _fail_running_trials(session: Session, study: Study, reason: str, actor: str) -> None:
    running = session.scalars(
        select(Trial.number).where(Trial.study_id == study.id, Trial.state == "running")
    ).all()
    for number in running:
        tell(session, study, number, state="failed", reason=reason, actor=actor)


def set_state(
    session: Session, study: Study, state: str, *, actor: str = ACTOR, reason: str = ""
) -> bool:
    """Stop or resume a study; returns whether it changed. Stopping fails its running trials
    (reason ``study stopped``) so that nothing is left waiting, and puts the job back on its
    pre-study config (a stop may last days: the job must not wait on a trial's config); a
    resumed study goes on with its next trial. An ended study stays so."""
    if state not in ("running", "stopped"):
        raise StudyError(f"a study can be set running or stopped, not {state!r}")
    lock_study(session, study)
    session.refresh(study)
    if study.state == state:
        return False
    if study.state in study_end.END_STATES:
        raise StudyEndedError(f"study {study.name!r} is {study.state}: {study.end_reason}")
    job = session.get_one(Job, study.job_id)
    details: dict[str, Any] = {"study_id": study.id, "from": study.state, "to": state}
    if state == "stopped":
        _fail_running_trials(session, study, "study stopped", actor)
        row, restored = study_end.restore_pre_study(session, study, job)
        study.end_reason = f"{reason or f'stopped by {actor}'}; {restored}"
        if row is not None:
            study.outcome_version = row.version
        details["desired_version"] = row.version if row is not None else None
    else:
        study.end_reason = ""
    record_audit(
        session,
        actor=actor,
        action="study.state",
        target=f"study:{study.id}",
        project_id=job.project_id,
        details={**details, "reason": reason or study.end_reason},
    )
    study.state = state
    session.flush()
    return True


def cancel_study(session: Session, study: Study, *, actor: str = ACTOR) -> bool:
    """Cancel a running or stopped study: its running trials fail, the job goes back on its
    pre-study config and the study ends ``cancelled``. Returns whether it changed (a second
    cancel is a no-op); an otherwise ended study raises :class:`StudyEndedError`."""
    lock_study(session, study)
    session.refresh(study)
    if study.state == "cancelled":
        return False
    if study.state in study_end.END_STATES:
        raise StudyEndedError(
            f"study {study.name!r} has already ended {study.state}: {study.end_reason}"
        )
    _fail_running_trials(session, study, "study cancelled", actor)
    job = session.get_one(Job, study.job_id)
    study_end.cancel(session, study, job, f"cancelled by {actor}", actor=actor)
    return True


__all__: Sequence[str] = [
    "GPU_MEMORY_KEY",
    "SIGNATURE_LABELS",
    "DuplicateStudyError",
    "StudyEndedError",
    "StudyError",
    "TrialConflictError",
    "UnknownTrialError",
    "ask",
    "best",
    "cancel_study",
    "create_study",
    "get_study",
    "history",
    "job_signature",
    "list_studies",
    "list_trials",
    "lock_study",
    "memory_points",
    "prior_observations",
    "require_step_timing",
    "set_state",
    "study_memory_bound",
    "study_options",
    "study_space",
    "study_strategy",
    "tell",
    "warm_start_studies",
]
