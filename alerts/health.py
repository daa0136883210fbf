"""A receiver that keeps failing is itself visible: on ``/healthz`` (``notifiers``) and on
``/metrics`` (``tuneloop_alert_receiver_*``), read from the store, so it shows whichever
process (API, Celery worker) did the sending.

Both answer without a token, so what they show depends on who asks (:class:`Audience`): without
a token only counts (no project or receiver names, no errors); with one, the receivers of the
projects the token reaches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine, select
from sqlalchemy.exc import SQLAlchemyError

from tuneloop.storage.models import AlertReceiver, Project

FAILING_AFTER = 3
"""Consecutive failed attempts after which a receiver counts as failing."""


@dataclass(frozen=True, slots=True)
class Audience:
    """Whose receivers a reader sees by name: none (no token), every project's (an admin
    token), or one project's (``project_id``: a project token)."""

    named: bool
    project_id: int | None = None

    def sees(self, project_id: int) -> bool:
        return self.named and self.project_id in (None, project_id)


ANONYMOUS = Audience(named=False)
EVERY_PROJECT = Audience(named=True)


@dataclass(frozen=True, slots=True)
class ReceiverHealth:
    project: str
    receiver: str
    kind: str
    consecutive_failures: int
    last_success_at: datetime | None
    last_error: str | None
    project_id: int

    @property
    def ok(self) -> bool:
        return self.consecutive_failures < FAILING_AFTER


def receiver_health(engine: Engine) -> list[ReceiverHealth]:
    """Every enabled receiver of every project; show it through :func:`visible`."""
    statement = (
        select(
            Project.name,
            AlertReceiver.name,
            AlertReceiver.kind,
            AlertReceiver.consecutive_failures,
            AlertReceiver.last_success_at,
            AlertReceiver.last_error,
            Project.id,
        )
        .join(Project, Project.id == AlertReceiver.project_id)
        .where(AlertReceiver.enabled.is_(True))
        .order_by(Project.name, AlertReceiver.name)
    )
    with engine.connect() as connection:
        return [ReceiverHealth(*row) for row in connection.execute(statement).all()]


def visible(health: Sequence[ReceiverHealth], audience: Audience) -> list[ReceiverHealth]:
    return [item for item in health if audience.sees(item.project_id)]


def failing(health: Sequence[ReceiverHealth]) -> int:
    return sum(not item.ok for item in health)


class ReceiverHealthCollector(Collector):
    """Counts of receivers and of failing ones, for anyone; gauges per receiver for those the
    audience sees. Nothing (rather than an error) while the store is down."""

    def __init__(
        self, engine: Callable[[], Engine | None], audience: Audience = EVERY_PROJECT
    ) -> None:
        self._engine = engine
        self.audience = audience

    def collect(self) -> Iterator[Metric]:
        engine = self._engine()
        if engine is None:
            return
        try:
            health = receiver_health(engine)
        except SQLAlchemyError:
            return
        yield GaugeMetricFamily(
            "tuneloop_alert_receivers", "Enabled alert receivers.", value=len(health)
        )
        yield GaugeMetricFamily(
            "tuneloop_alert_receivers_failing",
            f"Enabled alert receivers that failed {FAILING_AFTER} or more times in a row.",
            value=failing(health),
        )
        shown = visible(health, self.audience)
        if not shown:
            return
        failures = GaugeMetricFamily(
            "tuneloop_alert_receiver_consecutive_failures",
            "Failed delivery attempts of an alert receiver since its last success.",
            labels=["project", "receiver", "kind"],
        )
        up = GaugeMetricFamily(
            "tuneloop_alert_receiver_up",
            f"1 unless the receiver failed {FAILING_AFTER} or more times in a row.",
            labels=["project", "receiver", "kind"],
        )
        for item in shown:
            labels = [item.project, item.receiver, item.kind]
            failures.add_metric(labels, item.consecutive_failures)
            up.add_metric(labels, 1.0 if item.ok else 0.0)
        yield failures
        yield up
