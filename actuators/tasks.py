"""Reconcile passes: :func:`reconcile_now` for one job, and the periodic task over every job
that needs one.

Agents' long-polls reconcile their own job at once through :func:`reconcile_now`; the
periodic task is what moves jobs whose agents are not polling right now (freeze windows
ending, verifications coming due, approvals) and what a Celery deployment runs on its workers.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from actuators.job import ReconcileConflict, needs_reconcile, reconcile_job
from tuneloop.storage import session_scope
from tuneloop.storage.locks import hold_write_lock
from tuneloop.storage.models import Job, JobConfig
from tuneloop.storage.timeseries.backend import TimeSeriesBackend

log = logging.getLogger(__name__)

ACTIVE_STATUSES = ("pending", "running", "paused")


def reconcile_all(
    sessions: sessionmaker[Session],
    *,
    now: datetime | None = None,
    series: TimeSeriesBackend | None = None,
) -> dict[str, int]:
    """Reconcile each active job with a desired config, each in its own transaction (one
    job's failure does not hold back the others). Returns counts by decision action."""
    with session_scope(sessions) as session:
        job_ids = list(
            session.scalars(
                select(Job.id)
                .where(
                    Job.status.in_(ACTIVE_STATUSES),
                    select(JobConfig.id).where(JobConfig.job_id == Job.id).exists(),
                )
                .order_by(Job.id)
            )
        )
    counts: dict[str, int] = {}
    for job_id in job_ids:
        action: str | None
        try:
            action = reconcile_now(sessions, job_id, now=now, series=series)
        except Exception:
            log.exception("reconciling job %d failed; it is retried on the next tick", job_id)
            action = "error"
        if action is not None:
            counts[action] = counts.get(action, 0) + 1
    return counts


def reconcile_now(
    sessions: sessionmaker[Session],
    job_id: int,
    *,
    now: datetime | None = None,
    series: TimeSeriesBackend | None = None,
) -> str | None:
    """One reconcile pass of job ``job_id`` in a transaction of its own, if it needs one.
    Returns the decision's action, ``conflict`` when another reconciler acted first (what it
    did stands), or ``None`` when there was nothing to do or the job is gone.

    The cheap check runs first in a read-only transaction: pollers of a settled job never
    take SQLite's one writer lock."""
    with session_scope(sessions) as session:
        job = session.get(Job, job_id)
        if job is None or not needs_reconcile(session, job):
            return None
    try:
        with session_scope(sessions) as session:
            hold_write_lock(session)
            job = session.get(Job, job_id)
            if job is None:
                return None
            return reconcile_job(session, job, now=now, series=series).action
    except ReconcileConflict:
        return "conflict"


def run_reconcile(sessions: sessionmaker[Session], series: TimeSeriesBackend | None = None) -> None:
    """The periodic task: re-reads the store through ``sessions``, the process's runtime's,
    and the jobs' objectives from ``series`` (the runtime's TSDB, if it has one)."""
    counts = reconcile_all(sessions, series=series)
    if counts:
        log.info("job actuator pass: %s", counts)
