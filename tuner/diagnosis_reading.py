"""The diagnosis of a job (:mod:`tuner.diagnosis`) from what is collected: its step timings
(docs/step-timing.md), the DCGM activity of its GPUs, and the hosts and GPUs its agents
registered per rank.

Series are read through the time-series contract (``query_range`` per bucket), so the diagnosis
reads the built-in store and a Prometheus-compatible TSDB alike; the registrations come from
the database.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Final

from sqlalchemy import Connection, Engine, select

from tuneloop.step_timing import (
    FLOPS_PER_SAMPLE,
    PEAK_FLOPS,
    PHASE_DURATION,
    SAMPLES_PER_SECOND,
    STEP_DURATION,
)
from tuneloop.storage.models import Job, JobAgent, JobGpu
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.timeseries.types import Aggregation, Matcher, MatchOp, RangeSeries
from tuner.diagnosis import Diagnosis, GpuActivity, RankTimings, diagnose
from tuner.efficiency import Throughput
from tuner.readings import JOB_LABEL, RANK_LABEL, UUID_LABEL, job_gpu_uuids

Bind = Engine | Connection

DEFAULT_WINDOW: Final = timedelta(minutes=5)
BUCKETS: Final = 60
"""Buckets per window: enough for the window estimate's batch means."""
PHASE_LABEL: Final = "phase"
GPU_UTIL_METRIC: Final = "DCGM_FI_DEV_GPU_UTIL"
"""Percent of time a kernel ran (0-100)."""
SM_ACTIVE_METRIC: Final = "DCGM_FI_PROF_SM_ACTIVE"
DRAM_ACTIVE_METRIC: Final = "DCGM_FI_PROF_DRAM_ACTIVE"
TENSOR_ACTIVE_METRIC: Final = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
ACTIVITY_METRICS: Final = (
    GPU_UTIL_METRIC,
    SM_ACTIVE_METRIC,
    DRAM_ACTIVE_METRIC,
    TENSOR_ACTIVE_METRIC,
)
MODEL_NAME_LABEL: Final = "modelName"
GPU_INDEX_LABEL: Final = "gpu"


@dataclasses.dataclass(frozen=True, slots=True)
class RankPlace:
    """Where a rank runs, as its agent registered it."""

    host: str
    gpu_uuids: tuple[str, ...]


def job_diagnosis(
    series: TimeSeriesBackend,
    bind: Bind,
    job: Job,
    *,
    end: datetime,
    window: timedelta = DEFAULT_WINDOW,
    peak_flops: float | None = None,
) -> Diagnosis:
    """The diagnosis of ``job`` over ``[end - window, end)``; ``peak_flops``: the operator's
    peak FLOP/s per GPU, over the table's (a job's declared peak still wins)."""
    start = end - window
    step_s = max(1, math.ceil(window.total_seconds() / BUCKETS))
    ranks = rank_timings(series, job.project_id, job.name, start=start, end=end, step_s=step_s)
    places = rank_places(bind, job.id)
    uuids = job_gpu_uuids(job.labels, (u for p in places.values() for u in p.gpu_uuids))
    gpu = gpu_activity(series, job.project_id, job.name, uuids, start=start, end=end)
    work = throughput(series, job.project_id, job.name, places, start=start, end=end)
    found = diagnose(ranks, gpu, work, setting_peak=peak_flops)
    if not found.stragglers:
        return found
    lagging = [u for lag in found.stragglers for u in _uuids(places.get(lag.rank))]
    names = gpu_names(series, job.project_id, lagging)
    placed = []
    for lag in found.stragglers:
        place = places.get(lag.rank)
        if place is None:
            placed.append(lag)
            continue
        gpus = tuple(names.get(u, u) for u in place.gpu_uuids)
        placed.append(dataclasses.replace(lag, host=place.host, gpus=gpus))
    return dataclasses.replace(found, stragglers=tuple(placed))


def rank_timings(
    series: TimeSeriesBackend,
    project_id: int,
    job_name: str,
    *,
    start: datetime,
    end: datetime,
    step_s: int,
) -> list[RankTimings]:
    """Each rank's per-bucket mean step and phase times and longest step in ``[start, end)``,
    and its lowest time."""
    matchers = [Matcher(JOB_LABEL, MatchOp.EQ, job_name)]

    def read(metric: str, aggregation: Aggregation, step: int) -> list[RangeSeries]:
        return series.query_range(
            project_id, metric, matchers, start=start, end=end, step_s=step, aggregation=aggregation
        )

    steps: dict[str, dict[float, float]] = {}
    phases: dict[str, dict[str, dict[float, float]]] = defaultdict(dict)
    lowest: dict[str, float] = {}
    for one in read(STEP_DURATION, Aggregation.AVG, step_s):
        steps[_rank(one)] = _points(one)
    longest = {_rank(one): _points(one) for one in read(STEP_DURATION, Aggregation.MAX, step_s)}
    for one in read(PHASE_DURATION, Aggregation.AVG, step_s):
        phase = one.series.labels.get(PHASE_LABEL, "")
        phases[_rank(one)][phase] = _points(one)
    whole = max(1, math.ceil((end - start).total_seconds()))
    for metric in (STEP_DURATION, PHASE_DURATION):
        for one in read(metric, Aggregation.MIN, whole):
            values = [v for _, v in one.points if math.isfinite(v)]
            if values:
                rank = _rank(one)
                lowest[rank] = min(lowest.get(rank, math.inf), *values)
    names = sorted(steps.keys() | phases.keys(), key=_rank_order)
    return [
        RankTimings(
            rank, steps.get(rank, {}), phases.get(rank, {}), lowest.get(rank), longest.get(rank, {})
        )
        for rank in names
    ]


def rank_places(bind: Bind, job_id: int) -> dict[str, RankPlace]:
    """The host and GPU UUIDs each rank of the job registered (the latest registration wins);
    a rank without a GPU has its host all the same (``job_agents.rank_hosts``)."""
    query = select(JobGpu.rank, JobGpu.host, JobGpu.gpu_uuid).where(JobGpu.job_id == job_id)
    agents = select(JobAgent.rank_hosts).where(JobAgent.job_id == job_id).order_by(JobAgent.id)
    if isinstance(bind, Engine):
        with bind.connect() as connection:
            rows = connection.execute(query.order_by(JobGpu.id)).all()
            placed = connection.scalars(agents).all()
    else:
        rows = bind.execute(query.order_by(JobGpu.id)).all()
        placed = bind.scalars(agents).all()
    hosts: dict[str, str] = {}
    gpus: dict[str, list[str]] = defaultdict(list)
    for rank, host, uuid in rows:
        hosts[str(rank)] = host
        if uuid not in gpus[str(rank)]:
            gpus[str(rank)].append(uuid)
    # After the GPUs: registrations from before migration 0014 name no rank's host.
    for rank_hosts in placed:
        hosts.update({str(rank): str(host) for rank, host in (rank_hosts or {}).items()})
    return {rank: RankPlace(host, tuple(gpus[rank])) for rank, host in hosts.items()}


def gpu_activity(
    series: TimeSeriesBackend,
    project_id: int,
    job_name: str,
    gpu_uuids: Iterable[str],
    *,
    start: datetime,
    end: datetime,
) -> GpuActivity | None:
    """Mean DCGM activity of the job's GPUs (those labelled with the job, or listed by UUID) in
    ``[start, end)``, or ``None`` when DCGM reports none of it."""
    means: dict[str, float] = {}
    models: set[str] = set()
    for metric in ACTIVITY_METRICS:
        found = _job_gpu_series(series, project_id, metric, job_name, gpu_uuids, start, end)
        values = [v for one in found for _, v in one.points if math.isfinite(v)]
        if values:
            means[metric] = sum(values) / len(values)
        models.update(n for one in found if (n := one.series.labels.get(MODEL_NAME_LABEL)))
    if not means:
        return None
    util = means.get(GPU_UTIL_METRIC)
    return GpuActivity(
        utilization=None if util is None else util / 100.0,
        sm_active=means.get(SM_ACTIVE_METRIC),
        dram_active=means.get(DRAM_ACTIVE_METRIC),
        tensor_active=means.get(TENSOR_ACTIVE_METRIC),
        model_names=tuple(sorted(models)),
        metrics=tuple(sorted(means)),
    )


def throughput(
    series: TimeSeriesBackend,
    project_id: int,
    job_name: str,
    places: dict[str, RankPlace],
    *,
    start: datetime,
    end: datetime,
) -> Throughput:
    """What the job reports of its work in ``[start, end)``: FLOPs per sample and a declared
    peak (window means over its ranks), and each rank's mean samples per second."""
    matchers = [Matcher(JOB_LABEL, MatchOp.EQ, job_name)]
    whole = max(1, math.ceil((end - start).total_seconds()))

    def means(metric: str) -> dict[str, float]:
        found = series.query_range(
            project_id,
            metric,
            matchers,
            start=start,
            end=end,
            step_s=whole,
            aggregation=Aggregation.AVG,
        )
        per_rank: dict[str, list[float]] = defaultdict(list)
        for one in found:
            per_rank[_rank(one)] += [v for _, v in one.points if math.isfinite(v)]
        return {rank: sum(v) / len(v) for rank, v in per_rank.items() if v}

    def job_mean(metric: str) -> float | None:
        values = list(means(metric).values())
        return sum(values) / len(values) if values else None

    return Throughput(
        flops_per_sample=job_mean(FLOPS_PER_SAMPLE),
        samples_per_second=means(SAMPLES_PER_SECOND),
        gpus_per_rank={rank: len(place.gpu_uuids) for rank, place in places.items()},
        declared_peak=job_mean(PEAK_FLOPS),
    )


def gpu_names(
    series: TimeSeriesBackend,
    project_id: int,
    gpu_uuids: Iterable[str],
) -> dict[str, str]:
    """``UUID -> index`` (DCGM's ``gpu`` label) for the GPUs whose DCGM series name it."""
    names: dict[str, str] = {}
    for uuid in gpu_uuids:
        for metric in ACTIVITY_METRICS:
            found = series.find_series(project_id, metric, [Matcher(UUID_LABEL, MatchOp.EQ, uuid)])
            if found and GPU_INDEX_LABEL in found[0].labels:
                names[uuid] = found[0].labels[GPU_INDEX_LABEL]
                break
    return names


def _job_gpu_series(
    series: TimeSeriesBackend,
    project_id: int,
    metric: str,
    job_name: str,
    gpu_uuids: Iterable[str],
    start: datetime,
    end: datetime,
) -> list[RangeSeries]:
    selectors = [[Matcher(JOB_LABEL, MatchOp.EQ, job_name)]]
    selectors += [[Matcher(UUID_LABEL, MatchOp.EQ, uuid)] for uuid in gpu_uuids]
    whole = max(1, math.ceil((end - start).total_seconds()))
    found: dict[int, RangeSeries] = {}
    for matchers in selectors:
        for one in series.query_range(
            project_id,
            metric,
            matchers,
            start=start,
            end=end,
            step_s=whole,
            aggregation=Aggregation.AVG,
        ):
            found[one.series.id] = one  # a GPU matched by label and UUID counts once
    return list(found.values())


def _uuids(place: RankPlace | None) -> tuple[str, ...]:
    return () if place is None else place.gpu_uuids


def _rank(one: RangeSeries) -> str:
    return one.series.labels.get(RANK_LABEL, "0")


def _rank_order(rank: str) -> tuple[int, str]:
    return (int(rank), "") if rank.isdigit() else (1 << 30, rank)


def _points(one: RangeSeries) -> dict[float, float]:
    return {t.timestamp(): v for t, v in one.points if math.isfinite(v)}
