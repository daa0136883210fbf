"""Measuring a trial's window and recording what the loop learns about it (``tuner.loop``).

Once the trial's warm-up and window are over, its step-timing samples are judged
(``judge_window``): ``extend`` lengthens the window, ``fail`` fails the trial with its reason,
``accept`` scores the objective; an input that is missing (no noise scale, no latency data, no
energy counters of the job's GPUs) extends too, and never becomes a value. The window's
framebuffer reading of the job's GPUs is stored with the trial (the memory bound of later asks
is fitted on it, see ``tuner.memory``), and so is the energy reading a per-joule value came from.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from sqlalchemy.orm import Session

from tuneloop import promql
from tuneloop.accounts import record_audit
from tuneloop.storage.models import Job, Study, Trial
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.timeseries.store_backend import StoreBackend
from tuner import load_bands, promql_objective, readings, service
from tuner.measurement import Sample, TrialVerdict, WindowStats, judge_window
from tuner.objectives import ENERGY_OBJECTIVES, PROMQL, SLO_OBJECTIVES, Evaluation, get_objective
from tuner.slo_breach import breach_reason
from tuner.space import SearchSpace
from tuner.study_options import StudyOptions
from tuner.study_records import study_space
from tuner.trial_measurements import GPU_MEMORY_KEY, GPU_POWER_KEY

log = logging.getLogger(__name__)

ACTOR: Final = "tuner"
P99: Final = 0.99

Action = Literal[
    "skip",
    "asked",
    "awaiting_ack",
    "applied",
    "waiting",
    "extended",
    "told",
    "completed",
    "ended",
]


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one pass did (for logs and tests; the store holds the state)."""

    action: Action
    trial: int | None = None
    detail: str = ""


def measure_trial(
    session: Session,
    study: Study,
    job: Job,
    trial: Trial,
    options: StudyOptions,
    now: datetime,
    series: TimeSeriesBackend | None = None,
) -> StepResult:
    """Judge the trial's window; read from ``series`` (default: the store, in ``session``'s
    transaction)."""
    assert trial.applied_at is not None
    policy = options.measurement
    start = trial.applied_at
    end = policy.window_end(start.timestamp(), trial.extensions)
    if now.timestamp() < end:
        return StepResult("waiting", trial.number, f"window ends in {end - now.timestamp():.0f} s")
    warm = start + timedelta(seconds=policy.warmup_s)
    bind = session.connection()
    series = series or StoreBackend(bind)
    try:
        metric, samples = _window_samples(series, study, job, options, warm, now)
    except promql.PromQLError as exc:
        # The expression passed the check at creation but cannot be evaluated on these series
        # (many-to-many matching, too many samples): the trial cannot be measured. A timeout
        # is temporary and left to the next pass.
        return tell_trial(
            session,
            study,
            trial,
            state="failed",
            reason=f"objective_expr: {exc}",
            measurements={"window": {"start": start.isoformat(), "end": now.isoformat()}},
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
        return extend_trial(session, study, job, trial, verdict.reason, verdict.stats, window)
    if verdict.action == "fail":
        return tell_trial(
            session,
            study,
            trial,
            state="failed",
            reason=verdict.reason,
            measurements={"window": window, "stats": _stats(verdict.stats)},
        )
    uuids = readings.job_gpu_uuids(job.labels, readings.registered_gpu_uuids(bind, job.id))
    power = None
    if study.objective in ENERGY_OBJECTIVES:
        power = readings.gpu_power(series, job.project_id, job.name, uuids, start=warm, end=now)
    inputs = _objective_inputs(series, study, job, trial, options, verdict, warm, now, power)
    evaluation = get_objective(study.objective).evaluate(inputs)
    measured: dict[str, Any] = {
        "window": window,
        "stats": _stats(verdict.stats),
        "inputs": inputs,
    }
    if power is not None:
        measured[GPU_POWER_KEY] = power.to_dict()  # the joules behind the per-joule value
    # A value accepted at the budget while still noisy counts for less (its stderr says how
    # much); the flag and the verdict's words say why in the trial itself.
    measured["noisy"] = verdict.noisy
    measured["verdict"] = verdict.reason
    # The framebuffer the configuration needed: what the memory bound is fitted on.
    memory = readings.gpu_memory(series, job.project_id, job.name, uuids, start=warm, end=now)
    measured[GPU_MEMORY_KEY] = memory.to_dict() if memory is not None else None
    if evaluation.status == "missing":
        if trial.extensions >= policy.max_extensions:
            return tell_trial(
                session,
                study,
                trial,
                state="failed",
                reason=f"gave up after {trial.extensions} extensions: {evaluation.reason}",
                measurements=measured,
            )
        return extend_trial(session, study, job, trial, evaluation.reason, verdict.stats, window)
    if evaluation.status == "infeasible":
        reason = evaluation.reason
        if study.objective in SLO_OBJECTIVES and options.slo_s is not None:
            reason = breach_reason(reason, trial.params, options.slo_s)
        return tell_trial(
            session,
            study,
            trial,
            state="infeasible",
            reason=reason,
            measurements=measured,
        )
    assert evaluation.value is not None and verdict.value is not None
    return tell_trial(
        session,
        study,
        trial,
        state="complete",
        value=evaluation.value,
        stderr=_scaled_stderr(evaluation, verdict),
        measurements=measured,
    )


def _window_samples(
    series: TimeSeriesBackend,
    study: Study,
    job: Job,
    options: StudyOptions,
    warm: datetime,
    now: datetime,
) -> tuple[str, list[Sample]]:
    """What the window is judged on (the metric, or the PromQL expression) and its samples."""
    if study.objective == PROMQL and options.objective_expr is not None:
        expr = options.objective_expr
        samples = promql_objective.window_samples(
            series, job.project_id, job.name, expr, start=warm, end=now
        )
        return expr, samples
    metric = readings.primary_metric(study.objective)
    samples = readings.window_samples(
        series,
        job.project_id,
        job.name,
        metric,
        start=warm,
        end=now,
        per_job=metric in readings.PER_JOB_METRICS,
    )
    return metric, samples


def _objective_inputs(
    series: TimeSeriesBackend,
    study: Study,
    job: Job,
    trial: Trial,
    options: StudyOptions,
    verdict: TrialVerdict,
    warm: datetime,
    now: datetime,
    power: readings.GpuPower | None,
) -> dict[str, float | None]:
    """The objective's inputs: the judged series' mean plus what else its formula needs
    (``power``: the job's GPUs' over the window, read for the per-joule objectives)."""
    value = verdict.value
    if study.objective == PROMQL:
        return {"value": value}
    if study.objective == "step_time":
        return {"step_time_s": value}
    if study.objective == "slo_throughput":
        p99 = readings.latency_quantile(series, job.project_id, job.name, P99, start=warm, end=now)
        return {"throughput": value, "p99_latency_s": p99, "slo_s": options.slo_s}
    if study.objective == "offered_load_p99":
        p99 = readings.latency_quantile(series, job.project_id, job.name, P99, start=warm, end=now)
        return {
            load_bands.RATE_KEY: load_bands.offered_rate(
                series, job.project_id, job.name, start=warm, end=now
            ),
            "served_rate": load_bands.served_rate(
                series, job.project_id, job.name, start=warm, end=now
            ),
            "p99_latency_s": p99,
            "slo_s": options.slo_s,
        }
    if study.objective in ENERGY_OBJECTIVES:
        unit = "throughput_tokens_s" if study.objective == "tokens_per_joule" else ""
        return {
            unit or "throughput_samples_s": value,
            "gpu_power_w": power.watts if power is not None else None,
            "throughput_floor": options.throughput_floor or 0.0,
        }
    inputs: dict[str, float | None] = {"throughput_samples_s": value}
    if study.objective == "goodput":
        space = study_space(study)
        ranks = options.ranks or readings.rank_count(series, job.project_id, job.name) or None
        inputs["effective_batch"] = _effective_batch(space, trial, ranks)
        inputs["noise_scale"] = readings.window_mean(
            series, job.project_id, job.name, readings.NOISE_SCALE_METRIC, start=warm, end=now
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


def extend_trial(
    session: Session,
    study: Study,
    job: Job,
    trial: Trial,
    reason: str,
    stats: WindowStats | None,
    window: dict[str, Any],
) -> StepResult:
    trial.extensions += 1
    audit_trial(
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


def tell_trial(
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


def audit_trial(
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
