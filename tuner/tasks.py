"""The tuning loop's tasks: thin entry points that take ids and re-read the store.

Registered in ``tuneloop/taskqueue/registry.py``: ``tuneloop.tuner.dispatch`` (periodic, every
``TUNELOOP_TUNER_INTERVAL_S``) lists the running studies and runs ``tuneloop.tuner.step`` for
each: on Celery as one task per study (so studies move in parallel and a failing one retries
alone), in-process one after another. A step is one :func:`tuner.loop.reconcile_study` pass in
its own transaction, serialised per study by a row lock, so a late, repeated or concurrent step
is harmless. The registry passes the session factory of the process's runtime.
"""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session, sessionmaker

from tuneloop.storage import session_scope
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.types import utcnow
from tuner.loop import StepResult, reconcile_study, running_study_ids

log = logging.getLogger(__name__)


def study_ids(sessions: sessionmaker[Session]) -> list[int]:
    with session_scope(sessions) as session:
        return running_study_ids(session)


def step_study(
    sessions: sessionmaker[Session], study_id: int, series: TimeSeriesBackend | None = None
) -> None:
    """One pass of the loop over study ``study_id``, measuring on ``series`` (the runtime's
    TSDB, if it has one)."""
    with session_scope(sessions) as session:
        result: StepResult = reconcile_study(session, int(study_id), now=utcnow(), series=series)
    if result.action != "skip":
        log.info("study %s: %s %s %s", study_id, result.action, result.trial or "", result.detail)
