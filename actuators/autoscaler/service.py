"""One pass of a stored autoscaler: read its row and the newest metrics, reconcile its target
(:func:`~actuators.autoscaler.reconcile.autoscale`), remember what happened.

No database lock is held while the target is called (a webhook may take seconds; on SQLite a
held write lock would stall every writer of the store). The pass runs its own transactions on
the session it is given:

1. **look** (read only): the row and the newest metrics. Metrics no newer than those the last
   pass decided on end the pass here: each sample drives one decision (a sample taken at 2
   replicas says nothing about 5), and a pass with nothing new writes nothing, not even to
   the target.
2. **claim**: lock and re-read the row; leave it if it is disabled, changed since the look or
   leased by another pass; else lease it for :data:`LEASE_S`.
3. **call** the target, outside any transaction.
4. **finish**: lock and re-read the row; store the state, the decision or the error; release
   the lease; audit what deserves it.

A target error ends on the row (``last_error``) and in the log, never as an exception.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from actuators.autoscaler.policy import Metrics, ScaleDecision, ScalePolicy, ScaleState
from actuators.autoscaler.reconcile import ScaleTarget, autoscale
from actuators.autoscaler.signals import fleet_metrics
from actuators.autoscaler.spec import SpecError, policy_from_dict
from actuators.autoscaler.store import Definition, definition_of, target_changes
from actuators.autoscaler.targets import TIMEOUT_S, describe_error, open_target
from tuneloop import accounts
from tuneloop.settings import Settings, get_settings
from tuneloop.storage.locks import hold_write_lock
from tuneloop.storage.models import Autoscaler
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.timeseries.store_backend import StoreBackend

log = logging.getLogger(__name__)

ACTOR: Final = "autoscaler"
LEASE_S: Final = 4 * TIMEOUT_S + 20
"""Longer than a pass can take (two target calls of at most ``TIMEOUT_S``); a lease left by a
worker that died expires after it."""
REFUSALS: Final = frozenset({"at_max", "at_min", "rate_limited"})
"""Reasons that, with no change, mean the policy held back a change the metrics asked for."""


@dataclass(frozen=True, slots=True)
class PassResult:
    action: str
    """``scaled``, ``dry_run`` (would have scaled), ``refused`` (the policy held a change
    back), ``unchanged``, ``error``, ``skipped`` (disabled), ``busy`` (another pass holds it),
    ``gone`` (deleted) or ``conflict`` (the row changed during the pass; the next one sees
    the change). ``unchanged`` includes a pass that found no metrics newer than the last."""
    replicas: int | None = None
    reason: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """The row as the claim read it: what the rest of the pass works from."""

    id: int
    project_id: int
    name: str
    definition: Definition
    state: dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Look:
    snapshot: _Snapshot
    policy: ScalePolicy | None = None
    metrics: Metrics | None = None
    error: str | None = None
    """Why the pass cannot reach the target (an invalid policy, an unreadable selector)."""


@dataclass(frozen=True, slots=True)
class _Outcome:
    observed: int | None = None
    decision: ScaleDecision | None = None
    metrics: Metrics | None = None
    error: str | None = None
    target_refused: bool = False
    """The error came from asking the target to scale (not from reading it)."""


class _Recorder:
    """Passes calls through to the target, noting what it answered and whether a change was
    asked for."""

    def __init__(self, target: ScaleTarget) -> None:
        self.target = target
        self.observed: int | None = None
        self.set_called = False

    def __str__(self) -> str:
        return str(self.target)

    def get_replicas(self) -> int:
        self.observed = self.target.get_replicas()
        return self.observed

    def set_replicas(self, replicas: int, reason: str) -> None:
        self.set_called = True
        self.target.set_replicas(replicas, reason)


def reconcile_autoscaler(
    session: Session,
    autoscaler_id: int,
    now: datetime,
    *,
    settings: Settings | None = None,
    series: TimeSeriesBackend | None = None,
) -> PassResult:
    """One pass over autoscaler ``autoscaler_id`` as of ``now``. ``session`` must have no
    transaction open; the pass commits its own (see the module's docstring). Signals are read
    from ``series`` (default: the store, through ``session``)."""
    look = _look(session, autoscaler_id, now, series)
    if isinstance(look, PassResult):
        return look
    lease = _claim(session, look.snapshot, now)
    if isinstance(lease, PassResult):
        return lease
    if look.error is not None or look.policy is None:
        outcome = _Outcome(error=look.error)
    else:
        outcome = _call_target(look.snapshot, look.policy, look.metrics, now, settings)
    return _finish(session, look.snapshot, lease, outcome, now)


def _snapshot(row: Autoscaler) -> _Snapshot:
    return _Snapshot(row.id, row.project_id, row.name, definition_of(row), dict(row.state))


def _look(
    session: Session, autoscaler_id: int, now: datetime, series: TimeSeriesBackend | None
) -> _Look | PassResult:
    try:
        row = session.scalars(
            select(Autoscaler)
            .where(Autoscaler.id == autoscaler_id)
            .execution_options(populate_existing=True)
        ).one_or_none()
        if row is None or not row.enabled:
            return PassResult("gone" if row is None else "skipped")
        snap = _snapshot(row)
        try:
            policy = policy_from_dict(snap.definition.policy)
            metrics = fleet_metrics(
                series or StoreBackend(session.connection()),
                snap.project_id,
                p99=snap.definition.p99_selector,
                queue=snap.definition.queue_selector,
                now=now,
                max_age_s=policy.max_metric_age_s,
            )
        except SpecError as exc:
            return _Look(snap, error=str(exc))
        except ValueError as exc:  # too many series, a regular expression PostgreSQL refuses
            return _Look(snap, error=f"cannot read the metrics: {exc}")
        seen = snap.state.get("metrics_at")
        if metrics is not None and isinstance(seen, int | float) and metrics.at <= seen:
            return PassResult("unchanged", replicas=row.replicas, reason=row.last_reason)
        return _Look(snap, policy, metrics)
    finally:
        session.rollback()  # read only


def _locked(session: Session, autoscaler_id: int) -> Autoscaler | None:
    hold_write_lock(session)
    # populate_existing: the claim's commit leaves the row loaded (expire_on_commit is off),
    # and the finish must see what changed during the pass.
    return session.scalars(
        select(Autoscaler)
        .where(Autoscaler.id == autoscaler_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one_or_none()


def _claim(session: Session, snap: _Snapshot, now: datetime) -> datetime | PassResult:
    row = _locked(session, snap.id)
    if row is None or not row.enabled:
        session.rollback()
        return PassResult("gone" if row is None else "skipped")
    if row.lease_until is not None and row.lease_until > now:
        session.rollback()
        return PassResult("busy")
    if _snapshot(row) != snap:  # edited, or another pass finished, since the look
        session.rollback()
        return PassResult("conflict")
    lease = row.lease_until = now + timedelta(seconds=LEASE_S)
    session.commit()
    return lease


def _call_target(
    snap: _Snapshot,
    policy: ScalePolicy,
    metrics: Metrics | None,
    now: datetime,
    settings: Settings | None,
) -> _Outcome:
    kubeconfig = (settings or get_settings()).kubeconfig
    recorder: _Recorder | None = None
    try:
        definition = snap.definition
        with open_target(
            definition.target_kind, definition.target, kubeconfig=kubeconfig
        ) as target:
            recorder = _Recorder(target)
            state = state_from_dict(snap.state)
            decision = autoscale(
                recorder, policy, state, metrics, now.timestamp(), dry_run=definition.dry_run
            )
    except Exception as exc:
        error = describe_error(exc)
        log.warning("autoscaler %s (id %d): %s", snap.name, snap.id, error)
        return _Outcome(
            observed=recorder.observed if recorder is not None else None,
            metrics=metrics,
            error=error,
            target_refused=recorder is not None and recorder.set_called,
        )
    return _Outcome(observed=recorder.observed, decision=decision, metrics=metrics)


def _finish(
    session: Session, snap: _Snapshot, lease: datetime, outcome: _Outcome, now: datetime
) -> PassResult:
    row = _locked(session, snap.id)
    if row is None:
        session.commit()
        return PassResult("gone")
    if row.lease_until == lease:  # not when it ran out and another pass took it
        row.lease_until = None
    if target_changes(row, snap.definition):
        # Replaced during the pass: what this pass saw belongs to the old target.
        session.commit()
        return PassResult("conflict")
    if outcome.error is not None:
        result = _record_error(session, row, outcome, now)
    else:
        result = _record_decision(session, row, snap, outcome, now)
    session.commit()
    return result


def _record_error(
    session: Session, row: Autoscaler, outcome: _Outcome, now: datetime
) -> PassResult:
    assert outcome.error is not None
    new = row.last_error != outcome.error
    if new:
        row.last_error, row.last_error_at = outcome.error, now
    if outcome.observed is not None:
        row.replicas = outcome.observed
    if outcome.target_refused and new:
        _audit(session, row, "autoscaler.refused", {"by": "target", "error": outcome.error})
    return PassResult("error", replicas=outcome.observed, error=outcome.error)


def _record_decision(
    session: Session, row: Autoscaler, snap: _Snapshot, outcome: _Outcome, now: datetime
) -> PassResult:
    decision, observed = outcome.decision, outcome.observed
    assert decision is not None and observed is not None
    seen = outcome.metrics.at if outcome.metrics is not None else snap.state.get("metrics_at")
    state = state_to_dict(decision.state, metrics_at=seen)
    if state != row.state:
        row.state = state
    row.replicas = decision.state.replicas
    row.last_error = row.last_error_at = None
    changed = (decision.replicas, decision.reason) != (row.last_decision, row.last_reason)
    if changed:
        row.last_decision, row.last_reason = decision.replicas, decision.reason
        row.last_decision_at = now
    if decision.replicas != observed:
        action = "dry_run" if snap.definition.dry_run else "scaled"
    else:
        action = "refused" if decision.reason in REFUSALS else "unchanged"
    # A scale always; a dry run or a refusal once, not again at every pass that repeats it.
    if action == "scaled" or (action in ("dry_run", "refused") and changed):
        details = {
            "from": observed,
            "to": decision.replicas,
            "reason": decision.reason,
            "dry_run": snap.definition.dry_run,
            "metrics": _evidence(outcome.metrics),
        }
        if action == "refused":
            details["by"] = "policy"
        _audit(session, row, f"autoscaler.{'scale' if action == 'scaled' else action}", details)
    return PassResult(action, replicas=decision.state.replicas, reason=decision.reason)


def _evidence(metrics: Metrics | None) -> dict[str, Any] | None:
    if metrics is None:
        return None
    return {"at": metrics.at, "p99_latency_s": metrics.p99_latency_s, "queue": metrics.queue_depth}


def _audit(session: Session, row: Autoscaler, action: str, details: dict[str, Any]) -> None:
    accounts.record_audit(
        session,
        actor=ACTOR,
        action=action,
        target=f"autoscaler:{row.name}",
        project_id=row.project_id,
        details={"autoscaler_id": row.id, **details},
    )


# --------------------------------------------------------------------------- stored state


def state_to_dict(state: ScaleState, *, metrics_at: float | None = None) -> dict[str, Any]:
    """``metrics_at``: the time of the metrics decided on (a later pass needs newer ones)."""
    return {
        "replicas": state.replicas,
        "recommendations": [list(pair) for pair in state.recommendations],
        "events": [list(pair) for pair in state.events],
        "metrics_at": metrics_at,
    }


def state_from_dict(data: dict[str, Any]) -> ScaleState:
    """The stored state; a damaged one loses its history rather than stopping the loop."""
    try:
        return ScaleState(
            replicas=int(data.get("replicas", 0)),
            recommendations=tuple((float(t), int(r)) for t, r in data.get("recommendations", [])),
            events=tuple((float(t), int(r)) for t, r in data.get("events", [])),
        )
    except (TypeError, ValueError):
        log.warning("damaged autoscaler state %r: starting without history", data)
        return ScaleState(replicas=0)
