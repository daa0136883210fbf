"""One evaluation pass: query every enabled rule, advance each alert's state, decide what the
receivers hear, and store it all in one transaction per project.

Notifications are written to the ``notifications`` table in the transaction that changes the
state they announce (an outbox): a pass that dies before its commit leaves nothing behind and
the next pass does the same work again; one that commits has queued exactly what it decided.
Sending is the dispatcher's job (``alerts.dispatch``); this pass never waits on a receiver.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Engine, delete, select
from sqlalchemy.orm import Session, sessionmaker

from alerts import store
from alerts.conditions import Active, active_alerts
from alerts.evaluation_metrics import EvaluationMetrics
from alerts.muting import InhibitIndex, Inhibition, Silence, matcher, mute_reason
from alerts.outbox import Outbox, Receivers
from alerts.query import evaluate_samples
from alerts.state import AlertState, State, advance, event_due
from tuneloop.storage import session_scope
from tuneloop.storage.locks import LockName, advisory_lock
from tuneloop.storage.models import (
    AlertInhibition,
    AlertInstance,
    AlertReceiver,
    AlertRule,
    AlertSilence,
    Notification,
    Project,
)
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.timeseries.store_backend import StoreBackend
from tuneloop.storage.types import utcnow

log = logging.getLogger(__name__)


@dataclass(slots=True)
class PassResult:
    rules: int = 0
    failed_rules: list[str] = field(default_factory=list)
    queued: int = 0
    """Notifications queued by this pass."""
    seconds: float = 0.0


class Evaluator:
    """Evaluates the rules of every project; holds no alert state of its own, so a new one (a
    restarted process) carries on exactly where the last committed pass left off."""

    def __init__(
        self,
        engine: Engine,
        sessions: sessionmaker[Session],
        *,
        clock: Callable[[], datetime] = utcnow,
        on_queued: Callable[[], object] | None = None,
        for_slack: timedelta = timedelta(0),
        series: TimeSeriesBackend | None = None,
        metrics: EvaluationMetrics | None = None,
    ) -> None:
        self.engine = engine
        self.series = series
        """Where rules read series; ``None``: the built-in store, read in each project's
        evaluation transaction."""
        self.sessions = sessions
        self.clock = clock
        self.for_slack = for_slack
        """How much earlier than ``for`` an alert may fire. Passes run on a timer, so the pass
        that first saw a condition and the one ``for`` later are a few ms more or less than
        ``for`` apart; half an interval of slack makes the alert fire at the pass nearest to
        ``for`` rather than, on a late timer, one whole interval after it (Prometheus avoids
        the same problem by stamping each pass with its scheduled time)."""
        self.on_queued = on_queued
        """Called after a commit that queued notifications (the dispatcher's kick)."""
        self.metrics = metrics if metrics is not None else EvaluationMetrics()

    def evaluate(self, now: datetime | None = None) -> PassResult:
        now = now or self.clock()
        started = time.perf_counter()
        result = PassResult()
        with self.sessions() as session:
            projects = session.scalars(
                select(AlertRule.project_id).where(AlertRule.enabled.is_(True)).distinct()
            ).all()
        for project_id in projects:
            self.evaluate_project(project_id, now, result)
        result.seconds = time.perf_counter() - started
        if result.queued and self.on_queued is not None:
            self.on_queued()
        return result

    def evaluate_project(self, project_id: int, now: datetime, result: PassResult) -> None:
        started = time.perf_counter()
        failed: list[str] = []
        with session_scope(self.sessions) as session:
            if not _lock_project(session, project_id):
                log.info("project %s is being evaluated elsewhere; skipped", project_id)
                return
            project = session.get(Project, project_id)
            rules = session.scalars(
                select(AlertRule).where(
                    AlertRule.project_id == project_id, AlertRule.enabled.is_(True)
                )
            ).all()
            instances = _instances_by_rule(session, [rule.id for rule in rules])
            for row in rules:
                result.rules += 1
                try:
                    rule = store.definition(row)
                    series = self.series or StoreBackend(session.connection())
                    samples = evaluate_samples(series, project_id, rule, now)
                except Exception as exc:  # one broken rule must not stop the others
                    log.warning("alert rule %s failed: %s", row.name, exc)
                    failed.append(row.name)
                    continue
                hold_for = max(timedelta(0), timedelta(seconds=rule.for_s) - self.for_slack)
                alerts = active_alerts(rule, samples)
                _advance_rule(session, row, alerts, instances, now, hold_for)
            result.queued += _notify(session, project_id, now)
            name = project.name if project is not None else str(project_id)
            count = len(rules)
        result.failed_rules.extend(failed)
        # After the commit: a pass that died counts as no evaluation.
        self.metrics.observe(
            project_id, name, seconds=time.perf_counter() - started,
            finished_at=time.time(), rules=count, failed=failed,
        )  # fmt: skip


def _lock_project(session: Session, project_id: int) -> bool:
    """On PostgreSQL, one evaluator per project at a time (Celery may overlap two ticks).
    SQLite serializes writers itself; its in-process runner runs one pass at a time."""
    return advisory_lock(session, LockName.ALERT_EVALUATION, project_id, wait=False)


def _instances_by_rule(
    session: Session, rule_ids: Sequence[int]
) -> dict[int, dict[str, AlertInstance]]:
    found: dict[int, dict[str, AlertInstance]] = {rule_id: {} for rule_id in rule_ids}
    if rule_ids:
        for row in session.scalars(
            select(AlertInstance).where(AlertInstance.rule_id.in_(rule_ids))
        ):
            found[row.rule_id][row.fingerprint] = row
    return found


def _state_of(row: AlertInstance) -> AlertState:
    return AlertState(State(row.state), row.active_at, row.fired_at, row.resolved_at, row.value)


def _advance_rule(
    session: Session,
    row: AlertRule,
    active: Sequence[Active],
    instances: dict[int, dict[str, AlertInstance]],
    now: datetime,
    hold_for: timedelta,
) -> None:
    known = instances[row.id]
    holding = {alert.fingerprint: alert for alert in active}
    for fingerprint in set(known) | set(holding):
        alert = holding.get(fingerprint)
        instance = known.get(fingerprint)
        previous = _state_of(instance) if instance is not None else None
        state = advance(
            previous,
            holds=alert is not None,
            value=alert.value if alert is not None else None,
            now=now,
            hold_for=hold_for,
        )
        if state is None:
            continue
        if instance is None:
            assert alert is not None
            instance = AlertInstance(
                rule_id=row.id, fingerprint=fingerprint, labels=alert.labels, annotations={}
            )
            session.add(instance)
            known[fingerprint] = instance
        instance.state = state.state.value
        instance.active_at = state.active_at
        instance.fired_at = state.fired_at
        instance.resolved_at = state.resolved_at
        instance.value = state.value
        instance.last_eval_at = now
        if alert is not None:
            instance.labels = alert.labels
            instance.annotations = alert.annotations


def _notify(session: Session, project_id: int, now: datetime) -> int:
    """Mute what silences and inhibit rules say, and queue the events that are due."""
    session.flush()
    rows = session.scalars(
        select(AlertInstance)
        .join(AlertRule, AlertRule.id == AlertInstance.rule_id)
        .where(AlertRule.project_id == project_id)
    ).all()
    silences = [
        Silence(s.id, tuple(matcher(t) for t in s.matchers), s.starts_at, s.ends_at)
        for s in session.scalars(
            select(AlertSilence).where(
                AlertSilence.project_id == project_id,
                AlertSilence.starts_at <= now,
                AlertSilence.ends_at > now,
            )
        )
    ]
    inhibitions = [
        Inhibition(
            tuple(matcher(t) for t in i.source_matchers),
            tuple(matcher(t) for t in i.target_matchers),
            tuple(i.equal),
        )
        for i in session.scalars(
            select(AlertInhibition).where(AlertInhibition.project_id == project_id)
        )
    ]
    receivers = Receivers.of(
        session.scalars(
            select(AlertReceiver).where(
                AlertReceiver.project_id == project_id, AlertReceiver.enabled.is_(True)
            )
        )
    )
    project = session.get(Project, project_id)
    outbox = Outbox(session, now, project.name if project is not None else str(project_id))
    # Only repeats and pushes look back at what was sent: no query for the others.
    receiver_ids = [r.receiver_id for r in receivers.routes if r.repeat_interval > timedelta(0)]
    receiver_ids += [route.receiver_id for route, _ in receivers.pushes]
    latest = outbox.latest(rows, receiver_ids)
    inhibit = InhibitIndex([row.labels for row in rows if row.state == State.FIRING], inhibitions)
    for row in rows:
        state = State(row.state)
        muted = None
        if state is State.FIRING:
            muted = mute_reason(row.labels, silences=silences, inhibit=inhibit, now=now)
        row.muted_by = muted
        event = event_due(state, row.notified, muted=muted is not None)
        if event is not None:
            outbox.announce(row, event, receivers.routes)
            row.notified = event.value
        elif state is State.FIRING and muted is None:
            outbox.repeat(row, receivers.routes, latest)
    outbox.push(rows, receivers.pushes, latest)
    # A pending alert that stopped holding was never announced: nothing to keep.
    inactive = [row.id for row in rows if row.state == State.INACTIVE]
    if inactive:
        session.execute(delete(AlertInstance).where(AlertInstance.id.in_(inactive)))
    return outbox.queued


def prune_history(sessions: sessionmaker[Session], now: datetime, keep: timedelta) -> int:
    """Forget alerts resolved, and notifications settled, longer than ``keep`` ago (their
    notifications go with the alerts); returns the rows deleted."""
    cutoff = now - keep
    with session_scope(sessions) as session:
        notifications = session.execute(
            delete(Notification).where(
                Notification.status.in_(("sent", "failed")), Notification.created_at < cutoff
            )
        )
        instances = session.execute(
            delete(AlertInstance).where(
                AlertInstance.state == State.RESOLVED.value, AlertInstance.resolved_at < cutoff
            )
        )
    return int(getattr(notifications, "rowcount", 0) or 0) + int(
        getattr(instances, "rowcount", 0) or 0
    )
