"""Guarded trials of an ``slo_throughput`` study: a trial that breaks the SLO on live traffic
costs seconds, not its whole window (docs/tuner.md, "Guarded trials").

An inference study measures each configuration on the requests the service is answering: a
configuration that cannot carry the load fills the queue and misses the SLO for every request
of its window. So, while a trial (not the pre-study one) runs, every pass of the loop reads the
P99 of the requests since its config was applied; once ``GuardPolicy.after_s`` have passed and
it is over ``p99_factor`` x the SLO, the trial ends ``infeasible`` (an SLO breach whose reason
says which way it broke, ``tuner.slo_breach``, for the strategies' SLO rule) and the job goes
back to the **incumbent**: the best feasible configuration measured so far (the pooled estimate of
``best_estimate``), else the pre-study config. The incumbent then runs for ``hold_s`` before
the next trial starts, so that the queue the bad trial left drains on a configuration known to
carry the load rather than on the next experiment; after several guarded trials in a row the
hold doubles each time (the service has no room for experiments now). And no trial starts
while the P99 of the last ``hold_s`` is over ``explore_below`` x the SLO: a service already near
its SLO has no headroom to explore with, and a trial measured then would measure the overload.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuneloop.job_configs import latest_config, propose
from tuneloop.storage.models import Job, Study, Trial
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.timeseries.store_backend import StoreBackend
from tuner import load_bands, readings
from tuner.loop_measure import P99, StepResult, audit_trial, tell_trial
from tuner.objectives import SLO_OBJECTIVES, check_direction
from tuner.slo_breach import breach_reason
from tuner.strategies.base import best_estimate
from tuner.study_baseline import pre_study_config
from tuner.study_options import StudyOptions
from tuner.study_records import history, study_space
from tuner.trial_measurements import TrialMeasurements

GUARD_REASON: Final = "slo: guard"
"""The verdict of a trial the guard ended (an SLO breach: ``tuner.slo_breach`` says which way)."""
GUARDED_OBJECTIVES: Final = SLO_OBJECTIVES
MAX_HOLD_DOUBLINGS: Final = 3
"""The hold after guarded trials in a row doubles at most this many times (8 x ``hold_s``)."""


def guard_trial(
    session: Session,
    study: Study,
    job: Job,
    trial: Trial,
    options: StudyOptions,
    now: datetime,
    series: TimeSeriesBackend | None,
) -> StepResult | None:
    """End the running, applied ``trial`` early when its P99 so far breaks the guard, and put
    the job back on the incumbent; ``None`` when the trial goes on."""
    guard = options.guard
    applied = trial.applied_at
    if (
        not guard.enabled
        or study.objective not in GUARDED_OBJECTIVES
        or options.slo_s is None
        or trial.baseline
        or applied is None
    ):
        return None
    elapsed = (now - applied).total_seconds()
    end = options.measurement.window_end(applied.timestamp(), trial.extensions)
    if elapsed < guard.after_s or now.timestamp() >= end:
        return None  # too early to judge, or the window's own verdict is due
    series = series or StoreBackend(session.connection())
    p99 = readings.latency_quantile(series, job.project_id, job.name, P99, start=applied, end=now)
    bound = guard.p99_factor * options.slo_s
    if p99 is None or p99 <= bound:
        return None
    verdict = (
        f"{GUARD_REASON}: p99 latency {p99:.4g} s > {bound:.4g} s "
        f"({guard.p99_factor:g} x SLO) {elapsed:.0f} s into the trial"
    )
    reason = breach_reason(verdict, trial.params, options.slo_s)
    offered = load_bands.offered_rate(series, job.project_id, job.name, start=applied, end=now)
    measured = {
        "guard": {
            load_bands.RATE_KEY: offered,
            "p99_latency_s": p99,
            "bound_s": bound,
            "elapsed_s": elapsed,
            "window": {"start": applied.isoformat(), "end": now.isoformat()},
        }
    }
    result = tell_trial(
        session, study, trial, state="infeasible", reason=reason, measurements=measured
    )
    _roll_back(session, study, job, trial, reason)
    return result


def _roll_back(session: Session, study: Study, job: Job, trial: Trial, reason: str) -> None:
    incumbent, which = _incumbent(session, study, trial)
    if incumbent is None:
        return
    previous = latest_config(session, job, "desired")
    config = {**(previous.config if previous is not None else {}), **incumbent}
    row = propose(session, job, config, origin="tuner-trial", study_id=study.id)
    details: dict[str, Any] = {
        "reason": reason,
        "incumbent": which,
        "config": incumbent,
        "desired_version": row.version,
    }
    audit_trial(session, study, job, "trial.guard", trial, details)
    session.flush()


def _incumbent(session: Session, study: Study, trial: Trial) -> tuple[dict[str, Any] | None, str]:
    """The best feasible configuration measured so far (its trials named), else the
    pre-study config; of the guarded trial's load band when the study keeps bands."""
    band = load_bands.trial_band(trial) if load_bands.banded(study) else None
    if band is not None:
        return load_bands.band_incumbent(session, study, band)
    space = study_space(study)
    best = best_estimate(history(session, study), check_direction(study.direction))
    if best is not None:
        return {k: v for k, v in best.config.items() if k in space}, f"trials {list(best.trials)}"
    before = pre_study_config(session, study)
    if before is None:
        return None, "none"
    config = {k: v for k, v in before.config.items() if k in space}
    return config, f"pre-study desired version {before.version}"


def holding(
    session: Session,
    study: Study,
    job: Job,
    options: StudyOptions,
    now: datetime,
    series: TimeSeriesBackend | None,
) -> str | None:
    """Why no trial starts yet, or ``None``: the incumbent runs ``hold_s`` after a guarded
    trial (doubled for each further one in a row, at most :data:`MAX_HOLD_DOUBLINGS` times),
    and no trial starts while the service's P99 over the last ``hold_s`` is above
    ``explore_below`` x the SLO (no headroom to explore with)."""
    guard = options.guard
    if not guard.enabled or study.objective not in GUARDED_OBJECTIVES or options.slo_s is None:
        return None
    recent = session.scalars(
        select(Trial)
        .where(Trial.study_id == study.id)
        .order_by(Trial.number.desc())
        .limit(MAX_HOLD_DOUBLINGS + 1)
    ).all()
    guarded = []
    for trial in recent:
        data = TrialMeasurements.from_json(trial.measurements).data.get("guard")
        if not isinstance(data, dict):
            break
        guarded.append(data)
    if guarded:
        # The loop's clock at the guard's verdict (the end of what it judged), as the loop's
        # other waits are counted.
        ended = guarded[0].get("window", {}).get("end")
        hold = guard.hold_s * 2 ** (len(guarded) - 1)
        if isinstance(ended, str):
            left = hold - (now - datetime.fromisoformat(ended)).total_seconds()
            if left > 0:
                return (
                    f"holding the incumbent for {left:.0f} s after {len(guarded)} guarded "
                    f"trial(s) in a row"
                )
    if guard.hold_s <= 0:
        return None
    series = series or StoreBackend(session.connection())
    start = now - timedelta(seconds=guard.hold_s)
    p99 = readings.latency_quantile(series, job.project_id, job.name, P99, start=start, end=now)
    bound = guard.explore_below * options.slo_s
    if p99 is not None and p99 > bound:
        return (
            f"no headroom to explore: p99 latency {p99:.4g} s over the last "
            f"{guard.hold_s:g} s > {bound:.4g} s ({guard.explore_below:g} x SLO)"
        )
    return None
