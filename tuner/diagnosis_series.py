"""The diagnosis of every running training job, continuously: each pass diagnoses the jobs
(:mod:`tuner.diagnosis_reading`) and writes what it found as gauges (the names are in
:mod:`tuneloop.step_timing`), so alert rules and dashboards read verdicts, phase shares and
stragglers as they read any series, in the store or in a Prometheus-compatible TSDB.

Registered in ``tuneloop/taskqueue/registry.py`` as ``tuneloop.tuner.diagnose``, every
``TUNELOOP_TUNER_INTERVAL_S``; each job in its own transaction, so one failing job does not
hold back the others.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from tuneloop.step_timing import MFU, PHASE_SHARE, STRAGGLER_RATIO, VERDICT
from tuneloop.storage import session_scope
from tuneloop.storage.models import Job
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.timeseries.store_backend import StoreBackend
from tuneloop.storage.timeseries.types import SeriesBatch
from tuneloop.storage.types import utcnow
from tuner.diagnosis import Diagnosis, Verdict
from tuner.diagnosis_reading import job_diagnosis

log = logging.getLogger(__name__)


def diagnosis_batches(job: str, found: Diagnosis, at: datetime) -> list[SeriesBatch]:
    """The gauges of one diagnosis, stamped ``at``: nothing but the verdict for ``no_data``, so
    a job that stopped reporting does not keep its last shares."""
    batches = [SeriesBatch(VERDICT, {"job": job, "verdict": found.verdict.value}, [at], [1.0])]
    if found.verdict is Verdict.NO_DATA:
        return batches
    for share in found.shares:
        labels = {"job": job, "phase": share.phase}
        batches.append(SeriesBatch(PHASE_SHARE, labels, [at], [share.share]))
    for lag in found.stragglers:
        labels = {"job": job, "rank": lag.rank, "lags_in": lag.metric}
        if lag.host is not None:
            labels["Hostname"] = lag.host
        if lag.gpus:
            labels["gpu"] = ",".join(lag.gpus)
        ratio = lag.excess / lag.others_median if lag.others_median > 0 else 0.0
        batches.append(SeriesBatch(STRAGGLER_RATIO, labels, [at], [ratio]))
    work = found.efficiency
    if work is not None and work.mfu is not None:
        batches.append(SeriesBatch(MFU, {"job": job}, [at], [work.mfu]))
    return batches


def running_jobs(sessions: sessionmaker[Session]) -> list[int]:
    with session_scope(sessions) as session:
        query = select(Job.id).where(Job.status == "running", Job.kind == "training")
        return list(session.scalars(query.order_by(Job.id)))


def diagnose_job(
    sessions: sessionmaker[Session],
    job_id: int,
    series: TimeSeriesBackend | None = None,
    *,
    now: datetime | None = None,
    peak_flops: float | None = None,
) -> Diagnosis | None:
    """Diagnose one job and write the gauges; ``None`` when it is gone. ``peak_flops``: the
    operator's peak FLOP/s per GPU (``TUNELOOP_PEAK_FLOPS``)."""
    at = now or utcnow()
    with session_scope(sessions) as session:
        job = session.get(Job, job_id)
        if job is None:
            return None
        connection = session.connection()
        found = job_diagnosis(
            series or StoreBackend(connection), connection, job, end=at, peak_flops=peak_flops
        )
        project_id, batches = job.project_id, diagnosis_batches(job.name, found, at)
        engine = connection.engine
    # Written once the reads' transaction is over: SQLite lets one writer in at a time.
    result = (series or StoreBackend(engine)).write(project_id, batches)
    if result.rejected:
        log.warning("job %s: diagnosis series rejected: %s", job_id, result.rejected[:3])
    return found


def run_diagnosis(
    sessions: sessionmaker[Session],
    series: TimeSeriesBackend | None = None,
    *,
    peak_flops: float | None = None,
) -> None:
    """The periodic task: every running training job, one after another."""
    for job_id in running_jobs(sessions):
        try:
            diagnose_job(sessions, job_id, series, peak_flops=peak_flops)
        except Exception:
            # One bad job must not starve the others; it is tried again next pass.
            log.exception("diagnosis of job %s failed; it runs again at the next pass", job_id)
