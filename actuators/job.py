"""The job actuator's reconcile loop: read a job's desired, released and observed state from
the store, ask :func:`actuators.policy.decide` for the one next action, and write it.

Idempotent by construction: every input is re-read, every output is a row (a release, a
desired version, a mark, the actuator row's progress), and the decision for the state it
leaves behind is ``none`` or ``wait``. Two reconcilers racing on one job (the periodic task
and a long-poll) cannot both act: the actuator row carries a generation counter, and the
loser's transaction fails with :class:`ReconcileConflict` and changes nothing.

What people change (:func:`set_policy`, :func:`approve`) takes the ``actor`` (a token's
:func:`tuneloop.accounts.actor_name`) and writes the audit entry itself; the loop's own
actions are audited as :data:`ACTOR`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import StaleDataError

from actuators import holds
from actuators.policy import (
    Decision,
    Stats,
    Version,
    VersionRole,
    View,
    decide,
    verification_due,
)
from actuators.policy_config import ActuationPolicy
from tuneloop import accounts, errors, job_configs
from tuneloop.config_events import changed_after_commit
from tuneloop.errors import TemporaryError
from tuneloop.job_configs import ReleaseReason
from tuneloop.storage.models import Job, JobActuator, JobConfig, JobConfigMark, JobConfigRelease
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.timeseries.store_backend import StoreBackend
from tuneloop.storage.timeseries.types import Aggregation, Matcher, MatchOp
from tuneloop.storage.types import utcnow
from tuneloop.window_stats import window_stats

log = logging.getLogger(__name__)

ACTOR = "actuator"
"""How the actuator appears in the audit log."""

RECENT = timedelta(minutes=5)
"""A job that reported its objective this recently is one that reports it."""

_AUDITED = frozenset({"release", "step", "confirm", "rollback", "refuse", "dry_run"})


class ReconcileConflict(TemporaryError, RuntimeError):
    """Another reconciler changed the job's actuator state meanwhile; retry on the next tick."""


def ensure_actuator(session: Session, job: Job) -> JobActuator:
    """The job's actuator row, created with the default policy when missing."""
    row = job_configs.actuator_row(session, job)
    if row is not None:
        return row
    row = JobActuator(job_id=job.id, policy={}, conditions={})
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        found = job_configs.actuator_row(session, job)
        assert found is not None
        return found
    return row


def set_policy(
    session: Session, job: Job, policy: ActuationPolicy, *, actor: str | None = None
) -> JobActuator:
    """Make ``policy`` the job's; with ``actor`` (who asked) the audit log says who did."""
    row = ensure_actuator(session, job)
    row.policy = policy.to_dict()
    session.flush()
    if actor is not None:
        details = {"policy": policy.to_dict()}
        accounts.record_job_audit(session, actor, "actuator.policy", job, details)
    return row


def approve(session: Session, job: Job, version: int, *, actor: str | None = None) -> JobActuator:
    """Allow the release of desired versions up to ``version``; with ``actor`` the approval
    is audited, even one that an earlier, higher approval already covers (it was asked for)."""
    if job_configs.config_version(session, job, "desired", version) is None:
        raise errors.NotFound(f"job {job.name!r} has no desired version {version}")
    row = ensure_actuator(session, job)
    if (row.approved_version or 0) < version:
        row.approved_version = version
        session.flush()
        changed_after_commit(session, job.id)
    if actor is not None:
        accounts.record_job_audit(session, actor, "actuator.approve", job, {"version": version})
    return row


def adopt_initial(session: Session, job: Job, config: Mapping[str, Any]) -> JobConfig:
    """A job started with ``config`` before tuneloop told it anything: record it as desired
    version 1, released and good, so it is what a rollback can return to. Returns the version
    the job should consider itself running (the released one if there is already one: a
    restarted job resumes the last good version, or a study's trial while one runs).

    ``changed_at`` stays unset: registering changes nothing, so the freeze does not hold the
    job's first change."""
    row = ensure_actuator(session, job)
    released = job_configs.released_config(session, job)
    if released is not None:
        return released
    version = job_configs.propose(session, job, config, origin="agent")
    job_configs.release(session, job, version.version, "goal")
    row.goal_version = row.released_version = row.last_good_version = version.version
    session.flush()
    return version


def _goal_version(session: Session, job: Job, row: JobActuator) -> int | None:
    """The newest desired version not written by the actuator itself, unless the actuator
    already moved past it (a rollback supersedes the goal that led to the version it rolled
    back)."""
    newest = session.scalar(
        select(func.max(JobConfig.version)).where(
            JobConfig.job_id == job.id,
            JobConfig.kind == "desired",
            JobConfig.origin != "actuator",
        )
    )
    if newest is not None and newest > (row.goal_version or 0):
        return int(newest)
    return row.goal_version


def _desired(session: Session, job: Job, number: int | None) -> JobConfig | None:
    return None if number is None else job_configs.config_version(session, job, "desired", number)


def role_of(found: JobConfig) -> VersionRole:
    """What a desired version is to the policy, from who wrote it."""
    if found.origin == "tuner-trial":
        return "study_trial"
    if found.origin == "study-outcome":
        return "study_outcome"
    return "change"


def _as_version(found: JobConfig | None) -> Version | None:
    if found is None:
        return None
    return Version(found.version, dict(found.config), role_of(found))


def _last_good(session: Session, job: Job, row: JobActuator) -> Version | None:
    """The last good version; a study's trial recorded as good before trials were told apart
    gives way to the newest released version before it that is not one."""
    found = _desired(session, job, row.last_good_version)
    if found is None or role_of(found) != "study_trial":
        return _as_version(found)
    earlier = session.scalars(
        select(JobConfig)
        .join(
            JobConfigRelease,
            (JobConfigRelease.job_id == JobConfig.job_id)
            & (JobConfigRelease.version == JobConfig.version),
        )
        .where(
            JobConfig.job_id == job.id,
            JobConfig.kind == "desired",
            JobConfig.version < found.version,
        )
        .order_by(JobConfig.version.desc())
    )
    for candidate in earlier:
        if role_of(candidate) != "study_trial":
            row.last_good_version = candidate.version
            return _as_version(candidate)
    return None


def measure(
    session: Session,
    job: Job,
    metric: str,
    start: datetime,
    end: datetime,
    series: TimeSeriesBackend | None = None,
) -> Stats | None:
    """The objective over ``[start, end)``: per-second means of rank 0's ``metric``, their
    mean and batch-means standard error (``None`` without samples). Read from ``series``
    (default: the store, in ``session``'s transaction)."""
    if end <= start:
        return None
    matchers = [Matcher("job", MatchOp.EQ, job.name), Matcher("rank", MatchOp.EQ, "0")]
    backend = series or StoreBackend(session.connection())
    found = backend.query_range(
        job.project_id,
        metric,
        matchers,
        start=start,
        end=end,
        step_s=1,
        aggregation=Aggregation.AVG,  # per second: never served from rollups
        max_series=10,
    )
    values = [value for one in found for _, value in one.points]
    if not values:
        return None
    stats = window_stats(values)
    return Stats(stats.mean, stats.stderr, stats.n)


def needs_reconcile(session: Session, job: Job) -> bool:
    """Whether a pass could do anything: a desired version not released yet, a change not
    verified yet, or one the job could not run. A cheap read, so pollers of a settled job never
    write (on SQLite every write competes for the one writer lock)."""
    row = job_configs.actuator_row(session, job)
    newest = session.scalar(
        select(func.max(JobConfig.version)).where(
            JobConfig.job_id == job.id, JobConfig.kind == "desired"
        )
    )
    if row is None:
        return newest is not None
    if newest != row.released_version:
        return True
    if row.released_version is None:
        return False
    if row.released_version == row.last_good_version:
        # Kept, unless the job said since that it could not run it.
        return bool(_refusal(session, job, _desired(session, job, row.released_version)))
    # A study's trial stays unverified until the study ends: nothing to do meanwhile.
    released = _desired(session, job, row.released_version)
    return released is None or role_of(released) != "study_trial"


def reconcile_job(
    session: Session,
    job: Job,
    *,
    now: datetime | None = None,
    series: TimeSeriesBackend | None = None,
) -> Decision:
    """One pass of the loop for ``job``; the caller commits. Raises :class:`ReconcileConflict`
    when another reconciler got there first (roll back and let it be). The objective is read
    from ``series`` (default: the store, in ``session``'s transaction)."""
    now = now or utcnow()
    row = ensure_actuator(session, job)
    policy = ActuationPolicy.from_dict(row.policy)
    goal_number = _goal_version(session, job, row)
    if goal_number != row.goal_version:
        row.goal_version = goal_number
    goal = _desired(session, job, goal_number)
    released = job_configs.released_config(session, job)
    view = View(
        now=now.timestamp(),
        goal=_as_version(goal),
        released=_as_version(released),
        last_good=_last_good(session, job, row),
        approved_version=row.approved_version,
        changed_at=row.changed_at.timestamp() if row.changed_at else None,
        baseline=Stats.from_dict(row.baseline),
        **_refusal(session, job, released),
    )
    if verification_due(policy, view):
        assert row.changed_at is not None
        start = row.changed_at + timedelta(seconds=policy.verify.settle_s)
        after = measure(
            session,
            job,
            policy.verify.metric,
            start,
            start + timedelta(seconds=policy.verify.window_s),
            series,
        )
        view = View(**{**_fields(view), "after": after})
    elif (
        policy.verify.enabled
        and view.goal is not None
        and view.goal.role == "change"
        and view.released is not None
        and view.goal.number != view.released.number
    ):
        before = _baseline(session, job, row, policy, now, series)
        view = View(**{**_fields(view), "before": before})
    decision = decide(policy, view)
    _apply(session, job, row, policy, decision, now, series)
    try:
        session.flush()
    except StaleDataError as exc:
        raise ReconcileConflict(f"job {job.name!r}: actuator state changed meanwhile") from exc
    return decision


def _refusal(session: Session, job: Job, released: JobConfig | None) -> dict[str, Any]:
    """The view's ``refused`` and ``running`` when the job's latest observed version says it
    could not run the released one."""
    observed = job_configs.latest_config(session, job, "observed")
    if (
        released is None
        or observed is None
        or observed.acknowledged_version != released.version
        or observed.status not in job_configs.FAILED_STATUSES
    ):
        return {}
    return {"refused": observed.reason or observed.status, "running": dict(observed.config)}


def _fields(view: View) -> dict[str, Any]:
    return {name: getattr(view, name) for name in View.__dataclass_fields__}


def _apply(
    session: Session,
    job: Job,
    row: JobActuator,
    policy: ActuationPolicy,
    decision: Decision,
    now: datetime,
    series: TimeSeriesBackend | None,
) -> None:
    if decision.action == "release":
        assert decision.version is not None
        version = decision.version
        if row.released_version is not None and version < row.released_version:
            # Steps overtook the goal's number: released versions only grow, so that agents
            # can ask for "newer than what I run", hence a copy of the goal under a new number.
            goal = job_configs.config_version(session, job, "desired", version)
            assert goal is not None
            # A copy of a study's version keeps its origin, so it stays what it was.
            if role_of(goal) == "change":
                copy = job_configs.propose(session, job, goal.config, origin="actuator")
            else:
                copy = job_configs.propose(
                    session,
                    job,
                    goal.config,
                    origin=job_configs.check_origin(goal.origin, goal.origin_study_id),
                    study_id=goal.origin_study_id,
                    source=goal.source,
                )
            version = copy.version
        verified = decision.reason == "goal"  # a study's versions are measured by the study
        _release(session, job, row, policy if verified else None, version, "goal", now, series)
        if decision.reason == "study_outcome":
            # Measured by the study that wrote it: good as released, and the version a later
            # rollback or a restarted job returns to.
            row.goal_version = row.last_good_version = version
            row.baseline = None
            _mark(session, job, version, "good", decision, None)
    elif decision.action == "step":
        assert decision.config is not None
        step = job_configs.propose(session, job, decision.config, origin="actuator")
        _release(session, job, row, policy, step.version, "step", now, series)
    elif decision.action == "confirm":
        assert decision.version is not None
        row.last_good_version = decision.version
        _mark(session, job, decision.version, "good", decision, row.baseline)
    elif decision.action == "rollback":
        assert decision.version is not None and decision.config is not None
        _mark(session, job, decision.version, "bad", decision, row.baseline)
        back = job_configs.propose(session, job, decision.config, origin="actuator")
        job_configs.release(session, job, back.version, "rollback")
        # The version rolled back to is known good: nothing to verify. It supersedes the goal
        # that led to the bad version, not one written since (a study's next trial): that
        # stays the goal and is released next.
        row.released_version = row.last_good_version = back.version
        if row.goal_version is None or row.goal_version <= decision.version:
            row.goal_version = back.version
        row.changed_at = now
        row.baseline = None
    changed = _set_condition(row, decision, now)
    if decision.action in _AUDITED and (changed or decision.action not in ("refuse", "dry_run")):
        accounts.record_audit(
            session,
            actor=ACTOR,
            action=f"actuator.{decision.action}",
            target=f"job:{job.name}",
            project_id=job.project_id,
            details={
                "job_id": job.id,
                "reason": decision.reason,
                "message": decision.message,
                "version": decision.version,
                "config": dict(decision.config) if decision.config is not None else None,
                "released_version": row.released_version,
            },
        )
        log.info("job %s: %s", job.name, decision.message)


def _baseline(
    session: Session,
    job: Job,
    row: JobActuator,
    policy: ActuationPolicy,
    now: datetime,
    series: TimeSeriesBackend | None,
) -> Stats | None:
    """The objective of the running config: the last window, but not before the previous
    change settled."""
    start = now - timedelta(seconds=policy.verify.window_s)
    if row.changed_at is not None:
        start = max(start, row.changed_at + timedelta(seconds=policy.verify.settle_s))
    metric = policy.verify.metric
    stats = measure(session, job, metric, start, now, series)
    if stats is None and measure(session, job, metric, now - RECENT, now, series):
        return Stats(math.nan, math.inf, 0)  # it reports, but nothing of this config yet
    return stats


def _release(
    session: Session,
    job: Job,
    row: JobActuator,
    policy: ActuationPolicy | None,
    version: int,
    reason: ReleaseReason,
    now: datetime,
    series: TimeSeriesBackend | None,
) -> None:
    """Release ``version``; with ``policy`` (a change to verify) measure the baseline first."""
    baseline = None
    if policy is not None and policy.verify.enabled:
        stats = _baseline(session, job, row, policy, now, series)
        baseline = stats.to_dict() if stats is not None else None
    job_configs.release(session, job, version, reason)
    row.released_version = version
    row.changed_at = now
    row.baseline = baseline


def _mark(
    session: Session,
    job: Job,
    version: int,
    verdict: str,
    decision: Decision,
    baseline: Mapping[str, Any] | None,
) -> None:
    config = job_configs.config_version(session, job, "desired", version)
    existing = session.scalars(
        select(JobConfigMark).where(
            JobConfigMark.job_id == job.id, JobConfigMark.version == version
        )
    ).one_or_none()
    if existing is not None and verdict == "bad" and existing.verdict != "bad":
        # Kept before the job said it could not run it: that verdict was premature.
        existing.verdict, existing.reason = verdict, decision.reason
        existing.evidence = {"message": decision.message, "baseline": baseline}
        return
    if existing is not None or config is None:
        return
    session.add(
        JobConfigMark(
            job_id=job.id,
            version=version,
            config=dict(config.config),
            verdict=verdict,
            reason=decision.reason,
            evidence={"message": decision.message, "baseline": baseline},
        )
    )


def _set_condition(row: JobActuator, decision: Decision, now: datetime) -> bool:
    """Record the decision as the actuator's condition; ``True`` when it changed (timestamps
    move only then, so an unchanged state writes nothing)."""
    current = dict(row.conditions or {})
    previous = current.get(holds.CONDITION) or {}
    entry = holds.condition_entry(
        decision.action, decision.reason, decision.message, decision.retry_at
    )
    if {k: previous.get(k) for k in entry} == entry:
        return False
    current[holds.CONDITION] = {**entry, "since": now.isoformat()}
    row.conditions = current
    return True
