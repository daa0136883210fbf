"""The tuning loop: one reconcile pass over one study, driven by a periodic task.

Each pass locks the study row, re-reads everything from the store and moves the study at most
one step; all progress is in the store, so a pass that dies mid-way is rolled back and the next
one repeats nothing and loses nothing:

1. no running trial: the first trial measures the job's pre-study config (the desired version
   recorded at creation; nothing new is written, the job already runs it, and its window starts
   with the trial); after that, ask the strategy, write the proposal (with its learning rate) as
   the job's next **desired config version** (origin ``tuner-trial``), store the trial
   as ``running`` with that version;
2. the job reports the trial failed or out of memory (an observed config acknowledging the
   version with ``status`` ``oom``/``failed``, or the job ``failed``): the trial is
   ``infeasible``;
3. waiting for the job to acknowledge the version (an observed config whose
   ``acknowledged_version`` is at least the trial's); after ``ack_timeout_s`` the trial ``failed``;
   a newer desired version written by someone else also fails it (its measurement would be of
   another config) and stops the study until someone resumes it (theirs stays); after a
   timeout no trial starts until the job reports again, and if it has not reported within
   another ``ack_timeout_s`` the study ends ``failed``;
4. acknowledged: the window is measured and judged (``tuner.loop_measure``); an
   ``slo_throughput`` trial whose P99 breaks the SLO before its window ends is ended early and
   the job put back on the incumbent, which runs a while before the next trial
   (``tuner.trial_guard``);
   an ``offered_load_p99`` study keeps one incumbent per band of the offered rate, learns from
   the current band's trials only, and puts the job on the band's incumbent without a trial
   when the load moves to another band or there is no headroom (``tuner.load_bands``);
5. ``max_trials`` finished or nothing left to try: the study ends (``tuner.study_end``): the
   best config is applied only if it beat the pre-study config by more than the noise, else the
   job goes back on the pre-study config; with no complete trial, or a pre-study config that
   could not be measured, or a job that ended, it is ``failed`` and the job goes back too.

Every decision goes to the audit log with the measurements behind it.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Final

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tuneloop.accounts import record_audit
from tuneloop.errors import InvalidInput
from tuneloop.job_configs import (
    FAILED_STATUSES,
    first_acknowledgement,
    latest_config,
    propose,
)
from tuneloop.storage.models import Job, JobConfig, Study, Trial
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuner import load_bands, service, study_end, trial_guard
from tuner.loop_measure import ACTOR, Action, StepResult, audit_trial, measure_trial, tell_trial
from tuner.strategies.base import REASON_OOM, SpaceExhausted
from tuner.study_baseline import MAX_BASELINE_ATTEMPTS, baseline_trials, start_baseline_trial
from tuner.study_options import StudyOptions
from tuner.trial_measurements import ACK_TIMEOUT_KEY, WAITED_S_KEY, TrialMeasurements

log = logging.getLogger(__name__)

INACTIVE_JOB_STATUSES: Final = ("paused", "succeeded", "failed", "cancelled")
"""No new trial starts while the job is in one of these."""
ENDED_JOB_STATUSES: Final = ("succeeded", "failed", "cancelled")
"""A job in one of these will not run another trial: its study ends ``failed``."""


def reconcile_study(
    session: Session,
    study_id: int,
    *,
    now: datetime,
    series: TimeSeriesBackend | None = None,
) -> StepResult:
    """Move study ``study_id`` one step at time ``now``; the caller commits. Trials are
    measured on ``series`` (default: the store, in ``session``'s transaction)."""
    study = session.get(Study, study_id)
    if study is None:
        return StepResult("skip", detail="no such study")
    service.lock_study(session, study)
    session.refresh(study)  # what the previous holder of the lock committed
    if study.state != "running":
        return StepResult("skip", detail=f"study is {study.state}")
    options = service.study_options(study)
    if options.driven_by != "tuner":
        return StepResult("skip", detail="driven by the job's agent")
    job = session.get(Job, study.job_id)
    if job is None:  # pragma: no cover - the foreign key cascades
        return StepResult("skip", detail="job gone")
    trial = session.scalars(
        select(Trial)
        .where(Trial.study_id == study.id, Trial.state == "running")
        .order_by(Trial.number.desc())
        .limit(1)
    ).first()
    if trial is None:
        return _start_trial(session, study, job, options, now, series)
    return _advance_trial(session, study, job, trial, options, now, series)


# --------------------------------------------------------------------------- starting


def _current_band(
    session: Session, study: Study, job: Job, now: datetime, series: TimeSeriesBackend | None
) -> tuple[float, int] | None:
    """The offered rate and its load band, for a study that keeps load bands; else ``None``."""
    if not load_bands.banded(study):
        return None
    return load_bands.current_band(series, session, study, job, now)


def _start_trial(
    session: Session,
    study: Study,
    job: Job,
    options: StudyOptions,
    now: datetime,
    series: TimeSeriesBackend | None,
) -> StepResult:
    if options.max_trials is not None:
        finished = session.scalar(
            select(func.count()).where(Trial.study_id == study.id, Trial.state != "running")
        )
        if (finished or 0) >= options.max_trials:
            band = _current_band(session, study, job, now, series)
            why = f"{options.max_trials} trials done"
            return _ended(study_end.complete(session, study, job, why, actor=ACTOR, band=band))
    if job.status in ENDED_JOB_STATUSES:
        return _ended(study_end.fail(session, study, job, f"the job is {job.status}", actor=ACTOR))
    if job.status in INACTIVE_JOB_STATUSES:
        return StepResult("skip", detail=f"job is {job.status}")
    silent = _unresponsive_for(session, study, job, now)
    if silent is not None:
        if silent > options.ack_timeout_s:
            why = (
                f"the job stopped acknowledging: nothing reported for {silent:.0f} s after a "
                f"trial's ack timeout (ack_timeout_s {options.ack_timeout_s:g}); is its agent "
                "running (docs/agent.md)?"
            )
            return _ended(study_end.fail(session, study, job, why, actor=ACTOR))
        return StepResult("skip", detail="the job has not reported since its last trial timed out")
    baseline = _baseline_step(session, study, job, now)
    if baseline is not None:
        return baseline
    held = trial_guard.holding(session, study, job, options, now, series)
    band = _current_band(session, study, job, now, series)
    if band is not None:
        switched = load_bands.follow_band(session, study, job, band[1], no_headroom=bool(held))
        if switched is not None:
            record_audit(
                session,
                actor=ACTOR,
                action="study.band_incumbent",
                target=f"study:{study.id}",
                project_id=job.project_id,
                details={"study_id": study.id, "offered_rate": band[0], **switched},
            )
            return StepResult(
                "skip", detail=f"band {band[1]}: on its incumbent ({switched['why']})"
            )
    if held is not None:
        return StepResult("skip", detail=held)
    context = None if band is None else {load_bands.RATE_KEY: band[0], load_bands.BAND_KEY: band[1]}
    keep = None if band is None else load_bands.in_band(band[1])
    try:
        trial = service.ask(session, study, actor=ACTOR, context=context, keep=keep)
    except SpaceExhausted as exc:  # its message says "nothing left to try"
        return _ended(study_end.complete(session, study, job, str(exc), actor=ACTOR, band=band))
    try:
        row = _write_desired(session, study, job, dict(trial.params))
    except InvalidInput as exc:
        # The job's actuation bounds refuse this config: it can never run, so it is
        # infeasible (not proposed again) rather than a pass that fails on every tick.
        return tell_trial(
            session, study, trial, state="infeasible", reason=f"refused: {exc}", measurements={}
        )
    trial.desired_version = row.version
    audit_trial(
        session,
        study,
        job,
        "trial.apply",
        trial,
        {"desired_version": row.version, "config": dict(trial.params)},
    )
    session.flush()
    return StepResult("asked", trial.number, f"desired version {row.version}")


def _baseline_step(session: Session, study: Study, job: Job, now: datetime) -> StepResult | None:
    """Start (or, after a failed one, retry) the trial of the pre-study config; end the study
    when it could not be measured :data:`MAX_BASELINE_ATTEMPTS` times. ``None``: measured."""
    if study.baseline_version is None:
        return None  # an older study: no pre-study config was recorded
    bases = baseline_trials(session, study)
    if any(t.state in ("complete", "infeasible") for t in bases):
        return None
    if len(bases) >= MAX_BASELINE_ATTEMPTS:
        last = TrialMeasurements.from_json(bases[-1].measurements).reason or "no measurement"
        why = f"the pre-study config could not be measured in {len(bases)} trials: {last}"
        return _ended(study_end.fail(session, study, job, why, actor=ACTOR))
    trial = start_baseline_trial(session, study, service.study_space(study), now=now)
    if trial is None:
        return None
    audit_trial(
        session,
        study,
        job,
        "trial.baseline",
        trial,
        {"desired_version": trial.desired_version, "config": dict(trial.params)},
    )
    return StepResult("asked", trial.number, f"pre-study desired version {trial.desired_version}")


def _unresponsive_for(session: Session, study: Study, job: Job, now: datetime) -> float | None:
    """Seconds since the last trial timed out unacknowledged, if the job has reported nothing
    since (``None`` otherwise): another trial would only time out too, and each one burns a
    configuration (failed trials are not proposed again)."""
    last = session.scalars(
        select(Trial).where(Trial.study_id == study.id).order_by(Trial.number.desc()).limit(1)
    ).first()
    if last is None:
        return None
    stored = TrialMeasurements.from_json(last.measurements)
    if not stored.ack_timed_out:
        return None
    observed = latest_config(session, job, "observed")
    if observed is not None and (
        last.completed_at is None or observed.created_at > last.completed_at
    ):
        return None
    # Timed out at the pass that waited waited_s after the trial started (the loop's clock).
    return (now - last.started_at).total_seconds() - stored.waited_s


def _write_desired(session: Session, study: Study, job: Job, params: dict[str, Any]) -> JobConfig:
    # The tuned keys replace theirs; whatever else the job's desired config holds stays.
    previous = latest_config(session, job, "desired")
    config = {**(previous.config if previous is not None else {}), **params}
    return propose(session, job, config, origin="tuner-trial", study_id=study.id)


def _ended(outcome: study_end.Outcome) -> StepResult:
    action: Action = "completed" if outcome.state == "complete" else "ended"
    return StepResult(action, outcome.trial, f"{outcome.state}: {outcome.reason}")


# --------------------------------------------------------------------------- advancing


def _advance_trial(
    session: Session,
    study: Study,
    job: Job,
    trial: Trial,
    options: StudyOptions,
    now: datetime,
    series: TimeSeriesBackend | None,
) -> StepResult:
    version = trial.desired_version
    if version is None:  # pragma: no cover - an agent's trial in a tuner-driven study
        return StepResult("skip", trial.number, "trial has no desired version")

    observed = latest_config(session, job, "observed")
    if observed is not None:
        acked = observed.acknowledged_version
        status = observed.status
        if acked is not None and acked >= version and status in FAILED_STATUSES:
            detail = observed.reason or "reported by the job"
            reason = REASON_OOM if status == REASON_OOM else f"failed: {detail}"
            return tell_trial(
                session,
                study,
                trial,
                state="infeasible",
                reason=reason,
                measurements={
                    "desired_version": version,
                    "acknowledged_version": acked,
                    "status": status,
                    "detail": detail,
                },
            )
    if job.status == "failed":
        return tell_trial(
            session,
            study,
            trial,
            state="infeasible",
            reason="failed: the job failed while running this configuration",
            measurements={"desired_version": version, "job_status": job.status},
        )

    desired = latest_config(session, job, "desired")
    if desired is not None and desired.version > version:
        # Someone else (a person, a rollback) set the config: the trial's measurement would be
        # of another config, and the next proposal would overwrite theirs. Stop until resumed.
        reason = f"superseded by desired version {desired.version} ({desired.source})"
        result = tell_trial(
            session,
            study,
            trial,
            state="failed",
            reason=reason,
            measurements={"desired_version": version, "superseded_by": desired.version},
        )
        service.set_state(session, study, "stopped", actor=ACTOR, reason=reason)
        return result

    if trial.applied_at is None:
        ack = first_acknowledgement(session, job, version)
        if ack is None:
            waited = (now - trial.started_at).total_seconds()
            if waited > options.ack_timeout_s:
                return tell_trial(
                    session,
                    study,
                    trial,
                    state="failed",
                    reason=(
                        f"the job did not acknowledge desired version {version} within "
                        f"{options.ack_timeout_s:g} s"
                    ),
                    measurements={
                        "desired_version": version,
                        WAITED_S_KEY: waited,
                        ACK_TIMEOUT_KEY: True,
                    },
                )
            return StepResult("awaiting_ack", trial.number, f"desired version {version}")
        # The pre-study version was acknowledged before the study began: its window starts
        # with the trial, as every other trial's starts with its acknowledgement.
        trial.applied_at = (
            max(ack.created_at, trial.started_at) if trial.baseline else ack.created_at
        )
        audit_trial(
            session,
            study,
            job,
            "trial.applied",
            trial,
            {"desired_version": version, "acknowledged_version": ack.acknowledged_version},
        )
        session.flush()
        return StepResult(
            "applied", trial.number, f"acknowledged as version {ack.acknowledged_version}"
        )

    guarded = trial_guard.guard_trial(session, study, job, trial, options, now, series)
    if guarded is not None:
        return guarded
    return measure_trial(session, study, job, trial, options, now, series)


def running_study_ids(session: Session) -> list[int]:
    """Studies the loop works on (those an agent drives are skipped by the pass itself)."""
    return list(
        session.scalars(select(Study.id).where(Study.state == "running").order_by(Study.id))
    )


__all__ = [
    "INACTIVE_JOB_STATUSES",
    "StepResult",
    "reconcile_study",
    "running_study_ids",
]
