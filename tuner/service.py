"""Study persistence: the plain functions every entry point (API, Celery task, CLI) calls.

A study is one row of ``studies`` and its trials are rows of ``trials``; nothing lives in
memory between calls. Each :func:`ask` re-reads the history and rebuilds the strategy from the
study row, so a restarted worker or a study resumed days later proposes exactly what it would
have proposed without the interruption (strategies depend only on seed and history).

Storage layout (see docs/tuner.md, "Study persistence"):

- ``Study.space``: ``SearchSpace.to_dict()`` plus :data:`SEED_KEY` (the strategy's seed or
  ``None``); ``SearchSpace.from_dict`` ignores the extra key.
- ``Study.options``: :class:`~tuner.study_options.StudyOptions` (strategy options, measurement
  policy, ranks, SLO, who drives the trials, warm-start studies).
- ``Trial.params``: the proposed configuration, plus ``learning_rate`` when :func:`ask` was
  given ``ranks`` and the space has a learning-rate rule (a batch change never travels without
  its lr). :func:`history` drops keys that are not parameters of the space.
- ``Trial.measurements``: ``{"context": {..}, "stderr": float | None, "reason": str,
  "data": {..}}``: the ask's context, the told value's standard error, why a trial is
  infeasible/failed, and the caller's raw measurements (stats, verdicts).

The functions flush but never commit: the caller owns the transaction (``session_scope``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tuneloop.accounts import record_audit
from tuneloop.storage.models import Job, Study, Trial
from tuneloop.storage.types import utcnow
from tuner import readings
from tuner.memory import (
    MAX_PREDICTED_OOMS,
    MemoryBound,
    MemoryPoint,
    combinations,
    memory_bound,
    predicted_oom_observations,
)
from tuner.objectives import check_direction, get_objective
from tuner.space import BATCH_SIZE, ParamValue, SearchSpace
from tuner.strategies.base import (
    REASON_OOM,
    TRIAL_STATES,
    BaseStrategy,
    Observation,
    SpaceExhausted,
    TrialState,
    warm_start,
)
from tuner.strategies.registry import make_strategy
from tuner.study_options import StudyOptions

SIGNATURE_LABELS: Sequence[str] = ("model", "accelerator")
"""Job labels that make up the model signature and hardware: studies of jobs that agree on all
of them (and on the objective and, when both know it, the ranks) warm-start each other."""
MAX_WARM_START_STUDIES = 10

SEED_KEY = "strategy_seed"
"""Key of ``Study.space`` that holds the strategy's seed."""

ACTOR = "tuner"
_ASK_RETRIES = 5
GPU_MEMORY_KEY = "gpu_memory"
"""Key of ``Trial.measurements["data"]`` holding the trial's framebuffer reading
(``readings.GpuMemory.to_dict()``), which the memory bound is fitted on."""


class StudyError(ValueError):
    """Bad input to a study operation (the entry point answers 4xx, the task does not retry)."""


class DuplicateStudyError(StudyError):
    """The job already has a study of that name."""


class UnknownTrialError(StudyError):
    """The study has no trial of that number."""


class TrialConflictError(StudyError):
    """A different result was told for a trial that is already finished."""


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
    if objective == "slo_throughput" and options.slo_s is None:
        raise StudyError("slo_throughput needs slo_s (the P99 latency bound in seconds)")
    # Building it checks the name (UnknownStrategyError lists the known ones), the options
    # and the seed.
    make_strategy(strategy, space, direction=chosen, seed=seed, options=options.strategy_options)
    if warm_start and not options.warm_start_from:
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
        space={**space.to_dict(), SEED_KEY: seed},
        state="running",
        options=options.to_dict(),
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
        },
    )
    session.flush()
    return study


def require_step_timing(session: Session, job: Job, objective: str) -> int:
    """Refuse a study of a job with no step-timing data in the store (nothing to measure its
    trials on); returns the number of ranks the data shows (0 for a step-time-only job)."""
    bind = session.connection()
    metric = readings.primary_metric(objective)
    if not readings.has_series(bind, job.project_id, job.name, metric):
        raise StudyError(
            f"job {job.name!r} has no step-timing data ({metric}{{job={job.name!r}}}) in the "
            "store: report step timings (docs/step-timing.md) before creating a study"
        )
    return readings.rank_count(bind, job.project_id, job.name)


def job_signature(job: Job) -> dict[str, str] | None:
    """The job's :data:`SIGNATURE_LABELS`, or ``None`` if it lacks one of them."""
    labels = job.labels or {}
    if not all(labels.get(name) for name in SIGNATURE_LABELS):
        return None
    return {name: str(labels[name]) for name in SIGNATURE_LABELS}


def warm_start_studies(
    session: Session, job: Job, objective: str, ranks: int | None = None
) -> list[int]:
    """Ids of the latest studies (at most :data:`MAX_WARM_START_STUDIES`) of the project's jobs
    with ``job``'s signature and the same objective that have a finished trial; when both
    sides know the ranks, they must agree. Empty when the job has no full signature."""
    signature = job_signature(job)
    if signature is None:
        return []
    finished = select(Trial.study_id).where(Trial.state.in_(("complete", "infeasible")))
    candidates = session.execute(
        select(Study, Job)
        .join(Job, Study.job_id == Job.id)
        .where(
            Job.project_id == job.project_id,
            Study.objective == objective,
            Study.id.in_(finished),
        )
        .order_by(Study.id.desc())
    ).all()
    chosen: list[int] = []
    for study, other in candidates:
        if job_signature(other) != signature:
            continue
        other_ranks = study_options(study).ranks
        if ranks is not None and other_ranks is not None and ranks != other_ranks:
            continue
        chosen.append(study.id)
        if len(chosen) == MAX_WARM_START_STUDIES:
            break
    return sorted(chosen)


def study_options(study: Study) -> StudyOptions:
    return StudyOptions.from_dict(study.options)


def prior_observations(session: Session, study: Study) -> tuple[Observation, ...]:
    """The trials of the study's warm-start studies, ready to prepend to its history."""
    space = study_space(study)
    collected: list[Observation] = []
    for other_id in study_options(study).warm_start_from:
        other = session.get(Study, other_id)
        if other is None or other.id == study.id:
            continue  # deleted since: its evidence is gone with it
        for obs in history(session, other):
            # Numbered in the order collected so that several studies never clash.
            collected.append(replace(obs, number=len(collected)))
    return warm_start(collected, space)


def list_studies(session: Session, job: Job) -> list[Study]:
    return list(session.scalars(select(Study).where(Study.job_id == job.id).order_by(Study.id)))


def get_study(session: Session, job: Job, ref: str) -> Study | None:
    """The study of ``job`` named ``ref``, or with id ``ref`` when it is all digits."""
    by = Study.id == int(ref) if ref.isdigit() else Study.name == ref
    return session.scalars(select(Study).where(Study.job_id == job.id, by)).one_or_none()


def list_trials(
    session: Session, study: Study, *, limit: int = 100, offset: int = 0
) -> list[Trial]:
    query = (
        select(Trial)
        .where(Trial.study_id == study.id)
        .order_by(Trial.number)
        .limit(limit)
        .offset(offset)
    )
    return list(session.scalars(query))


def study_space(study: Study) -> SearchSpace:
    return SearchSpace.from_dict(study.space)


def study_strategy(study: Study) -> BaseStrategy:
    """The study's strategy, rebuilt from its row: the same seed gives the same proposals."""
    seed = study.space.get(SEED_KEY)
    return make_strategy(
        study.strategy,
        study_space(study),
        direction=check_direction(study.direction),
        seed=seed,
        options=study_options(study).strategy_options,
    )


def lock_study(session: Session, study: Study) -> None:
    """Hold the study's row until the transaction ends, so one ask or loop step at a time."""
    # A no-op UPDATE rather than SELECT ... FOR UPDATE: on PostgreSQL both lock the row until
    # commit, but on SQLite only a write takes the database write lock (waiting busy_timeout)
    # before we read the history; a plain read would let two asks read the same history and
    # the second one fail with "database is locked" when it upgrades to write.
    session.execute(
        update(Study)
        .where(Study.id == study.id)
        .values(state=Study.state)
        .execution_options(synchronize_session=False)
    )


def _trials(session: Session, study: Study) -> list[Trial]:
    query = select(Trial).where(Trial.study_id == study.id).order_by(Trial.number)
    return list(session.scalars(query))


def _observation(trial: Trial, space: SearchSpace) -> Observation:
    extra = trial.measurements or {}
    state: TrialState = _check_state(trial.state)
    return Observation(
        number=trial.number,
        # Drop the learning rate (and anything else not tuned) that travels with the params.
        config={k: v for k, v in trial.params.items() if k in space},
        state=state,
        value=trial.value if state == "complete" else None,
        stderr=extra.get("stderr"),
        reason=str(extra.get("reason") or ""),
        context=extra.get("context") or {},
    )


def history(session: Session, study: Study) -> list[Observation]:
    """The study's trials as frozen observations, in trial-number order."""
    space = study_space(study)
    return [_observation(t, space) for t in _trials(session, study)]


def memory_points(trials: Sequence[Trial]) -> list[MemoryPoint]:
    """The framebuffer readings the loop stored with finished trials (key
    :data:`GPU_MEMORY_KEY`), each with its trial's per-device batch size. Trials that ran out
    of memory or have no reading are left out (the OOM rule covers the former)."""
    points: list[MemoryPoint] = []
    for trial in trials:
        extra = trial.measurements or {}
        reading = (extra.get("data") or {}).get(GPU_MEMORY_KEY)
        batch = trial.params.get(BATCH_SIZE)
        out_of_memory = extra.get("reason") == REASON_OOM
        if trial.state == "running" or out_of_memory or not isinstance(reading, Mapping):
            continue
        peak, capacity = reading.get("peak_mib"), reading.get("capacity_mib")
        if not isinstance(batch, int) or not _number(peak) or not _number(capacity):
            continue
        assert isinstance(peak, int | float) and isinstance(capacity, int | float)
        if capacity > 0 and peak >= 0 and batch >= 1:
            points.append(MemoryPoint(trial.number, batch, float(peak), float(capacity)))
    return points


def study_memory_bound(study: Study, trials: Sequence[Trial]) -> MemoryBound | None:
    """The study's memory bound from its trials (``None`` when it is switched off or the space
    has no batch size)."""
    policy = study_options(study).memory
    if not policy.enabled or BATCH_SIZE not in study_space(study):
        return None
    return memory_bound(memory_points(trials), policy.headroom)


def _number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def ask(
    session: Session,
    study: Study,
    *,
    context: Mapping[str, float] | None = None,
    ranks: int | None = None,
    actor: str = ACTOR,
) -> Trial:
    """Propose the next trial and store it as ``running``.

    ``ranks``: the job's data-parallel ranks (default: the study's ``ranks`` option); with
    it, and a space with a learning-rate rule, the stored params carry the matching
    ``learning_rate``. The trials of the study's warm-start studies are prepended to its
    history as priors. With the memory bound on (``StudyOptions.memory``), batch sizes the
    study's memory model predicts not to fit reach the strategy as predicted out-of-memory
    observations (:func:`tuner.memory.predicted_oom_observations`), and the audit entry
    records the bound with its figures. Raises ``SpaceExhausted`` when
    nothing is left to propose. Two concurrent asks get different numbers and each sees the
    other's trial: :func:`lock_study` serialises them, and a clash on unique
    (study_id, number) is still retried with fresh history.
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
        rows = _trials(session, study)
        past = [_observation(t, space) for t in rows]
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
            if predicted and bound is not None:
                raise SpaceExhausted(
                    f"{exc} (memory bound: {BATCH_SIZE} <= {bound.max_batch}, {bound.why})"
                ) from None
            raise
        params: dict[str, ParamValue] = (
            space.desired(config, ranks=ranks) if ranks is not None else dict(config)
        )
        number = (
            session.scalar(select(func.max(Trial.number)).where(Trial.study_id == study.id)) or 0
        ) + 1
        trial = Trial(
            study_id=study.id,
            number=number,
            params=params,
            state="running",
            measurements={"context": dict(context or {}), "stderr": None, "reason": "", "data": {}},
        )
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
            **_memory_details(space, bound, predicted),
        },
    )
    session.flush()
    return trial


def _memory_details(
    space: SearchSpace, bound: MemoryBound | None, predicted: Sequence[Observation]
) -> dict[str, Any]:
    """The memory bound as the ask's audit entry records it: the model, the figures and the
    trials behind it, and the batch from which on proposals were excluded."""
    if bound is None:
        return {}
    details = bound.to_dict()
    details["excluded_from"] = int(predicted[0].config[BATCH_SIZE]) if predicted else None
    if bound.max_batch is not None and not predicted and combinations(space) > MAX_PREDICTED_OOMS:
        details["why"] += (
            f"; not applied: more than {MAX_PREDICTED_OOMS} combinations of the other parameters"
        )
    return {"memory_bound": details}


def _check_state(state: str) -> TrialState:
    for known in TRIAL_STATES:
        if state == known:
            return known
    raise StudyError(f"unknown trial state {state!r}; known: {', '.join(TRIAL_STATES)}")


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
    checked = _check_state(state)
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
    if trial.state != "running":
        extra = trial.measurements or {}
        told = (
            trial.state,
            trial.value,
            extra.get("stderr"),
            extra.get("reason") or "",
            extra.get("data") or {},
        )
        if told == result:
            return trial
        raise TrialConflictError(
            f"trial {trial_number} is already {trial.state} with a different result"
        )
    trial.state = checked
    trial.value = number_value
    # A new dict, not an in-place edit: the JSON column only notices reassignment.
    trial.measurements = {
        "context": dict((trial.measurements or {}).get("context") or {}),
        "stderr": stderr_value,
        "reason": reason or "",
        "data": data,
    }
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


def set_state(
    session: Session, study: Study, state: str, *, actor: str = ACTOR, reason: str = ""
) -> bool:
    """Stop or resume a study; returns whether it changed. Stopping fails its running trials
    (reason ``study stopped``) so that nothing is left waiting; a complete study stays so."""
    if state not in ("running", "stopped"):
        raise StudyError(f"a study can be set running or stopped, not {state!r}")
    lock_study(session, study)
    session.refresh(study)
    if study.state == state:
        return False
    if study.state == "complete":
        raise StudyError(f"study {study.name!r} is complete")
    if state == "stopped":
        running = session.scalars(
            select(Trial.number).where(Trial.study_id == study.id, Trial.state == "running")
        ).all()
        for number in running:
            tell(session, study, number, state="failed", reason="study stopped", actor=actor)
    job = session.get(Job, study.job_id)
    record_audit(
        session,
        actor=actor,
        action="study.state",
        target=f"study:{study.id}",
        project_id=job.project_id if job is not None else None,
        details={"study_id": study.id, "from": study.state, "to": state, "reason": reason},
    )
    study.state = state
    session.flush()
    return True


def best(session: Session, study: Study) -> Trial | None:
    """The complete trial with the best value for the study's direction (earliest on ties)."""
    query = select(Trial).where(Trial.study_id == study.id, Trial.state == "complete")
    order = Trial.value.desc() if study.direction == "maximize" else Trial.value.asc()
    return session.scalars(query.order_by(order, Trial.number).limit(1)).first()


__all__: Sequence[str] = [
    "SEED_KEY",
    "SIGNATURE_LABELS",
    "DuplicateStudyError",
    "StudyError",
    "TrialConflictError",
    "UnknownTrialError",
    "ask",
    "best",
    "create_study",
    "get_study",
    "history",
    "job_signature",
    "list_studies",
    "list_trials",
    "lock_study",
    "prior_observations",
    "require_step_timing",
    "set_state",
    "study_options",
    "study_space",
    "study_strategy",
    "tell",
    "warm_start_studies",
]
