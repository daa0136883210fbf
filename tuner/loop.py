"""The tuning loop: one reconcile pass over one study, driven by a periodic task.

Each pass locks the study row, re-reads everything from the store and moves the study at most
one step; all progress is in the store, so a pass that dies mid-way is rolled back and the next
one repeats nothing and loses nothing:

1. no running trial: ask the strategy, write the proposal (with its learning rate) as the
   job's next **desired config version**, store the trial as ``running`` with that version;
2. the job reports the trial failed or out of memory (an observed config acknowledging the
   version with ``status`` ``oom``/``failed``, or the job ``failed``): the trial is
   ``infeasible``;
3. waiting for the job to acknowledge the version (an observed config whose
   ``desired_version`` is at least the trial's); after ``ack_timeout_s`` the trial ``failed``;
   a newer desired version written by someone else also fails it (its measurement would be of
   another config) and stops the study until someone resumes it; after a timeout no trial
   starts until the job reports again;
4. acknowledged: the window starts at the acknowledgement; once warm-up and window are over
   the trial's step-timing samples are judged (``judge_window``): ``extend`` lengthens the
   window, ``fail`` fails the trial with its reason, ``accept`` scores the objective; an input
   that is missing (no noise scale, no latency data) extends too, and never becomes a value;
   the window's framebuffer reading of the job's GPUs is stored with the trial (the memory
   bound of later asks is fitted on it, see ``tuner.memory``);
5. ``max_trials`` finished: the best configuration is written as the desired config and the
   study is ``complete``.

Every decision goes to the audit log with the measurements behind it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tuneloop.accounts import record_audit
from tuneloop.job_configs import (
    FAILED_STATUSES,
    REASON_KEY,
    STATUS_KEY,
    STUDY_SOURCE_PREFIX,
    acknowledged_version,
    first_acknowledgement,
    latest_config,
)
from tuneloop.storage.models import Job, JobConfig, Study, Trial
from tuner import readings, service
from tuner.actuators.protocol import append_config  # checks bounds, wakes the job's agents
from tuner.measurement import TrialVerdict, WindowStats, judge_window
from tuner.objectives import Evaluation, get_objective
from tuner.space import SearchSpace
from tuner.strategies.base import REASON_OOM, SpaceExhausted
from tuner.study_options import StudyOptions

log = logging.getLogger(__name__)

ACTOR: Final = "tuner"
INACTIVE_JOB_STATUSES: Final = ("paused", "succeeded", "failed", "cancelled")
"""No new trial starts while the job is in one of these."""
P99: Final = 0.99
ACK_TIMEOUT_KEY: Final = "ack_timeout"
"""Marks, in a failed trial's measurements, that the job never acknowledged it."""

Action = Literal[
    "skip", "asked", "awaiting_ack", "applied", "waiting", "extended", "told", "completed"
]


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one pass did (for logs and tests; the store holds the state)."""

    action: Action
    trial: int | None = None
    detail: str = ""


def config_source(study: Study) -> str:
    """``JobConfig.source`` of the desired configs a study writes."""
    return f"{STUDY_SOURCE_PREFIX}{study.id}"


def reconcile_study(session: Session, study_id: int, *, now: datetime) -> StepResult:
    """Move study ``study_id`` one step at time ``now``; the caller commits."""
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
        return _start_trial(session, study, job, options)
    return _advance_trial(session, study, job, trial, options, now)


# --------------------------------------------------------------------------- starting


def _start_trial(session: Session, study: Study, job: Job, options: StudyOptions) -> StepResult:
    if options.max_trials is not None:
        finished = session.scalar(
            select(func.count()).where(Trial.study_id == study.id, Trial.state != "running")
        )
        if (finished or 0) >= options.max_trials:
            return _complete(session, study, job, f"{options.max_trials} trials done")
    if job.status in INACTIVE_JOB_STATUSES:
        return StepResult("skip", detail=f"job is {job.status}")
    if _unresponsive(session, study, job):
        return StepResult("skip", detail="the job has not reported since its last trial timed out")
    try:
        trial = service.ask(session, study, actor=ACTOR)
    except SpaceExhausted as exc:
        return _complete(session, study, job, f"nothing left to try: {exc}")
    row = _write_desired(session, study, job, dict(trial.params))
    trial.desired_version = row.version
    _audit(
        session,
        study,
        job,
        "trial.apply",
        trial,
        {"desired_version": row.version, "config": dict(trial.params)},
    )
    session.flush()
    return StepResult("asked", trial.number, f"desired version {row.version}")


def _unresponsive(session: Session, study: Study, job: Job) -> bool:
    """The last trial was never acknowledged and the job has reported nothing since: another
    trial would only time out too, and each one burns a configuration (failed trials are not
    proposed again)."""
    last = session.scalars(
        select(Trial).where(Trial.study_id == study.id).order_by(Trial.number.desc()).limit(1)
    ).first()
    if last is None or not (last.measurements or {}).get("data", {}).get(ACK_TIMEOUT_KEY):
        return False
    observed = latest_config(session, job, "observed")
    return observed is None or (
        last.completed_at is not None and observed.created_at <= last.completed_at
    )


def _write_desired(session: Session, study: Study, job: Job, params: dict[str, Any]) -> JobConfig:
    # The tuned keys replace theirs; whatever else the job's desired config holds stays.
    previous = latest_config(session, job, "desired")
    config = {**(previous.config if previous is not None else {}), **params}
    return append_config(session, job, "desired", config, source=config_source(study))


def _complete(session: Session, study: Study, job: Job, why: str) -> StepResult:
    top = service.best(session, study)
    details: dict[str, Any] = {"study_id": study.id, "why": why, "best": None}
    if top is not None:
        row = _write_desired(session, study, job, dict(top.params))
        details["best"] = {
            "number": top.number,
            "value": top.value,
            "config": dict(top.params),
            "desired_version": row.version,
        }
    study.state = "complete"
    record_audit(
        session,
        actor=ACTOR,
        action="study.complete",
        target=f"study:{study.id}",
        project_id=job.project_id,
        details=details,
    )
    session.flush()
    return StepResult("completed", top.number if top is not None else None, why)


# --------------------------------------------------------------------------- advancing


def _advance_trial(
    session: Session,
    study: Study,
    job: Job,
    trial: Trial,
    options: StudyOptions,
    now: datetime,
) -> StepResult:
    version = trial.desired_version
    if version is None:  # pragma: no cover - an agent's trial in a tuner-driven study
        return StepResult("skip", trial.number, "trial has no desired version")

    observed = latest_config(session, job, "observed")
    if observed is not None:
        acked = acknowledged_version(observed.config)
        status = observed.config.get(STATUS_KEY)
        if acked is not None and acked >= version and status in FAILED_STATUSES:
            detail = str(observed.config.get(REASON_KEY) or "reported by the job")
            reason = REASON_OOM if status == REASON_OOM else f"failed: {detail}"
            return _tell(
                session,
                study,
                trial,
                state="infeasible",
                reason=reason,
                measurements={
                    "desired_version": version,
                    "observed_version": observed.version,
                    "status": status,
                    "detail": detail,
                },
            )
    if job.status == "failed":
        return _tell(
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
        result = _tell(
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
                return _tell(
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
                        "waited_s": waited,
                        ACK_TIMEOUT_KEY: True,
                    },
                )
            return StepResult("awaiting_ack", trial.number, f"desired version {version}")
        trial.applied_at = ack.created_at
        _audit(
            session,
            study,
            job,
            "trial.applied",
            trial,
            {"desired_version": version, "observed_version": ack.version},
        )
        session.flush()
        return StepResult("applied", trial.number, f"observed version {ack.version}")

    return _measure(session, study, job, trial, options, now)


def _measure(
    session: Session,
    study: Study,
    job: Job,
    trial: Trial,
    options: StudyOptions,
    now: datetime,
) -> StepResult:
    assert trial.applied_at is not None
    policy = options.measurement
    start = trial.applied_at
    end = policy.window_end(start.timestamp(), trial.extensions)
    if now.timestamp() < end:
        return StepResult("waiting", trial.number, f"window ends in {end - now.timestamp():.0f} s")
    warm = start + timedelta(seconds=policy.warmup_s)
    bind = session.connection()
    metric = readings.primary_metric(study.objective)
    samples = readings.window_samples(
        bind,
        job.project_id,
        job.name,
        metric,
        start=warm,
        end=now,
        per_job=metric == readings.THROUGHPUT_METRIC,
    )
    verdict = judge_window(
        samples,
        window_start=start.timestamp(),
        now=now.timestamp(),
        extensions=trial.extensions,
        policy=policy,
    )
    window = {
        "start": start.isoformat(),
        "warm": warm.isoformat(),
        "end": now.isoformat(),
        "extensions": trial.extensions,
        "metric": metric,
        "desired_version": trial.desired_version,
    }
    if verdict.action == "wait":  # pragma: no cover - checked above
        return StepResult("waiting", trial.number, verdict.reason)
    if verdict.action == "extend":
        return _extend(session, study, job, trial, verdict.reason, verdict.stats, window)
    if verdict.action == "fail":
        return _tell(
            session,
            study,
            trial,
            state="failed",
            reason=verdict.reason,
            measurements={"window": window, "stats": _stats(verdict.stats)},
        )
    inputs = _objective_inputs(session, study, job, trial, options, verdict, warm, now)
    evaluation = get_objective(study.objective).evaluate(inputs)
    measured = {"window": window, "stats": _stats(verdict.stats), "inputs": inputs}
    # The framebuffer the configuration needed: what the memory bound is fitted on.
    uuids = readings.job_gpu_uuids(job.labels, readings.registered_gpu_uuids(bind, job.id))
    memory = readings.gpu_memory(bind, job.project_id, job.name, uuids, start=warm, end=now)
    measured[service.GPU_MEMORY_KEY] = memory.to_dict() if memory is not None else None
    if evaluation.status == "missing":
        if trial.extensions >= policy.max_extensions:
            return _tell(
                session,
                study,
                trial,
                state="failed",
                reason=f"gave up after {trial.extensions} extensions: {evaluation.reason}",
                measurements=measured,
            )
        return _extend(session, study, job, trial, evaluation.reason, verdict.stats, window)
    if evaluation.status == "infeasible":
        return _tell(
            session,
            study,
            trial,
            state="infeasible",
            reason=evaluation.reason,
            measurements=measured,
        )
    assert evaluation.value is not None and verdict.value is not None
    return _tell(
        session,
        study,
        trial,
        state="complete",
        value=evaluation.value,
        stderr=_scaled_stderr(evaluation, verdict),
        measurements=measured,
    )


def _objective_inputs(
    session: Session,
    study: Study,
    job: Job,
    trial: Trial,
    options: StudyOptions,
    verdict: TrialVerdict,
    warm: datetime,
    now: datetime,
) -> dict[str, float | None]:
    """The objective's inputs: the judged series' mean plus what else its formula needs."""
    bind = session.connection()
    value = verdict.value
    if study.objective == "step_time":
        return {"step_time_s": value}
    if study.objective == "slo_throughput":
        p99 = readings.latency_quantile(bind, job.project_id, job.name, P99, start=warm, end=now)
        return {"throughput": value, "p99_latency_s": p99, "slo_s": options.slo_s}
    inputs: dict[str, float | None] = {"throughput_samples_s": value}
    if study.objective == "goodput":
        space = service.study_space(study)
        ranks = options.ranks or readings.rank_count(bind, job.project_id, job.name) or None
        inputs["effective_batch"] = _effective_batch(space, trial, ranks)
        inputs["noise_scale"] = readings.window_mean(
            bind, job.project_id, job.name, readings.NOISE_SCALE_METRIC, start=warm, end=now
        )
        inputs["base_batch"] = float(space.base_batch) if space.base_batch is not None else None
    return inputs


def _effective_batch(space: SearchSpace, trial: Trial, ranks: int | None) -> float | None:
    if ranks is None:
        return None
    config = {k: v for k, v in trial.params.items() if k in space}
    return float(space.effective_batch(config, ranks))


def _scaled_stderr(evaluation: Evaluation, verdict: TrialVerdict) -> float:
    # The objective is the judged mean times a factor measured without its own error bar
    # (efficiency, or 1): the relative error carries over.
    assert evaluation.value is not None and verdict.value is not None
    assert verdict.stderr is not None
    if verdict.value == 0:
        return verdict.stderr
    return abs(verdict.stderr * evaluation.value / verdict.value)


def _extend(
    session: Session,
    study: Study,
    job: Job,
    trial: Trial,
    reason: str,
    stats: WindowStats | None,
    window: dict[str, Any],
) -> StepResult:
    trial.extensions += 1
    _audit(
        session,
        study,
        job,
        "trial.extend",
        trial,
        {
            "reason": reason,
            "extensions": trial.extensions,
            "window": window,
            "stats": _stats(stats),
        },
    )
    session.flush()
    return StepResult("extended", trial.number, reason)


def _tell(
    session: Session,
    study: Study,
    trial: Trial,
    *,
    state: str,
    value: float | None = None,
    stderr: float | None = None,
    reason: str | None = None,
    measurements: dict[str, Any],
) -> StepResult:
    service.tell(
        session,
        study,
        trial.number,
        state=state,
        value=value,
        stderr=stderr,
        reason=reason,
        measurements=measurements,
        actor=ACTOR,
    )
    log.info("study %s trial %s: %s %s", study.id, trial.number, state, reason or value)
    return StepResult("told", trial.number, state if reason is None else f"{state}: {reason}")


def _audit(
    session: Session, study: Study, job: Job, action: str, trial: Trial, details: dict[str, Any]
) -> None:
    record_audit(
        session,
        actor=ACTOR,
        action=action,
        target=f"study:{study.id}/trial:{trial.number}",
        project_id=job.project_id,
        details={"study_id": study.id, "number": trial.number, **details},
    )


def _stats(stats: WindowStats | None) -> dict[str, Any] | None:
    if stats is None:
        return None
    return {
        "n": stats.n,
        "mean": _json_float(stats.mean),
        "stderr": _json_float(stats.stderr),
        "rel_stderr": _json_float(stats.rel_stderr),
        "dropped": stats.dropped,
    }


def _json_float(value: float) -> float | None:
    # JSON has no NaN or infinity: "no estimate" is null.
    return value if value == value and abs(value) != float("inf") else None


def running_study_ids(session: Session) -> list[int]:
    """Studies the loop works on (those an agent drives are skipped by the pass itself)."""
    return list(
        session.scalars(select(Study.id).where(Study.state == "running").order_by(Study.id))
    )


__all__ = [
    "INACTIVE_JOB_STATUSES",
    "StepResult",
    "config_source",
    "reconcile_study",
    "running_study_ids",
]
