"""How a study ends, and the one desired config it leaves the job on.

A study starts from the job's **pre-study config** (``Study.baseline_version``: the desired
version before its first trial) and measures it as its first trial (``Trial.baseline``), on the
same objective and window as every other trial. Whatever ends a study, the job is left on a
config that was measured as good:

- ``complete`` (``max_trials`` done, or nothing left to try): the best trial is applied only if
  it beats the baseline trial by more than the noise (:func:`beats_baseline`); otherwise the
  pre-study config is restored, and the end reason says which. A study with load bands
  (``tuner.load_bands``) ends on the band the load is in: only that band's trials compete, as
  they did for its incumbent while the study ran;
- ``failed`` (no trial completed, the pre-study config could not be measured, the job stopped
  acknowledging or ended) and ``cancelled``: the pre-study config is restored;
- ``stopped`` (not an end: it may be resumed) restores it too, since a stop can last days.

Each restore or apply is ONE desired config of origin ``study-outcome`` (``origin_study_id``:
the study), which the actuator releases at once and records as the job's last good version.
A restore is written only while the job's desired config is one of the study's own trial
configs: a config someone else wrote since stays theirs, and a job never moved off its
pre-study config needs no new version. Every end goes to the audit log (``study.<state>``)
with its reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuneloop.accounts import record_audit
from tuneloop.errors import InvalidInput
from tuneloop.job_configs import latest_config, propose
from tuneloop.storage.models import Job, JobConfig, Study, Trial
from tuneloop.storage.types import utcnow
from tuner import load_bands, study_records
from tuner.objectives import check_direction
from tuner.space import ParamValue
from tuner.strategies.base import BestEstimate, Observation, best_estimate, config_key
from tuner.study_baseline import baseline_trials, pre_study_config

END_STATES: Final = ("complete", "failed", "cancelled")
"""A study in one of these runs no more trials and cannot be resumed."""
NOISE_MULTIPLE: Final = 2.0
"""How many standard errors of the difference the best trial must beat the baseline by."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What ending a study did: its state, why, and the desired version it wrote (if any)."""

    state: str
    reason: str
    version: int | None
    trial: int | None = None
    """The best trial of a completed study."""


def beats_baseline(direction: str, top: BestEstimate, base: BestEstimate) -> tuple[bool, str]:
    """Whether ``top`` beats ``base`` by more than the noise, and the figures saying so.

    The rule: the difference of the two values, in the study's direction, must exceed
    :data:`NOISE_MULTIPLE` x ``hypot(se_top, se_base)``. The hypot is the standard error of
    the difference of two independent means; two of them make a one-sided test with about 2%
    false positives under normal errors. The margin matters because the best of several noisy
    trials is chosen for being high: without it a config that was only measured luckily would
    replace one the job ran well on.
    """
    sign = 1.0 if direction == "maximize" else -1.0
    gain = sign * (top.value - base.value)
    noise = math.hypot(top.stderr, base.stderr)
    figures = (
        f"{_described(top)} vs the pre-study config's {_described(base)}: difference "
        f"{gain:.3g}, {NOISE_MULTIPLE:g} x noise {NOISE_MULTIPLE * noise:.3g}"
    )
    return gain > NOISE_MULTIPLE * noise, figures


def _described(estimate: BestEstimate) -> str:
    numbers = ", ".join(str(n) for n in estimate.trials)
    label = "trial" if len(estimate.trials) == 1 else "trials"
    return f"{label} {numbers} ({estimate.value:.6g} ± {estimate.stderr:.3g})"


def restore_pre_study(session: Session, study: Study, job: Job) -> tuple[JobConfig | None, str]:
    """Put the job back on its pre-study config if the study's trials moved it; returns the
    version written (if any) and what happened, in words."""
    current = latest_config(session, job, "desired")
    if current is None or (current.origin, current.origin_study_id) != ("tuner-trial", study.id):
        if current is not None and current.version != study.baseline_version:
            return None, f"desired version {current.version} ({current.source}) stays"
        return None, "the job stays on its pre-study config"
    before = pre_study_config(session, study)
    if before is None:
        return None, "no pre-study config was recorded: the job stays where it is"
    try:
        row = propose(session, job, before.config, origin="study-outcome", study_id=study.id)
    except InvalidInput as exc:
        return None, f"the pre-study config could not be restored: {exc}"
    return row, f"the job is back on its pre-study config (version {before.version})"


def _apply(session: Session, study: Study, job: Job, top: Trial) -> JobConfig:
    # The tuned keys (and their learning rate) replace the pre-study ones; the rest stays.
    before = pre_study_config(session, study) or latest_config(session, job, "desired")
    config = {**(before.config if before is not None else {}), **top.params}
    return propose(session, job, config, origin="study-outcome", study_id=study.id)


def complete(
    session: Session,
    study: Study,
    job: Job,
    why: str,
    *,
    actor: str,
    band: tuple[float, int] | None = None,
) -> Outcome:
    """End a study whose trials are done: apply the config it keeps (``best_estimate``: each
    configuration's trials pooled, ranked one standard error pessimistically) if it beat the
    pre-study config by more than the noise, else restore the pre-study config; ``failed``
    when no trial completed. With the load's ``(rate, band)`` (``tuner.load_bands``) only that
    band's trials compete; a pre-study config measured only in other bands counts as not
    measured."""
    direction = check_direction(study.direction)
    keep = None if band is None else load_bands.in_band(band[1])
    history = study_records.history(session, study, keep)
    if band is not None:
        why = f"{why}; ended in load band {band[1]} ({band[0]:.3g}/s)"
    top = best_estimate(history, direction)
    if top is None:
        return fail(session, study, job, f"{why}; no trial completed", actor=actor)
    chosen = session.scalars(
        select(Trial).where(Trial.study_id == study.id, Trial.number == top.trials[-1])
    ).one()
    bases = baseline_trials(session, study)
    competing = {o.number for o in history}
    measured = [t for t in bases if t.state == "complete" and t.number in competing]
    details: dict[str, Any] = {"why": why, "best": _summary(top, chosen)}
    if measured:
        key = config_key(_config_of(history, measured[-1].number))
        base = best_estimate([o for o in history if config_key(o.config) == key], direction)
        assert base is not None  # the baseline trial itself is complete
        details["baseline"] = _summary(base, measured[-1])
        better, figures = beats_baseline(study.direction, top, base)
        if config_key(top.config) == key or not better:
            row, restored = restore_pre_study(session, study, job)
            verdict = (
                f"the pre-study config was the best measured ({_described(base)})"
                if config_key(top.config) == key
                else f"no trial beat the pre-study config by more than the noise ({figures})"
            )
            reason = f"{why}; {verdict}; {restored}"
            return _end(session, study, job, "complete", reason, row, actor, details)
        reason = f"{why}; {figures}: applied trial {chosen.number}"
    elif bases and all(t.state == "infeasible" for t in bases) and band is None:
        reason = f"{why}; the pre-study config was infeasible: applied trial {chosen.number}"
    else:
        reason = f"{why}; no measurement of the pre-study config: applied trial {chosen.number}"
    row = _apply(session, study, job, chosen)
    return _end(session, study, job, "complete", reason, row, actor, details)


def _config_of(history: Sequence[Observation], number: int) -> Mapping[str, ParamValue]:
    return next(o.config for o in history if o.number == number)


def fail(session: Session, study: Study, job: Job, why: str, *, actor: str) -> Outcome:
    """End a study ``failed`` and put the job back on its pre-study config."""
    row, restored = restore_pre_study(session, study, job)
    return _end(session, study, job, "failed", f"{why}; {restored}", row, actor, {"why": why})


def cancel(session: Session, study: Study, job: Job, why: str, *, actor: str) -> Outcome:
    """End a study ``cancelled`` and put the job back on its pre-study config."""
    row, restored = restore_pre_study(session, study, job)
    return _end(session, study, job, "cancelled", f"{why}; {restored}", row, actor, {"why": why})


def _end(
    session: Session,
    study: Study,
    job: Job,
    state: str,
    reason: str,
    row: JobConfig | None,
    actor: str,
    details: dict[str, Any],
) -> Outcome:
    previous = study.state
    study.state = state
    study.end_reason = reason
    study.ended_at = utcnow()
    if row is not None:
        study.outcome_version = row.version
    record_audit(
        session,
        actor=actor,
        action=f"study.{state}",
        target=f"study:{study.id}",
        project_id=job.project_id,
        details={
            "study_id": study.id,
            "from": previous,
            "reason": reason,
            "desired_version": row.version if row is not None else None,
            "config": dict(row.config) if row is not None else None,
            **details,
        },
    )
    session.flush()
    best_number = details["best"]["number"] if isinstance(details.get("best"), dict) else None
    return Outcome(state, reason, row.version if row is not None else None, best_number)


def _summary(estimate: BestEstimate, trial: Trial) -> dict[str, Any]:
    """An estimate for the audit log: pooled value and error, its trials, the config."""
    return {
        "number": trial.number,
        "trials": list(estimate.trials),
        "value": estimate.value,
        "stderr": estimate.stderr,
        "config": dict(trial.params),
        "baseline": trial.baseline,
    }


__all__: Sequence[str] = [
    "END_STATES",
    "NOISE_MULTIPLE",
    "Outcome",
    "beats_baseline",
    "cancel",
    "complete",
    "fail",
    "restore_pre_study",
]
