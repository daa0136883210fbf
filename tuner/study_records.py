"""A study's row and trials as the tuner reads them: options, space, strategy, history, best.

The lowest layer of the study modules (``service``, ``study_priors``, ``study_memory``,
``study_end`` and the loop build on it); plain functions, the caller owns the transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import false, func, select
from sqlalchemy.orm import Session

from tuneloop.errors import InvalidInput
from tuneloop.storage.locks import hold_write_lock
from tuneloop.storage.models import Job, Study, Trial
from tuneloop.storage.types import row_id
from tuner.objectives import check_direction
from tuner.space import SearchSpace
from tuner.strategies.base import TRIAL_STATES, BaseStrategy, Observation, TrialState
from tuner.strategies.registry import make_strategy
from tuner.study_options import StudyOptions
from tuner.trial_measurements import TrialMeasurements


class StudyError(InvalidInput):
    """Bad input to a study operation (the entry point answers 4xx, the task does not retry)."""


def study_options(study: Study) -> StudyOptions:
    return StudyOptions.from_dict(study.options)


def study_space(study: Study) -> SearchSpace:
    return SearchSpace.from_dict(study.space)


def study_strategy(study: Study) -> BaseStrategy:
    """The study's strategy, rebuilt from its row: the same seed gives the same proposals."""
    return make_strategy(
        study.strategy,
        study_space(study),
        direction=check_direction(study.direction),
        seed=study.seed,
        options=study_options(study).strategy_options,
    )


def lock_study(session: Session, study: Study) -> None:
    """Hold the study's row until the transaction ends, so one ask or loop step at a time."""
    # On SQLite only a write lock serializes (there are no row locks): take it before the
    # history is read, so that two asks never read the same history and the second one fail
    # with "database is locked" when it upgrades to write. On PostgreSQL, the row lock.
    hold_write_lock(session)
    session.execute(select(Study.id).where(Study.id == study.id).with_for_update())


def new_running_trial(
    session: Session,
    study: Study,
    params: Mapping[str, Any],
    *,
    context: Mapping[str, Any] | None = None,
    **columns: Any,
) -> Trial:
    """A running trial of ``study`` numbered after its last one, not yet added: the caller adds
    it (and retries with a new number if another writer took this one)."""
    number = (
        session.scalar(select(func.max(Trial.number)).where(Trial.study_id == study.id)) or 0
    ) + 1
    return Trial(
        study_id=study.id,
        number=number,
        params=dict(params),
        state="running",
        measurements=TrialMeasurements.running(context).to_json(),
        **columns,
    )


def list_studies(session: Session, job: Job) -> list[Study]:
    return list(session.scalars(select(Study).where(Study.job_id == job.id).order_by(Study.id)))


def get_study(session: Session, job: Job, ref: str) -> Study | None:
    """The study of ``job`` named ``ref``, or with id ``ref`` when it is all digits."""
    found_id = row_id(ref)
    if found_id is not None:
        by = Study.id == found_id
    elif ref.isascii() and ref.isdigit():
        by = false()  # all digits is an id (names never are), here past any id's range
    else:
        by = Study.name == ref
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


def study_trials(session: Session, study: Study) -> list[Trial]:
    query = select(Trial).where(Trial.study_id == study.id).order_by(Trial.number)
    return list(session.scalars(query))


def check_state(state: str) -> TrialState:
    for known in TRIAL_STATES:
        if state == known:
            return known
    raise StudyError(f"unknown trial state {state!r}; known: {', '.join(TRIAL_STATES)}")


def observation(trial: Trial, space: SearchSpace) -> Observation:
    """A trial as strategies see it; a baseline trial is an ordinary observation."""
    stored = TrialMeasurements.from_json(trial.measurements)
    state: TrialState = check_state(trial.state)
    return Observation(
        number=trial.number,
        # Drop the learning rate (and anything else not tuned) that travels with the params.
        config={k: v for k, v in trial.params.items() if k in space},
        state=state,
        value=trial.value if state == "complete" else None,
        stderr=stored.stderr,
        reason=stored.reason,
        context=stored.context,
    )


def history(
    session: Session, study: Study, keep: Callable[[Trial], bool] | None = None
) -> list[Observation]:
    """The study's trials (those ``keep`` keeps: default all) as frozen observations, in
    trial-number order."""
    space = study_space(study)
    return [observation(t, space) for t in study_trials(session, study) if keep is None or keep(t)]


def best(session: Session, study: Study) -> Trial | None:
    """The complete trial with the best value for the study's direction (earliest on ties)."""
    query = select(Trial).where(Trial.study_id == study.id, Trial.state == "complete")
    order = Trial.value.desc() if study.direction == "maximize" else Trial.value.asc()
    return session.scalars(query.order_by(order, Trial.number).limit(1)).first()


__all__: Sequence[str] = [
    "StudyError",
    "best",
    "check_state",
    "get_study",
    "history",
    "list_studies",
    "list_trials",
    "lock_study",
    "observation",
    "study_options",
    "study_space",
    "study_strategy",
    "study_trials",
]
