"""A project on each backend with helpers to add rules, write samples and read what the
evaluator queued."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from alerts import store
from alerts.evaluator import Evaluator, PassResult
from alerts.rules import InhibitDefinition, parse_rule
from tuneloop import accounts
from tuneloop.storage import session_factory, session_scope
from tuneloop.storage.models import AlertInstance, AlertReceiver, Notification, Project
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@dataclass
class Alerting:
    engine: Engine
    sessions: sessionmaker[Session]
    project_id: int

    def project(self, session: Session) -> Project:
        found = session.get(Project, self.project_id)
        assert found is not None
        return found

    def rule(self, **definition: Any) -> None:
        with session_scope(self.sessions) as session:
            store.create_rule(session, self.project(session), parse_rule(definition))

    def receiver(
        self,
        name: str = "hook",
        url: str = "http://127.0.0.1:9/",
        *,
        kind: str = "webhook",
        config: dict[str, Any] | None = None,
        **extra: Any,
    ) -> None:
        with session_scope(self.sessions) as session:
            store.create_receiver(
                session, self.project(session), name=name, kind=kind,
                config=config if config is not None else {"url": url}, **extra,
            )  # fmt: skip

    def outcomes(self) -> list[tuple[str, str, str, int]]:
        """(receiver, event, status, attempts) of every notification, in order."""
        with self.sessions() as session:
            rows = session.scalars(select(Notification).order_by(Notification.id)).all()
            return [(row.receiver, row.event, row.status, row.attempts) for row in rows]

    def receiver_row(self, name: str) -> AlertReceiver:
        with self.sessions() as session:
            row = session.scalars(select(AlertReceiver).where(AlertReceiver.name == name)).one()
            session.expunge(row)
            return row

    def inhibit(self, source: list[str], target: list[str], equal: list[str]) -> None:
        with session_scope(self.sessions) as session:
            definition = InhibitDefinition(tuple(source), tuple(target), tuple(equal))
            store.add_inhibition(session, self.project(session), definition)

    def silence(self, matchers: list[str], start: datetime, end: datetime) -> int:
        with session_scope(self.sessions) as session:
            row = store.create_silence(
                session, self.project(session), matchers=matchers, starts_at=start,
                ends_at=end, created_by="test",
            )  # fmt: skip
            return row.id

    def write(
        self,
        metric: str,
        labels: dict[str, str],
        points: Iterable[tuple[float, float]],
        kind: SeriesKind = SeriesKind.GAUGE,
    ) -> None:
        points = list(points)
        batch = SeriesBatch(
            metric, labels, [at(t) for t, _ in points], [v for _, v in points], kind
        )
        result = SampleWriter(self.engine).write(self.project_id, [batch])
        assert not result.rejected, result.rejected

    def evaluate(self, seconds: float, evaluator: Evaluator | None = None) -> PassResult:
        evaluator = evaluator or Evaluator(self.engine, self.sessions)
        result = evaluator.evaluate(at(seconds))
        assert not result.failed_rules, result.failed_rules
        return result

    def states(self) -> dict[str, str]:
        """``alertname/<label values>`` -> state."""
        with self.sessions() as session:
            rows = session.scalars(select(AlertInstance)).all()
            return {_name(row.labels): row.state for row in rows}

    def instance(self, name: str) -> AlertInstance:
        with self.sessions() as session:
            for row in session.scalars(select(AlertInstance)):
                if _name(row.labels) == name:
                    session.expunge(row)
                    return row
        raise AssertionError(f"no alert {name}")

    def notifications(self) -> list[tuple[str, str, str]]:
        """(receiver, event, alert name) of every queued notification, in order."""
        with self.sessions() as session:
            rows = session.scalars(select(Notification).order_by(Notification.id)).all()
            return [(row.receiver, row.event, _name(row.alert["labels"])) for row in rows]


def _name(labels: dict[str, Any]) -> str:
    rest = [f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("alertname", "severity")]
    return "/".join([labels["alertname"], *rest])


@pytest.fixture(autouse=True)
def _local_receivers(local_receivers_allowed: None) -> None:
    """Every receiver of these tests is a local server."""


@pytest.fixture
def alerting(engine: Engine) -> Alerting:
    sessions = session_factory(engine)
    with session_scope(sessions) as session:
        project_id = accounts.create_project(session, "alpha").id
    return Alerting(engine, sessions, project_id)
