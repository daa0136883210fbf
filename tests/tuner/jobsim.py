"""The job side of a tuning loop, simulated straight in the store through the storage layer:
observed configs (the agent's acknowledgements and failure reports) and step-timing samples."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from tuneloop.job_configs import ObservedReport, ObservedStatus, append_version, propose
from tuneloop.storage import session_factory, session_scope
from tuneloop.storage.models import Job, JobConfig, Project
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter
from tuner.readings import (
    LATENCY_HISTOGRAM,
    NOISE_SCALE_METRIC,
    STEP_TIME_METRIC,
    THROUGHPUT_METRIC,
)

START_CONFIG: dict[str, Any] = {"batch_size": 32, "sync_period": 1}
"""The config a simulated job starts on: its agent registers it as desired version 1."""


def make_job(
    session: Session,
    *,
    project: str = "p",
    name: str = "train",
    labels: dict[str, str] | None = None,
    kind: str = "training",
    config: dict[str, Any] | None = START_CONFIG,
) -> Job:
    """A running job; with ``config``, the desired version 1 its agent registers on start (the
    pre-study config of its studies)."""
    owner = session.scalars(select(Project).where(Project.name == project)).one_or_none()
    if owner is None:
        owner = Project(name=project)
        session.add(owner)
        session.flush()
    job = Job(project_id=owner.id, name=name, labels=labels or {}, kind=kind, status="running")
    session.add(job)
    session.flush()
    if config is not None:
        propose(session, job, config, source="agent")
    return job


def write_steps(
    engine: Engine,
    project_id: int,
    job: str,
    *,
    start: datetime,
    end: datetime,
    per_rank: float,
    ranks: int = 2,
    every_s: float = 0.5,
    wobble: float = 0.005,
    noise_scale: float | None = None,
) -> None:
    """Step samples of every rank in ``[start, end)``: ``per_rank`` samples/s with a small
    deterministic wobble, the matching step times, and the agent's noise-scale estimate."""
    count = max(1, int((end - start).total_seconds() / every_s))
    times = [start + timedelta(seconds=i * every_s) for i in range(count)]
    batches: list[SeriesBatch] = []
    for rank in range(ranks):
        values = [per_rank * (1 + wobble * math.sin(i + rank)) for i in range(count)]
        labels = {"job": job, "rank": str(rank)}
        batches.append(SeriesBatch(THROUGHPUT_METRIC, labels, times, values))
        batches.append(SeriesBatch(STEP_TIME_METRIC, labels, times, [1.0 / v for v in values]))
    if noise_scale is not None:
        batches.append(SeriesBatch(NOISE_SCALE_METRIC, {"job": job}, times, [noise_scale] * count))
    result = SampleWriter(engine).write(project_id, batches)
    assert not result.rejected, result.rejected


def write_latency(
    engine: Engine,
    project_id: int,
    job: str,
    *,
    start: datetime,
    end: datetime,
    bounds: Sequence[float],
    per_second: Sequence[float],
) -> None:
    """A latency histogram whose buckets grow by ``per_second`` observations each second
    (``per_second[i]`` in bucket ``le=bounds[i]``, non-cumulative; the last bound is +Inf)."""
    seconds = int((end - start).total_seconds())
    times = [start + timedelta(seconds=i) for i in range(seconds + 1)]
    batches = []
    cumulative = 0.0
    for bound, rate in zip(bounds, per_second, strict=True):
        cumulative += rate
        le = "+Inf" if math.isinf(bound) else repr(float(bound))
        batches.append(
            SeriesBatch(
                LATENCY_HISTOGRAM + "_bucket",
                {"job": job, "le": le},
                times,
                [cumulative * i for i in range(len(times))],
                SeriesKind.COUNTER,
            )
        )
    result = SampleWriter(engine).write(project_id, batches)
    assert not result.rejected, result.rejected


def report(
    engine: Engine,
    job_id: int,
    desired_version: int,
    *,
    at: datetime,
    status: str = "running",
    reason: str | None = None,
    config: dict[str, Any] | None = None,
) -> int:
    """The agent reports running ``desired_version`` (or failing on it) as of ``at``."""
    typed = ObservedReport(desired_version, cast(ObservedStatus, status), reason or "")
    with session_scope(session_factory(engine)) as session:
        job = session.get(Job, job_id)
        assert job is not None
        row = append_version(session, job, "observed", config or {}, origin="agent", report=typed)
        row.created_at = at
        return row.version


def desired(engine: Engine, job_id: int) -> list[JobConfig]:
    with session_scope(session_factory(engine)) as session:
        rows = session.scalars(
            select(JobConfig)
            .where(JobConfig.job_id == job_id, JobConfig.kind == "desired")
            .order_by(JobConfig.version)
        ).all()
        session.expunge_all()
        return list(rows)


def write_gpu_memory(
    engine: Engine,
    project_id: int,
    labels: dict[str, str],
    *,
    start: datetime,
    end: datetime,
    used_mib: float,
    total_mib: float,
    every_s: float = 1.0,
) -> None:
    """A GPU's framebuffer gauges in ``[start, end)`` as the collector stores them
    (dcgm-exporter's ``DCGM_FI_DEV_FB_USED``/``_FREE`` in MiB, ``labels`` its GPU labels):
    ``used_mib`` with a small ramp to it over the first samples, the rest free."""
    count = max(1, int((end - start).total_seconds() / every_s))
    times = [start + timedelta(seconds=i * every_s) for i in range(count)]
    used = [used_mib * min(1.0, 0.9 + 0.05 * i) for i in range(count)]
    batches = [
        SeriesBatch("DCGM_FI_DEV_FB_USED", labels, times, used),
        SeriesBatch("DCGM_FI_DEV_FB_FREE", labels, times, [total_mib - u for u in used]),
    ]
    result = SampleWriter(engine).write(project_id, batches)
    assert not result.rejected, result.rejected


def write_counter(
    engine: Engine,
    project_id: int,
    job: str,
    metric: str,
    *,
    start: datetime,
    end: datetime,
    per_second: float,
) -> None:
    """A counter of ``job`` growing by ``per_second`` each second over ``[start, end]``
    (from 0 at ``start``: a reset for the reader, as a restarted replica's)."""
    seconds = int((end - start).total_seconds())
    times = [start + timedelta(seconds=i) for i in range(seconds + 1)]
    values = [per_second * i for i in range(len(times))]
    batch = SeriesBatch(metric, {"job": job}, times, values, SeriesKind.COUNTER)
    result = SampleWriter(engine).write(project_id, [batch])
    assert not result.rejected, result.rejected
