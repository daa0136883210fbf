"""What one evaluation pass queues for the receivers, in the pass's own transaction.

Two paths. tuneloop's own routing (webhook, Slack, PagerDuty, e-mail): a firing alert is
announced once, unless muted, and again every ``repeat_interval``; its resolution once; a new
notification waits ``group_wait`` (a group with no message in the last ``group_interval``) or
until ``group_interval`` after the group's last message, so the alerts of a group go out in
one message. Alertmanager receivers (:data:`PUSH_KINDS`): every firing alert, muted or not
(silences and inhibit rules live in Alertmanager), is queued again each ``resend_interval``,
and its resolution once, as Prometheus's notifier sends; Alertmanager groups and repeats.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from alerts.notifiers.config import (
    PUSH_KINDS,
    AlertmanagerConfig,
    ReceiverConfig,
    parse_config,
)
from alerts.routing import Route, group_key, routes_for
from alerts.state import Event, State
from tuneloop.storage.models import AlertInstance, AlertReceiver, Notification

PUSH_GROUP = "{}/alertmanager:{}"
"""One group per Alertmanager receiver: each request carries every alert that is due."""


def rule_path(project: str, rule: str) -> str:
    """The rule in tuneloop's API: an alert's ``generatorURL`` below the external URL."""
    return f"/api/v1/projects/{quote(project, safe='')}/alerts/rules/{quote(rule, safe='')}"


def alert_snapshot(row: AlertInstance, event: Event, generator_path: str = "") -> dict[str, Any]:
    """The alert as receivers see it, frozen when the event happened."""
    starts = row.fired_at or row.active_at
    ends = row.resolved_at if event is Event.RESOLVED else None
    return {
        "fingerprint": row.fingerprint,
        "labels": dict(row.labels),
        "annotations": dict(row.annotations),
        "startsAt": starts.isoformat() if starts else None,
        "endsAt": ends.isoformat() if ends else None,
        "value": row.value,
        "status": event.value,
        "generatorPath": generator_path,
    }


@dataclass(frozen=True, slots=True)
class Receivers:
    """A project's enabled receivers, by path."""

    routes: list[Route]
    pushes: list[tuple[Route, timedelta]]
    """Alertmanager receivers and their resend interval."""

    @classmethod
    def of(cls, rows: Iterable[AlertReceiver]) -> Receivers:
        routes: list[Route] = []
        pushes: list[tuple[Route, timedelta]] = []
        for row in rows:
            route = Route.of(row.id, row.name, row.matchers, row.group_by)
            try:
                config = parse_config(row.kind, row.config)
            except ValueError:
                config = None  # the dispatcher fails its notifications, saying why
            if row.kind in PUSH_KINDS:
                resend = config.resend_interval_s if isinstance(config, AlertmanagerConfig) else 60
                pushes.append((route, timedelta(seconds=resend)))
            else:
                routes.append(_timed(route, config))
        return cls(routes, pushes)


def _timed(route: Route, config: ReceiverConfig | None) -> Route:
    if config is None or isinstance(config, AlertmanagerConfig):
        return route
    return replace(
        route,
        group_wait=timedelta(seconds=config.group_wait_s),
        group_interval=timedelta(seconds=config.group_interval_s),
        repeat_interval=timedelta(seconds=config.repeat_interval_s),
    )


class Outbox:
    """Queues the notifications of one project's pass."""

    def __init__(self, session: Session, now: datetime, generator_project: str) -> None:
        self.session = session
        self.now = now
        self.project = generator_project
        self.queued = 0
        self._group_times: dict[tuple[int, str], datetime] = {}

    def latest(
        self, rows: Sequence[AlertInstance], receiver_ids: Sequence[int]
    ) -> dict[tuple[int, int], Notification]:
        """The newest notification of each (alert, receiver)."""
        if not rows or not receiver_ids:
            return {}
        newest = (
            select(func.max(Notification.id))
            .where(
                Notification.instance_id.in_([row.id for row in rows]),
                Notification.receiver_id.in_(receiver_ids),
            )
            .group_by(Notification.instance_id, Notification.receiver_id)
        )
        found = self.session.scalars(select(Notification).where(Notification.id.in_(newest)))
        return {(n.instance_id, n.receiver_id or 0): n for n in found}

    def add(
        self,
        row: AlertInstance,
        route: Route,
        event: Event,
        key: str,
        not_before: datetime | None = None,
    ) -> None:
        generator = rule_path(self.project, str(row.labels.get("alertname", "")))
        self.session.add(
            Notification(
                instance_id=row.id,
                receiver_id=route.receiver_id,
                receiver=route.receiver,
                event=event.value,
                status="pending",
                attempts=0,
                group_key=key,
                alert=alert_snapshot(row, event, generator),
                created_at=self.now,
                next_attempt_at=not_before,
            )
        )
        self.queued += 1

    # ------------------------------------------------------------ tuneloop's routing

    def announce(self, row: AlertInstance, event: Event, routes: Sequence[Route]) -> None:
        for route in routes_for(row.labels, routes):
            key = group_key(route, row.labels)
            self.add(row, route, event, key, self._group_time(route, key))

    def repeat(
        self,
        row: AlertInstance,
        routes: Sequence[Route],
        latest: dict[tuple[int, int], Notification],
    ) -> None:
        """A firing alert announced ``repeat_interval`` ago or longer is announced again."""
        for route in routes_for(row.labels, routes):
            if route.repeat_interval <= timedelta(0):
                continue
            last = latest.get((row.id, route.receiver_id))
            if last is None or last.status == "pending" or last.event != Event.FIRING:
                continue
            if self.now - last.created_at >= route.repeat_interval:
                key = group_key(route, row.labels)
                self.add(row, route, Event.FIRING, key, self._group_time(route, key))

    def _group_time(self, route: Route, key: str) -> datetime | None:
        """When a new notification of the group may go out: with the group's waiting ones,
        ``group_interval`` after its last message, or ``group_wait`` from now."""
        if route.group_wait <= timedelta(0) and route.group_interval <= timedelta(0):
            return None
        known = self._group_times.get((route.receiver_id, key))
        if known is not None:
            return known
        in_group = (
            Notification.receiver_id == route.receiver_id,
            Notification.group_key == key,
        )
        waiting = self.session.scalar(
            select(func.min(Notification.next_attempt_at)).where(
                *in_group,
                Notification.status == "pending",
                Notification.attempts == 0,
                Notification.next_attempt_at > self.now,
            )
        )
        last_sent = self.session.scalar(
            select(func.max(Notification.sent_at)).where(*in_group, Notification.status == "sent")
        )
        when = self.now + route.group_wait
        if waiting is not None:
            when = waiting
        elif last_sent is not None and self.now - last_sent < route.group_interval:
            when = last_sent + route.group_interval
        self._group_times[(route.receiver_id, key)] = when
        return when

    # ------------------------------------------------------------ Alertmanager

    def push(
        self,
        rows: Sequence[AlertInstance],
        pushes: Sequence[tuple[Route, timedelta]],
        latest: dict[tuple[int, int], Notification],
    ) -> None:
        """Queue each firing alert again once its last send is ``resend`` old (a send still
        pending or retried is left alone), and a resolution once after a firing."""
        for row in rows:
            state = State(row.state)
            for route, resend in pushes:
                if not routes_for(row.labels, [route]):
                    continue
                last = latest.get((row.id, route.receiver_id))
                key = PUSH_GROUP
                if state is State.FIRING:
                    if last is None or last.event != Event.FIRING:
                        self.add(row, route, Event.FIRING, key)
                    elif last.status != "pending" and self.now - last.created_at >= resend:
                        self._rearm(last, row)
                elif state is State.RESOLVED and last is not None and last.event == Event.FIRING:
                    self.add(row, route, Event.RESOLVED, key)

    def _rearm(self, last: Notification, row: AlertInstance) -> None:
        """Send the alert's firing row again (one row per firing, not one per resend)."""
        generator = rule_path(self.project, str(row.labels.get("alertname", "")))
        last.alert = alert_snapshot(row, Event.FIRING, generator)
        last.status, last.attempts, last.next_attempt_at = "pending", 0, None
        last.created_at = self.now
        self.queued += 1
