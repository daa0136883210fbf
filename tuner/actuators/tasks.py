"""The job actuator's periodic task: one reconcile pass over every job that needs one.

Agents' long-polls already reconcile their own job at once; this task is what moves jobs
whose agents are not polling right now (freeze windows ending, verifications coming due,
approvals) and what a Celery deployment runs on its workers.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from tuneloop.storage import session_scope
from tuneloop.storage.locks import hold_write_lock
from tuneloop.storage.models import Job, JobConfig
from tuner.actuators.job import ReconcileConflict, needs_reconcile, reconcile_job

log = logging.getLogger(__name__)

ACTIVE_STATUSES = ("pending", "running", "paused")


def reconcile_all(
    sessions: sessionmaker[Session], *, now: datetime | None = None
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
        action: str
        try:
            with session_scope(sessions) as session:
                job = session.get(Job, job_id)
                if job is None or not needs_reconcile(session, job):
                    continue
            with session_scope(sessions) as session:
                hold_write_lock(session)
                job = session.get(Job, job_id)
                if job is None:
                    continue
                action = reconcile_job(session, job, now=now).action
        except ReconcileConflict:
            action = "conflict"
        except Exception:
            log.exception("reconciling job %d failed; it is retried on the next tick", job_id)
            action = "error"
        counts[action] = counts.get(action, 0) + 1
    return counts


def run_reconcile(sessions: sessionmaker[Session]) -> None:
    """The periodic task: re-reads the store through ``sessions``, the process's runtime's."""
    counts = reconcile_all(sessions)
    if counts:
        log.info("job actuator pass: %s", counts)
