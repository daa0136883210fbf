"""GPU cost accounting: GPU time, idle GPU time and energy per GPU (or MIG instance), job, team,
namespace, pod and project.

Definitions (the Cost dashboard's ``tuneloop_gpu_usage`` SQL function, migration 0011,
computes the same figures on PostgreSQL, MIG instances included; tests hold both to the same
numbers):

- A GPU is a ``DCGM_FI_DEV_GPU_UTIL`` series (dcgm-exporter's names and labels, as every GPU
  source stores them). A MIG instance reports no ``DCGM_FI_DEV_GPU_UTIL``: it is a
  ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` series (the graphics engine's active ratio, a profiling
  field) without a ``DCGM_FI_DEV_GPU_UTIL`` series of the same labels, and so is any GPU whose
  exporter sends only the profiling field. It is **in use** for a minute whose start lies in
  ``[start, end)`` when it reported utilization in that minute: each such minute counts 60
  GPU-seconds (a MIG instance's minute counts as one, whatever its share of the GPU). The
  minutes come from the 1-minute rollups up to their watermark and from raw samples after it,
  so any period the rollups keep (``TUNELOOP_ROLLUP_RETENTION_DAYS``) can be accounted.
- An in-use minute is **idle** when the GPU's average utilization in it is below
  ``idle_below`` percent (default 5); for the active ratio, below ``idle_below / 100``.
- **Energy** is the increase of the GPU's ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` counter
  (millijoules since boot) over the samples in ``[start, end)``, each paired with the sample
  before it (for the first, the last one in the hour before ``start``); a decrease is a
  counter reset (driver reload, reboot) and counts the new value, as Prometheus' ``increase``
  does. It is read from raw samples (``TUNELOOP_RETENTION_DAYS``), compacted ones included; the
  SQL function reads compacted spans from the counter's per-minute increase (migration 0015),
  the same figure for whole-minute edges. The instances of a MIG GPU
  each report the whole GPU's counter, so each is given an equal share of it.
- A GPU's **job** is its series' ``job`` label (add it with a relabel rule, e.g. from
  dcgm-exporter's ``pod`` label); its **team** is its ``team`` label, else the ``team``
  label of the job of that name in the project; its **namespace** and **pod** are
  dcgm-exporter's ``namespace`` and ``pod`` labels. GPUs without are reported under ``None``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    Float,
    Integer,
    Select,
    Table,
    case,
    func,
    literal,
    select,
    union_all,
)

from tuneloop.storage.models import ROLLUP_TABLES, Job, Series
from tuneloop.storage.timeseries.query import Bind, use_connection
from tuneloop.storage.timeseries.rollups import floor_time, partial_rows, read_watermarks
from tuneloop.storage.timeseries.sample_source import sample_rows
from tuneloop.storage.types import UTCDateTime

UTILIZATION_METRIC = "DCGM_FI_DEV_GPU_UTIL"
ACTIVITY_METRIC = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
"""A ratio (0-1): the utilization of MIG instances, which report no ``DCGM_FI_DEV_GPU_UTIL``."""
ENERGY_METRIC = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
DEFAULT_IDLE_BELOW = 5.0
MINUTE_S = 60
ENERGY_LOOKBACK = timedelta(hours=1)
"""How far before ``start`` the sample paired with the first one in the period may lie."""
JOULES_PER_KWH = 3_600_000.0

_series = cast(Table, Series.__table__)
_jobs = cast(Table, Job.__table__)


HOST_LABEL = "Hostname"
UUID_LABEL = "UUID"
MIG_INSTANCE_LABEL = "GPU_I_ID"
MIG_PROFILE_LABEL = "GPU_I_PROFILE"


class GroupBy(StrEnum):
    JOB = "job"
    TEAM = "team"
    NAMESPACE = "namespace"
    POD = "pod"
    PROJECT = "project"
    GPU = "gpu"


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """One GPU's figures over a period."""

    labels: Mapping[str, str]
    job: str | None
    team: str | None
    gpu_seconds: float
    idle_gpu_seconds: float
    energy_joules: float


@dataclass(frozen=True, slots=True)
class CostGroup:
    """The figures of one job, team, GPU or of the project, summed over its GPUs."""

    key: str | None
    gpus: int
    gpu_seconds: float
    idle_gpu_seconds: float
    energy_joules: float

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600.0

    @property
    def idle_gpu_hours(self) -> float:
        return self.idle_gpu_seconds / 3600.0

    @property
    def energy_kwh(self) -> float:
        return self.energy_joules / JOULES_PER_KWH


def gpu_usage(
    bind: Bind,
    project_id: int,
    start: datetime,
    end: datetime,
    *,
    idle_below: float = DEFAULT_IDLE_BELOW,
) -> list[GpuUsage]:
    """Figures of every GPU of ``project_id`` that was in use or used energy in
    ``[start, end)``, ordered by their labels."""
    if start.tzinfo is None or end.tzinfo is None:
        raise ValueError("naive datetime: tuneloop timestamps must be timezone-aware")
    if end <= start:
        raise ValueError("end must be after start")
    with use_connection(bind) as connection:
        gpus = _series_of(connection, project_id, UTILIZATION_METRIC)
        whole = {labels_key(labels) for _, labels in gpus}
        active = [
            (sid, labels)
            for sid, labels in _series_of(connection, project_id, ACTIVITY_METRIC)
            if labels_key(labels) not in whole
        ]
        counters = _series_of(connection, project_id, ENERGY_METRIC)
        minutes = _minutes(connection, [sid for sid, _ in gpus], start, end, idle_below)
        minutes.update(
            _minutes(connection, [sid for sid, _ in active], start, end, idle_below / 100.0)
        )
        energy = _energy(connection, [sid for sid, _ in counters], start, end)
        teams = _job_teams(connection, project_id)
    shares = mig_shares(labels for _, labels in counters)
    energy_by_labels = {
        labels_key(labels): _share(energy.get(sid), shares, labels) for sid, labels in counters
    }
    found = []
    for sid, labels in [*gpus, *active]:
        in_use, idle = minutes.get(sid, (0, 0))
        millijoules = energy_by_labels.get(labels_key(labels))
        if not in_use and millijoules is None:
            continue
        job = labels.get("job") or None
        team = labels.get("team") or (teams.get(job) if job else None) or None
        found.append(
            GpuUsage(
                labels=labels,
                job=job,
                team=team,
                gpu_seconds=float(MINUTE_S * in_use),
                idle_gpu_seconds=float(MINUTE_S * idle),
                energy_joules=(millijoules or 0.0) / 1000.0,
            )
        )
    return sorted(found, key=lambda usage: sorted(usage.labels.items()))


def summarize(usages: Iterable[GpuUsage], by: GroupBy) -> list[CostGroup]:
    """Sum ``usages`` per ``by``, most GPU time first (then by key, ``None`` last)."""
    groups: dict[str | None, list[GpuUsage]] = {}
    for usage in usages:
        groups.setdefault(group_key(usage, by), []).append(usage)
    summed = [
        CostGroup(
            key=key,
            gpus=len(members),
            gpu_seconds=sum(m.gpu_seconds for m in members),
            idle_gpu_seconds=sum(m.idle_gpu_seconds for m in members),
            energy_joules=sum(m.energy_joules for m in members),
        )
        for key, members in groups.items()
    ]
    return sorted(summed, key=lambda g: (-g.gpu_seconds, g.key is None, g.key or ""))


def total(usages: Sequence[GpuUsage]) -> CostGroup:
    groups = summarize(usages, GroupBy.PROJECT)
    return groups[0] if groups else CostGroup(None, 0, 0.0, 0.0, 0.0)


# --------------------------------------------------------------------------- queries


def group_key(usage: GpuUsage, by: GroupBy) -> str | None:
    if by is GroupBy.JOB:
        return usage.job
    if by is GroupBy.TEAM:
        return usage.team
    if by in (GroupBy.NAMESPACE, GroupBy.POD):
        return usage.labels.get(by.value) or None
    if by is GroupBy.GPU:
        return gpu_key(usage.labels)
    return "project"


def gpu_key(labels: Mapping[str, str]) -> str:
    """``host/gpu/UUID``, and ``/<profile>/<instance>`` for a MIG instance."""
    key = "/".join(labels.get(name, "") for name in (HOST_LABEL, "gpu", UUID_LABEL))
    if MIG_INSTANCE_LABEL in labels:
        key += f"/{labels.get(MIG_PROFILE_LABEL, '')}/{labels[MIG_INSTANCE_LABEL]}"
    return key


def mig_shares(labels: Iterable[Mapping[str, str]]) -> dict[tuple[str, str], int]:
    """(host, UUID) -> how many MIG instances of that GPU report its energy counter."""
    instances: dict[tuple[str, str], set[str]] = {}
    for item in labels:
        if MIG_INSTANCE_LABEL in item:
            gpu = (item.get(HOST_LABEL, ""), item.get(UUID_LABEL, ""))
            instances.setdefault(gpu, set()).add(item[MIG_INSTANCE_LABEL])
    return {gpu: len(ids) for gpu, ids in instances.items()}


def _share(
    millijoules: float | None, shares: Mapping[tuple[str, str], int], labels: Mapping[str, str]
) -> float | None:
    return None if millijoules is None else mig_share(millijoules, shares, labels)


def mig_share(
    millijoules: float, shares: Mapping[tuple[str, str], int], labels: Mapping[str, str]
) -> float:
    """The energy a series of ``labels`` is given: all of it for a whole GPU, an equal share of
    its GPU's for a MIG instance (``shares``: :func:`mig_shares`)."""
    if MIG_INSTANCE_LABEL not in labels:
        return millijoules
    gpu = (labels.get(HOST_LABEL, ""), labels.get(UUID_LABEL, ""))
    return millijoules / shares.get(gpu, 1)


def counter_growth(values: Sequence[float]) -> float:
    """The increase of an energy counter over consecutive samples, oldest first: each sample
    paired with the one before it, a decrease counted as a reset (the new value is the growth),
    as :func:`_energy` computes it in SQL and Prometheus' ``increase`` without extrapolation."""
    growth = 0.0
    for previous, value in itertools.pairwise(values):
        growth += value - previous if value >= previous else value
    return growth


def labels_key(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _series_of(
    connection: Connection, project_id: int, metric: str
) -> list[tuple[int, dict[str, str]]]:
    rows = connection.execute(
        select(_series.c.id, _series.c.labels).where(
            _series.c.project_id == project_id, _series.c.metric == metric
        )
    )
    return [(int(row.id), dict(row.labels)) for row in rows]


def _minutes(
    connection: Connection,
    series_ids: list[int],
    start: datetime,
    end: datetime,
    idle_below: float,
) -> dict[int, tuple[int, int]]:
    """series id -> (minutes in use, idle minutes)."""
    if not series_ids:
        return {}
    dialect = connection.dialect.name
    watermark = read_watermarks(connection).get(MINUTE_S)
    fields = ("sum", "count")
    parts: list[Select[Any]] = []
    minute_table = ROLLUP_TABLES[MINUTE_S]
    if watermark is not None and watermark > start:
        bucket = minute_table.c.bucket
        parts.append(
            partial_rows(
                minute_table,
                MINUTE_S,
                dialect,
                fields,
                minute_table.c.series_id.in_(series_ids),
                bucket >= start,
                bucket < min(end, watermark),
            )
        )
    raw_from = floor_time(start, MINUTE_S)
    if watermark is not None:
        raw_from = max(raw_from, watermark)
    if raw_from < end:
        source = sample_rows(connection, series_ids, [(raw_from, end)])
        parts.append(
            partial_rows(
                source,
                MINUTE_S,
                dialect,
                fields,
                source.c.series_id.in_(series_ids),
                source.c.ts >= raw_from,
                source.c.ts < end,
            )
        )
    if not parts:
        return {}
    rows = union_all(*parts).subquery("partials")
    utilization = (func.sum(rows.c.sum) / func.sum(rows.c.count)).label("util")
    bucket_start: ColumnElement[Any] = rows.c.bucket
    per_minute = (
        select(rows.c.series_id, utilization)
        .where(bucket_start >= literal(start, UTCDateTime()))
        .group_by(rows.c.series_id, rows.c.bucket)
        .subquery("minutes")
    )
    idle = func.sum(case((per_minute.c.util < idle_below, 1), else_=0), type_=Integer())
    statement = select(per_minute.c.series_id, func.count(), idle).group_by(per_minute.c.series_id)
    return {
        int(sid): (int(used), int(idle or 0)) for sid, used, idle in connection.execute(statement)
    }


def _energy(
    connection: Connection, series_ids: list[int], start: datetime, end: datetime
) -> dict[int, float]:
    """series id -> counter increase in ``[start, end)`` (the counter's unit)."""
    if not series_ids:
        return {}
    source = sample_rows(connection, series_ids, [(start - ENERGY_LOOKBACK, end)])
    previous = (
        func.lag(source.c.value)
        .over(partition_by=source.c.series_id, order_by=source.c.ts)
        .label("previous")
    )
    paired = (
        select(source.c.series_id, source.c.ts, source.c.value, previous)
        .where(
            source.c.series_id.in_(series_ids),
            source.c.ts >= start - ENERGY_LOOKBACK,
            source.c.ts < end,
        )
        .subquery("paired")
    )
    growth = case(
        (paired.c.value >= paired.c.previous, paired.c.value - paired.c.previous),
        else_=paired.c.value,
    )
    statement = (
        select(paired.c.series_id, func.sum(growth, type_=Float(precision=53)))
        .where(paired.c.ts >= literal(start, UTCDateTime()), paired.c.previous.is_not(None))
        .group_by(paired.c.series_id)
    )
    return {int(sid): float(value) for sid, value in connection.execute(statement)}


def _job_teams(connection: Connection, project_id: int) -> dict[str, str]:
    rows = connection.execute(
        select(_jobs.c.name, _jobs.c.labels).where(_jobs.c.project_id == project_id)
    )
    return {
        row.name: str(row.labels["team"])
        for row in rows
        if isinstance(row.labels, dict) and row.labels.get("team")
    }
