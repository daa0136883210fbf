"""The pre-study config: the job's desired config before a study's first trial, which the
study measures first (its baseline trial) and puts the job back on when it ends without a
better config (``tuner.study_end``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuneloop.job_configs import latest_config
from tuneloop.storage.models import Job, JobConfig, Study, Trial
from tuner.space import SYNC_PERIOD, IntParam, ParamValue, SearchSpace
from tuner.study_records import StudyError, new_running_trial

LEARNING_RATE: Final = "learning_rate"
_POWERS_OF_TWO: Final = {
    "batch_size": "space.batch_powers_of_two",
    "sync_period": "space.sync_powers_of_two",
}
"""The study body's switch that keeps a parameter to powers of two (``api.schemas.studies``)."""
MAX_BASELINE_ATTEMPTS: Final = 2
"""Baseline trials that may fail (no usable measurement) before the study ends ``failed``:
a job whose current config cannot be measured cannot be tuned either."""


def require_pre_study_config(session: Session, job: Job, space: SearchSpace) -> JobConfig:
    """The job's latest desired config, which a tuner-driven study starts from; refused with a
    one-line :class:`StudyError` when there is none or the space's bounds exclude it."""
    current = latest_config(session, job, "desired")
    if current is None:
        raise StudyError(
            f"job {job.name!r} has no desired config to start the study from: start its agent "
            "(it registers the running config, docs/agent.md) or PUT the job's config first"
        )
    baseline_params(space, current)
    return current


def baseline_params(space: SearchSpace, config_row: JobConfig) -> dict[str, ParamValue]:
    """The study's parameters as the pre-study config sets them (a job without a
    ``sync_period`` synchronises every step), plus the learning rate the job runs with."""
    config = config_row.config
    params: dict[str, ParamValue] = {}
    for param in space.params:
        field = f"space.{param.name}"
        if param.name not in config and param.name == SYNC_PERIOD:
            params[param.name] = 1
        elif param.name not in config:
            raise StudyError(
                f"{field}: the job's config (desired version {config_row.version}) has no "
                f"{param.name}; set it in the job's config or leave {field} out"
            )
        else:
            params[param.name] = config[param.name]
        value = params[param.name]
        if not param.contains(value):
            raise StudyError(f"{field}: {_excluded(param, value, config_row.version)}")
    validated = space.validate(params)
    learning_rate = config.get(LEARNING_RATE)
    if isinstance(learning_rate, int | float) and not isinstance(learning_rate, bool):
        validated[LEARNING_RATE] = float(learning_rate)
    return validated


def _excluded(param: Any, value: object, version: int) -> str:
    running = f"the job runs {param.name}={value!r} (desired version {version})"
    if isinstance(param, IntParam) and isinstance(value, int) and param.low <= value <= param.high:
        switch = _POWERS_OF_TWO.get(param.name, "the space's powers_of_two")
        return f"{running}, not a power of two; set {switch} false"
    return (
        f"{running}, outside the study's bounds: widen them to include it (a study measures "
        "the job's current config first)"
    )


def baseline_trials(session: Session, study: Study) -> list[Trial]:
    return list(
        session.scalars(
            select(Trial)
            .where(Trial.study_id == study.id, Trial.baseline.is_(True))
            .order_by(Trial.number)
        )
    )


def pre_study_config(session: Session, study: Study) -> JobConfig | None:
    """The job's desired config before the study's first trial (``None`` if not recorded)."""
    if study.baseline_version is None:
        return None
    return session.scalars(
        select(JobConfig).where(
            JobConfig.job_id == study.job_id,
            JobConfig.kind == "desired",
            JobConfig.version == study.baseline_version,
        )
    ).first()


def start_baseline_trial(
    session: Session, study: Study, space: SearchSpace, *, now: datetime
) -> Trial | None:
    """A running trial of the pre-study config, carried by the pre-study version itself (the
    job already runs it: nothing new to release). ``None`` when no pre-study config is
    recorded (a study from before end states, or one an agent drives)."""
    before = pre_study_config(session, study)
    if before is None:
        return None
    trial = new_running_trial(
        session,
        study,
        baseline_params(space, before),
        started_at=now,
        desired_version=before.version,
        baseline=True,
    )
    session.add(trial)
    session.flush()
    return trial


__all__: Sequence[str] = [
    "MAX_BASELINE_ATTEMPTS",
    "baseline_params",
    "baseline_trials",
    "pre_study_config",
    "require_pre_study_config",
    "start_baseline_trial",
]
