"""How a study ends, and the one desired config it leaves the job on.

A study starts from the job's **pre-study config** (``Study.baseline_version``: the desired
version before its first trial) and measures it as its first trial (``Trial.baseline``), on the
same objective and window as every other trial. Whatever ends a study, the job is left on a
config that was measured as good:

- ``complete`` (``max_trials`` done, or nothing left to try): the best trial is applied only if
  it beats the baseline trial by more than the noise (:func:`beats_baseline`); otherwise the
  pre-study config is restored, and the end reason says which;
- ``failed`` (no trial completed, the pre-study config could not be measured, the job stopped
  acknowledging or ended) and ``cancelled``: the pre-study config is restored;
- ``stopped`` (not an end: it may be resumed) restores it too, since a stop can last days.

Each restore or apply is ONE desired config with ``source=study_outcome_source(study.id)``,
which the actuator releases at once and records as the job's last good version. A restore is
written only while the job's desired config is one of the study's own trial configs: a config
someone else wrote since stays theirs, and a job never moved off its pre-study config needs
no new version. Every end goes to the audit log (``study.<state>``) with its reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy.orm import Session

from tuneloop.accounts import InvalidInput, record_audit
from tuneloop.job_configs import latest_config, study_outcome_source, study_trial_source
from tuneloop.storage.models import Job, JobConfig, Study, Trial
from tuneloop.storage.types import utcnow
from tuner.actuators.protocol import append_config  # checks bounds, wakes the job's agents
from tuner.study_baseline import baseline_trials, pre_study_config
from tuner.study_records import best, trial_stderr

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


def beats_baseline(direction: str, top: Trial, base: Trial) -> tuple[bool, str]:
    """Whether ``top`` beats ``base`` by more than the noise, and the figures saying so.

    The rule: the difference of the two values, in the study's direction, must exceed
    :data:`NOISE_MULTIPLE` x ``hypot(se_top, se_base)`` (a missing stderr counts as 0). The
    hypot is the standard error of the difference of two independent means; two of them make
    a one-sided test with about 2% false positives under normal errors. The margin matters
    because the best of several noisy trials is chosen for being high: without it a config
    that was only measured luckily would replace one the job ran well on.
    """
    assert top.value is not None and base.value is not None
    sign = 1.0 if direction == "maximize" else -1.0
    gain = sign * (top.value - base.value)
    noise = math.hypot(trial_stderr(top) or 0.0, trial_stderr(base) or 0.0)
    figures = (
        f"trial {top.number} ({top.value:.6g}) vs the pre-study config's trial {base.number} "
        f"({base.value:.6g}): difference {gain:.3g}, {NOISE_MULTIPLE:g} x noise "
        f"{NOISE_MULTIPLE * noise:.3g}"
    )
    return gain > NOISE_MULTIPLE * noise, figures


def restore_pre_study(session: Session, study: Study, job: Job) -> tuple[JobConfig | None, str]:
    """Put the job back on its pre-study config if the study's trials moved it; returns the
    version written (if any) and what happened, in words."""
    current = latest_config(session, job, "desired")
    if current is None or current.source != study_trial_source(study.id):
        if current is not None and current.version != study.baseline_version:
            return None, f"desired version {current.version} ({current.source}) stays"
        return None, "the job stays on its pre-study config"
    before = pre_study_config(session, study)
    if before is None:
        return None, "no pre-study config was recorded: the job stays where it is"
    try:
        row = append_config(
            session, job, "desired", before.config, source=study_outcome_source(study.id)
        )
    except InvalidInput as exc:
        return None, f"the pre-study config could not be restored: {exc}"
    return row, f"the job is back on its pre-study config (version {before.version})"


def _apply(session: Session, study: Study, job: Job, top: Trial) -> JobConfig:
    # The tuned keys (and their learning rate) replace the pre-study ones; the rest stays.
    before = pre_study_config(session, study) or latest_config(session, job, "desired")
    config = {**(before.config if before is not None else {}), **top.params}
    return append_config(session, job, "desired", config, source=study_outcome_source(study.id))


def complete(session: Session, study: Study, job: Job, why: str, *, actor: str) -> Outcome:
    """End a study whose trials are done: apply its best config if it beat the pre-study one
    by more than the noise, else restore the pre-study config; ``failed`` when no trial
    completed."""
    top = best(session, study)
    if top is None:
        return fail(session, study, job, f"{why}; no trial completed", actor=actor)
    bases = baseline_trials(session, study)
    measured = [t for t in bases if t.state == "complete"]
    details: dict[str, Any] = {"why": why, "best": _trial_summary(top)}
    if measured:
        base = measured[-1]
        details["baseline"] = _trial_summary(base)
        better, figures = beats_baseline(study.direction, top, base)
        if top.number == base.number or not better:
            row, restored = restore_pre_study(session, study, job)
            verdict = (
                f"the pre-study config was the best measured (trial {base.number}, "
                f"{base.value:.6g})"
                if top.number == base.number
                else f"no trial beat the pre-study config by more than the noise ({figures})"
            )
            reason = f"{why}; {verdict}; {restored}"
            return _end(session, study, job, "complete", reason, row, actor, details)
        reason = f"{why}; {figures}: applied trial {top.number}"
    elif bases and all(t.state == "infeasible" for t in bases):
        reason = f"{why}; the pre-study config was infeasible: applied trial {top.number}"
    else:
        reason = f"{why}; no measurement of the pre-study config: applied trial {top.number}"
    row = _apply(session, study, job, top)
    return _end(session, study, job, "complete", reason, row, actor, details)


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


def _trial_summary(trial: Trial) -> dict[str, Any]:
    return {
        "number": trial.number,
        "value": trial.value,
        "stderr": trial_stderr(trial),
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
