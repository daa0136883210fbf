"""The autoscalers' periodic task: one pass over every enabled autoscaler, each on its own,
so one whose target is down neither stops nor delays the error-free rest beyond its timeout."""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from actuators.autoscaler.service import reconcile_autoscaler
from tuneloop.settings import Settings
from tuneloop.storage import session_scope
from tuneloop.storage.models import Autoscaler
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.types import utcnow

log = logging.getLogger(__name__)


def reconcile_all(
    sessions: sessionmaker[Session],
    *,
    now: datetime | None = None,
    settings: Settings | None = None,
    series: TimeSeriesBackend | None = None,
) -> dict[str, int]:
    """A pass per enabled autoscaler (as of ``now``, default: the time each starts). Returns
    counts by the passes' actions; a pass that failed on the store counts as ``error``."""
    with session_scope(sessions) as session:
        ids = list(
            session.scalars(
                select(Autoscaler.id).where(Autoscaler.enabled.is_(True)).order_by(Autoscaler.id)
            )
        )
    counts: dict[str, int] = {}
    for autoscaler_id in ids:
        try:
            with sessions() as session:
                result = reconcile_autoscaler(
                    session, autoscaler_id, now or utcnow(), settings=settings, series=series
                )
            action = result.action
        except Exception:
            log.exception(
                "autoscaler %d: pass failed; it runs again at the next tick", autoscaler_id
            )
            action = "error"
        counts[action] = counts.get(action, 0) + 1
    return counts


def run_autoscale(
    sessions: sessionmaker[Session],
    settings: Settings,
    series: TimeSeriesBackend | None = None,
) -> None:
    """The periodic task: re-reads the store through ``sessions``, the process's runtime's,
    and the signals from ``series`` (the runtime's TSDB, if it has one)."""
    counts = reconcile_all(sessions, settings=settings, series=series)
    if counts:
        log.info("autoscaler pass: %s", counts)
