"""A receiver that keeps failing is itself visible: on ``/healthz`` (``notifiers``) and on
``/metrics`` (``tuneloop_alert_receiver_*``), read from the store, so it shows whichever
process (API, Celery worker) did the sending."""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
class ReceiverHealth:
    project: str
    receiver: str
    kind: str
    consecutive_failures: int
    last_success_at: datetime | None
    last_error: str | None

    @property
    def ok(self) -> bool:
        return self.consecutive_failures < FAILING_AFTER


def receiver_health(engine: Engine) -> list[ReceiverHealth]:
    statement = (
        select(
            Project.name,
            AlertReceiver.name,
            AlertReceiver.kind,
            AlertReceiver.consecutive_failures,
            AlertReceiver.last_success_at,
            AlertReceiver.last_error,
        )
        .join(Project, Project.id == AlertReceiver.project_id)
        .where(AlertReceiver.enabled.is_(True))
        .order_by(Project.name, AlertReceiver.name)
    )
    with engine.connect() as connection:
        return [ReceiverHealth(*row) for row in connection.execute(statement).all()]


class ReceiverHealthCollector(Collector):
    """Gauges per receiver; nothing (rather than an error) while the store is down."""

    def __init__(self, engine: Callable[[], Engine | None]) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        engine = self._engine()
        if engine is None:
            return
        try:
            health = receiver_health(engine)
        except SQLAlchemyError:
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
        for item in health:
            labels = [item.project, item.receiver, item.kind]
            failures.add_metric(labels, item.consecutive_failures)
            up.add_metric(labels, 1.0 if item.ok else 0.0)
        yield failures
        yield up
