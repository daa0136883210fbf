"""Study persistence: the plain functions every entry point (API, Celery task, CLI) calls.

A study is one row of ``studies`` and its trials are rows of ``trials``; nothing lives in
memory between calls. Each :func:`ask` re-reads the history and rebuilds the strategy from the
study row, so a restarted worker or a study resumed days later proposes exactly what it would
have proposed without the interruption (strategies depend only on seed and history).

Storage layout (see docs/tuner.md, "Study persistence"):

- ``Study.space``: ``SearchSpace.to_dict()`` plus :data:`SEED_KEY` (the strategy's seed or
  ``None``); ``SearchSpace.from_dict`` ignores the extra key.
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
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tuneloop.accounts import record_audit
from tuneloop.storage.models import Job, Study, Trial
from tuneloop.storage.types import utcnow
from tuner.objectives import check_direction, get_objective
from tuner.space import ParamValue, SearchSpace
from tuner.strategies.base import TRIAL_STATES, BaseStrategy, Observation, TrialState
from tuner.strategies.registry import make_strategy

SEED_KEY = "strategy_seed"
"""Key of ``Study.space`` that holds the strategy's seed."""

ACTOR = "tuner"
_ASK_RETRIES = 5


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
    actor: str = ACTOR,
) -> Study:
    """A new running study of ``job``. ``direction`` defaults to the objective's own."""
    goal = get_objective(objective)  # ObjectiveError (a ValueError) names the known ones
    chosen = check_direction(direction if direction is not None else goal.direction)
    if not isinstance(space, SearchSpace):
        raise StudyError(f"space must be a SearchSpace, got {type(space).__name__}")
    # Building it checks the name (UnknownStrategyError lists the known ones) and the seed.
    make_strategy(strategy, space, direction=chosen, seed=seed)
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
        },
    )
    session.flush()
    return study


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
    )


def _lock_study(session: Session, study: Study) -> None:
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


def ask(
    session: Session,
    study: Study,
    *,
    context: Mapping[str, float] | None = None,
    ranks: int | None = None,
    actor: str = ACTOR,
) -> Trial:
    """Propose the next trial and store it as ``running``.

    ``ranks``: the job's data-parallel ranks; with it, and a space with a learning-rate rule,
    the stored params carry the matching ``learning_rate``. Raises ``SpaceExhausted`` when
    nothing is left to propose. Two concurrent asks get different numbers and each sees the
    other's trial: :func:`_lock_study` serialises them, and a clash on unique
    (study_id, number) is still retried with fresh history.
    """
    if study.state != "running":
        raise StudyError(f"study {study.name!r} is {study.state}, not running")
    job = session.get(Job, study.job_id)
    project_id = job.project_id if job is not None else None
    strategy = study_strategy(study)
    space = strategy.space
    for attempt in range(_ASK_RETRIES):
        _lock_study(session, study)
        past = history(session, study)
        config = strategy.ask(past, context)
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
        },
    )
    session.flush()
    return trial


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


def best(session: Session, study: Study) -> Trial | None:
    """The complete trial with the best value for the study's direction (earliest on ties)."""
    query = select(Trial).where(Trial.study_id == study.id, Trial.state == "complete")
    order = Trial.value.desc() if study.direction == "maximize" else Trial.value.asc()
    return session.scalars(query.order_by(order, Trial.number).limit(1)).first()


__all__: Sequence[str] = [
    "SEED_KEY",
    "DuplicateStudyError",
    "StudyError",
    "TrialConflictError",
    "UnknownTrialError",
    "ask",
    "best",
    "create_study",
    "history",
    "study_space",
    "study_strategy",
    "tell",
]
