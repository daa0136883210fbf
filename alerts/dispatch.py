"""Sends queued notifications: claims what is due, sends each group on a worker thread, and
records every attempt's outcome.

Never blocking: :meth:`Dispatcher.dispatch` only claims rows and hands them to a bounded pool
of sender threads, so neither the evaluator nor one slow receiver holds up anything else. A
claim is a lease (``next_attempt_at`` pushed past the send's timeout): rows of a process that
died mid-send are picked up again once it expires. Delivery is therefore at least once: a
crash between a send and the record of its outcome sends it again, with the same keys (the
PagerDuty ``dedup_key``, the webhook's ``Idempotency-Key`` header and each alert's
``fingerprint``), so receivers can drop the repeat.

Every connection goes to an address :mod:`alerts.notifiers.targets` allows (public ones, and
the networks of ``TUNELOOP_ALERTS_ALLOWED_TARGET_NETWORKS``).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx
from prometheus_client import CollectorRegistry, Counter
from sqlalchemy import exists, or_, select, update
from sqlalchemy.orm import Session, aliased, sessionmaker

from alerts.notifiers.alertmanager import AlertmanagerNotifier
from alerts.notifiers.base import AlertMessage, GroupMessage, Notifier, Outcome
from alerts.notifiers.config import ReceiverConfig, parse_config
from alerts.notifiers.email import EmailNotifier
from alerts.notifiers.pagerduty import PagerDutyNotifier
from alerts.notifiers.slack import SlackNotifier
from alerts.notifiers.targets import IPNetwork, configured_networks
from alerts.notifiers.transport import checked_client
from alerts.notifiers.webhook import WebhookNotifier
from alerts.routing import Route, group_labels
from tuneloop.backoff import backoff_delay_s
from tuneloop.storage import session_scope
from tuneloop.storage.models import AlertReceiver, Notification
from tuneloop.storage.types import utcnow

log = logging.getLogger(__name__)

LEASE_MARGIN = timedelta(seconds=30)
MAX_CLAIM = 500
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 300.0
"""A failed notification's backoff: 1 s, 2 s, 4 s, ... up to five minutes, each jittered."""


@dataclass(frozen=True, slots=True)
class _Batch:
    receiver_id: int
    receiver: str
    kind: str
    config: ReceiverConfig
    message: GroupMessage
    notification_ids: tuple[int, ...]
    attempts: int
    """Attempts made before this one (the most of any row of the group)."""


def default_notifiers(
    client: httpx.Client,
    allowed: Sequence[IPNetwork],
    *,
    eval_interval_s: float = 15.0,
    clock: Callable[[], datetime] = utcnow,
) -> dict[str, Notifier]:
    return {
        "alertmanager": AlertmanagerNotifier(client, eval_interval_s=eval_interval_s, clock=clock),
        "webhook": WebhookNotifier(client),
        "slack": SlackNotifier(client),
        "pagerduty": PagerDutyNotifier(client),
        "email": EmailNotifier(allowed),
    }


class DispatchMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.attempts = Counter(
            "tuneloop_alert_notification_attempts",
            "Attempts to deliver a notification group, by receiver kind and outcome "
            "(sent, retry, failed).",
            ["kind", "outcome"],
            registry=self.registry,
        )


class Dispatcher:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        external_url: str = "",
        workers: int = 8,
        notifiers: Mapping[str, Notifier] | None = None,
        clock: Callable[[], datetime] = utcnow,
        rng: Callable[[], float] = random.random,
        metrics: DispatchMetrics | None = None,
        allowed_networks: Sequence[IPNetwork] | None = None,
        eval_interval_s: float = 15.0,
    ) -> None:
        """``allowed_networks``: the non-public networks receivers may reach (default: the
        settings' ``alerts_allowed_target_networks``); ``eval_interval_s``: how often the
        evaluator runs (a firing alert pushed to Alertmanager stays active for four of it at
        least)."""
        self.sessions = sessions
        self.external_url = external_url
        self.workers = workers
        allowed = configured_networks() if allowed_networks is None else tuple(allowed_networks)
        self._client = checked_client(allowed)
        self.notifiers = dict(
            notifiers
            or default_notifiers(
                self._client, allowed, eval_interval_s=eval_interval_s, clock=clock
            )
        )
        self.clock = clock
        self.rng = rng
        self.metrics = metrics or DispatchMetrics()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="tuneloop-notify")
        self._lock = threading.Lock()
        self._in_flight: set[Future[None]] = set()

    # ----------------------------------------------------------------- claiming

    def dispatch(self) -> int:
        """Claim due notifications and start sending them; returns the groups started.
        Returns at once: sending happens on the pool."""
        with self._lock:
            free = self.workers - len(self._in_flight)
        if free <= 0:
            return 0
        batches = self._claim(free)
        for batch in batches:
            future = self._pool.submit(self._send, batch)
            with self._lock:
                self._in_flight.add(future)
            future.add_done_callback(self._done)
        return len(batches)

    def _done(self, future: Future[None]) -> None:
        with self._lock:
            self._in_flight.discard(future)

    def drain(self, timeout_s: float = 30.0) -> bool:
        """Wait for the sends in flight (shutdown, tests); whether all finished."""
        with self._lock:
            pending = list(self._in_flight)
        for future in pending:
            try:
                future.result(timeout=timeout_s)
            except Exception:  # a send that raised was logged by _send
                return False
        return True

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()

    def _claim(self, groups: int) -> list[_Batch]:
        now = self.clock()
        # One alert's events reach a receiver in order: a resolve waits while the firing before
        # it is still pending (retried, or leased to a sender that may have died), so that a
        # late re-send of the trigger cannot reopen what the resolve closed.
        earlier = aliased(Notification)
        in_order = ~exists().where(
            earlier.instance_id == Notification.instance_id,
            earlier.receiver_id == Notification.receiver_id,
            earlier.status == "pending",
            earlier.id < Notification.id,
        )
        with session_scope(self.sessions) as session:
            statement = (
                select(Notification, AlertReceiver)
                .join(AlertReceiver, AlertReceiver.id == Notification.receiver_id)
                .where(
                    Notification.status == "pending",
                    or_(
                        Notification.next_attempt_at.is_(None), Notification.next_attempt_at <= now
                    ),
                    AlertReceiver.enabled.is_(True),
                    in_order,
                )
                .order_by(Notification.id)
                .limit(MAX_CLAIM)
                .with_for_update(skip_locked=True, of=Notification)
            )
            grouped: dict[tuple[int, str], list[Notification]] = {}
            receivers: dict[int, AlertReceiver] = {}
            for notification, receiver in session.execute(statement).all():
                group = (receiver.id, notification.group_key)
                if group not in grouped and len(grouped) >= groups:
                    continue
                grouped.setdefault(group, []).append(notification)
                receivers[receiver.id] = receiver
            batches = []
            for (receiver_id, key), rows in grouped.items():
                receiver = receivers[receiver_id]
                try:
                    config = parse_config(receiver.kind, receiver.config)
                except ValueError as exc:
                    self._record(session, rows, receiver, Outcome("failed", error=str(exc)), now)
                    continue
                lease = now + timedelta(seconds=config.send_timeout_s * 4) + LEASE_MARGIN
                for row in rows:
                    row.next_attempt_at = lease
                route = Route.of(receiver.id, receiver.name, receiver.matchers, receiver.group_by)
                alerts = [AlertMessage.of(row.instance_id, row.event, row.alert) for row in rows]
                message = GroupMessage(
                    receiver=receiver.name,
                    group_key=key,
                    group_labels=group_labels(route, alerts[0].labels),
                    alerts=alerts,
                    external_url=self.external_url,
                )
                batches.append(
                    _Batch(
                        receiver_id=receiver.id,
                        receiver=receiver.name,
                        kind=receiver.kind,
                        config=config,
                        message=message,
                        notification_ids=tuple(row.id for row in rows),
                        attempts=max(row.attempts for row in rows),
                    )
                )
        return batches

    # ----------------------------------------------------------------- sending

    def _send(self, batch: _Batch) -> None:
        try:
            outcome = self.notifiers[batch.kind].send(batch.config, batch.message)
        except Exception as exc:  # a notifier bug must not lose the notification
            log.exception("notifier %s raised", batch.kind)
            outcome = Outcome("retry", error=f"notifier error ({type(exc).__name__})")
        self.metrics.attempts.labels(batch.kind, outcome.status).inc()
        if outcome.status != "sent":
            log.warning(
                "notification to %s (%s): %s, %s",
                batch.receiver, batch.kind, outcome.status, outcome.error,
            )  # fmt: skip
        try:
            with session_scope(self.sessions) as session:
                rows = session.scalars(
                    select(Notification).where(Notification.id.in_(batch.notification_ids))
                ).all()
                receiver = session.get(AlertReceiver, batch.receiver_id)
                self._record(session, rows, receiver, outcome, self.clock(), batch.config)
        except Exception:
            # The lease expires and the group is sent again: at least once, never lost.
            log.exception("could not record the outcome of a notification to %s", batch.receiver)

    def _record(
        self,
        session: Session,
        rows: Sequence[Notification],
        receiver: AlertReceiver | None,
        outcome: Outcome,
        now: datetime,
        config: ReceiverConfig | None = None,
    ) -> None:
        max_attempts = config.max_attempts if config is not None else 1
        for row in rows:
            row.attempts += 1
            row.response_code = outcome.code
            if outcome.status == "sent":
                row.status, row.sent_at, row.last_error = "sent", now, None
                row.next_attempt_at = None
            elif outcome.status == "retry" and row.attempts < max_attempts:
                row.last_error = outcome.error
                # Never sooner than the receiver's Retry-After.
                delay = max(
                    backoff_delay_s(
                        row.attempts, initial_s=RETRY_FIRST_S, max_s=RETRY_MAX_S, draw=self.rng
                    ),
                    outcome.retry_after_s or 0.0,
                )
                row.next_attempt_at = now + timedelta(seconds=delay)
            else:
                row.status, row.last_error, row.next_attempt_at = "failed", outcome.error, None
        if receiver is None:
            return
        if outcome.status == "sent":
            # Plain UPDATE: concurrent senders of one receiver each reset or add one.
            session.execute(
                update(AlertReceiver)
                .where(AlertReceiver.id == receiver.id)
                .values(consecutive_failures=0, last_success_at=now)
            )
        else:
            session.execute(
                update(AlertReceiver)
                .where(AlertReceiver.id == receiver.id)
                .values(
                    consecutive_failures=AlertReceiver.consecutive_failures + 1,
                    last_failure_at=now,
                    last_error=outcome.error,
                )
            )
