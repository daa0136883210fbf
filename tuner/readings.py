"""What the tuning loop reads from the time-series store to measure a trial.

Series (docs/step-timing.md; each labelled ``job`` and ``rank``):

- ``tuneloop_samples_per_second``: one point per step and rank. The job's throughput is the
  per-rank mean times the number of ranks seen (data-parallel ranks step in lockstep).
- ``tuneloop_step_duration_seconds``: seconds per step (the ``step_time`` objective).
- ``tuneloop_gradient_noise_scale``: the gradient noise scale phi the job's agent estimates
  (gauge; the goodput objective's statistical efficiency).
- ``tuneloop_request_duration_seconds``: a latency histogram (``_bucket{le}`` counters) of an
  inference service, for the P99 of ``slo_throughput``.
- ``DCGM_FI_DEV_FB_USED`` / ``DCGM_FI_DEV_FB_FREE`` (MiB, dcgm-exporter's names, from the
  collector's DCGM/NVML sources or a scraped dcgm-exporter): the framebuffer of the job's GPUs,
  for the memory bound (:func:`gpu_memory`, which says which GPUs are the job's).
- ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (mJ since the driver loaded, a counter): the energy of
  the job's GPUs, the same GPUs, for the per-joule objectives (:func:`gpu_power`).
- ``tuneloop_tokens_per_second``: tokens per second and rank (``tokens_per_joule``).

Reads go through the time-series contract (``query_range`` with per-second buckets,
``find_series``, ``histogram_quantile``), so the store and a Prometheus-compatible TSDB serve them
alike; the GPUs agents registered are read from the database. Nothing here decides anything.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import Connection, Engine, select

from tuneloop import cost
from tuneloop.step_timing import SAMPLES_PER_SECOND, STEP_DURATION, TOKENS_PER_SECOND
from tuneloop.storage.models import JobGpu
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.timeseries.query import TooManySeries
from tuneloop.storage.timeseries.raw import RawSeries
from tuneloop.storage.timeseries.types import Aggregation, Matcher, MatchOp, RangeSeries
from tuner.measurement import Sample

Bind = Engine | Connection

THROUGHPUT_METRIC: Final = SAMPLES_PER_SECOND
TOKENS_METRIC: Final = TOKENS_PER_SECOND
PER_JOB_METRICS: Final = (THROUGHPUT_METRIC, TOKENS_METRIC)
"""Per-rank rates a job's throughput sums over its ranks."""
STEP_TIME_METRIC: Final = STEP_DURATION
NOISE_SCALE_METRIC: Final = "tuneloop_gradient_noise_scale"
LATENCY_HISTOGRAM: Final = "tuneloop_request_duration_seconds"
RANK_LABEL: Final = "rank"
FB_USED_METRIC: Final = "DCGM_FI_DEV_FB_USED"
FB_FREE_METRIC: Final = "DCGM_FI_DEV_FB_FREE"
JOB_LABEL: Final = "job"
UUID_LABEL: Final = "UUID"
"""dcgm-exporter's GPU UUID label (``collector/sources/gpu_labels.py``)."""
GPU_UUIDS_JOB_LABEL: Final = "gpu_uuids"
"""Job label (``Job.labels``) in which a job's agent registers its GPUs' UUIDs,
comma-separated."""
_ONE_SECOND: Final = timedelta(seconds=1)
MAX_POINTS: Final = 2_000
"""Buckets per window at most: enough for batch means, few enough to read every tick."""


def primary_metric(objective: str) -> str:
    """The step-timing series a trial of ``objective`` is judged on."""
    if objective == "step_time":
        return STEP_TIME_METRIC
    return TOKENS_METRIC if objective == "tokens_per_joule" else THROUGHPUT_METRIC


def job_matchers(job_name: str) -> list[Matcher]:
    return [Matcher("job", MatchOp.EQ, job_name)]


def has_series(series: TimeSeriesBackend, project_id: int, job_name: str, metric: str) -> bool:
    try:
        matchers = job_matchers(job_name)
        return bool(series.find_series(project_id, metric, matchers, max_series=1))
    except TooManySeries:  # more than one: there is data
        return True


def rank_count(series: TimeSeriesBackend, project_id: int, job_name: str) -> int:
    """Distinct ranks with throughput series (0 when the job has none)."""
    found = series.find_series(project_id, THROUGHPUT_METRIC, job_matchers(job_name))
    return len({info.labels.get(RANK_LABEL, "0") for info in found})


def bucket_step_s(start: datetime, end: datetime) -> int:
    return max(1, math.ceil((end - start).total_seconds() / MAX_POINTS))


def window_samples(
    series: TimeSeriesBackend,
    project_id: int,
    job_name: str,
    metric: str,
    *,
    start: datetime,
    end: datetime,
    per_job: bool,
) -> list[Sample]:
    """One :class:`Sample` per bucket of ``[start, end)``: the mean over ranks of each rank's
    bucket mean, times the ranks seen in the window when ``per_job`` (a throughput), else as
    is (a step time). Sample times are bucket starts in epoch seconds."""
    if end <= start:
        return []
    step_s = bucket_step_s(start, end)
    found = series.query_range(
        project_id,
        metric,
        job_matchers(job_name),
        start=start,
        end=end,
        step_s=step_s,
        aggregation=Aggregation.AVG,
    )
    ranks = {one.series.labels.get(RANK_LABEL, "0") for one in found}
    by_bucket: dict[datetime, list[float]] = defaultdict(list)
    for one in found:
        for ts, value in one.points:
            by_bucket[ts].append(value)
    scale = float(len(ranks)) if per_job else 1.0
    return [
        # The bucket's end: a sample is only as fresh as the last step it may hold.
        Sample(ts.timestamp() + step_s, scale * sum(values) / len(values))
        for ts, values in sorted(by_bucket.items())
    ]


def window_mean(
    series: TimeSeriesBackend,
    project_id: int,
    job_name: str,
    metric: str,
    *,
    start: datetime,
    end: datetime,
) -> float | None:
    """Mean of every sample of the job's ``metric`` series in ``[start, end)``, or ``None``."""
    points = window_samples(
        series, project_id, job_name, metric, start=start, end=end, per_job=False
    )
    values = [s.value for s in points if math.isfinite(s.value)]
    return sum(values) / len(values) if values else None


def latency_quantile(
    series: TimeSeriesBackend,
    project_id: int,
    job_name: str,
    q: float,
    *,
    start: datetime,
    end: datetime,
) -> float | None:
    """The ``q``-quantile of the requests observed in ``[start, end)`` (whole seconds, ending
    at the bucket holding ``end``), all label sets of the job pooled; ``None`` without data."""
    window_s = max(1, math.ceil((end - start).total_seconds()))
    groups = series.histogram_quantile(
        project_id,
        q,
        LATENCY_HISTOGRAM,
        job_matchers(job_name),
        start=end.replace(microsecond=0),
        end=end.replace(microsecond=0) + _ONE_SECOND,
        step_s=1,
        window_s=window_s,
    )
    values = _finite_last_points(groups_points=[g.points for g in groups])
    # Several label sets (instances): the worst one decides whether the SLO holds.
    return max(values) if values else None


def _finite_last_points(groups_points: Sequence[Sequence[tuple[datetime, float]]]) -> list[float]:
    return [points[-1][1] for points in groups_points if points and math.isfinite(points[-1][1])]


# --------------------------------------------------------------------------- GPU memory


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """Framebuffer use of a job's GPUs over a window. ``peak_mib``: the highest
    ``DCGM_FI_DEV_FB_USED`` of any of them; ``capacity_mib``: the smallest used + free among
    them (the most loaded and the smallest device bound the batch); ``gpus``: the figures of
    each (its identifying labels, ``peak_mib``, ``capacity_mib``)."""

    peak_mib: float
    capacity_mib: float
    gpus: tuple[dict[str, Any], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "peak_mib": self.peak_mib,
            "capacity_mib": self.capacity_mib,
            "gpus": [dict(g) for g in self.gpus],
        }


def job_gpu_uuids(labels: dict[str, Any] | None, registered: Iterable[str] = ()) -> tuple[str, ...]:
    """The job's GPU UUIDs: those in its :data:`GPU_UUIDS_JOB_LABEL` label, then those its
    agent registered (``job_gpus``, :func:`registered_gpu_uuids`), each once."""
    raw = str((labels or {}).get(GPU_UUIDS_JOB_LABEL) or "")
    listed = (u.strip() for u in raw.split(",") if u.strip())
    return tuple(dict.fromkeys([*listed, *registered]))


def registered_gpu_uuids(bind: Bind, job_id: int) -> tuple[str, ...]:
    """The GPU UUIDs the ranks of the job's agents registered, in registration order."""
    query = select(JobGpu.gpu_uuid).where(JobGpu.job_id == job_id).order_by(JobGpu.id)
    if isinstance(bind, Engine):
        with bind.connect() as connection:
            return tuple(dict.fromkeys(connection.scalars(query)))
    return tuple(dict.fromkeys(bind.scalars(query)))


def job_gpu_selectors(job_name: str, gpu_uuids: Iterable[str]) -> list[list[Matcher]]:
    """Which GPU series are the job's: those carrying its ``job`` label (relabel rules, the
    exporter's pod mapping), and those whose ``UUID`` is one of ``gpu_uuids``."""
    selectors = [[Matcher(JOB_LABEL, MatchOp.EQ, job_name)]]
    selectors += [[Matcher(UUID_LABEL, MatchOp.EQ, uuid)] for uuid in gpu_uuids]
    return selectors


def gpu_memory(
    series: TimeSeriesBackend,
    project_id: int,
    job_name: str,
    gpu_uuids: Iterable[str] = (),
    *,
    start: datetime,
    end: datetime,
) -> GpuMemory | None:
    """Framebuffer use in ``[start, end)`` of the job's GPUs, or ``None`` when none reported.

    The job's GPUs are those whose framebuffer series carry the job's label
    (``job="<name>"``, the label its step timings carry, put on GPU series by relabel rules or
    the exporter's pod mapping), plus those whose ``UUID`` label is one of ``gpu_uuids`` (the
    job's :data:`GPU_UUIDS_JOB_LABEL`). One bucket spans the window: its maximum and mean are
    the same whichever source (raw samples or rollups) the store serves them from."""
    if end <= start:
        return None
    selectors = job_gpu_selectors(job_name, gpu_uuids)
    peak: dict[frozenset[tuple[str, str]], float] = {}
    used: dict[frozenset[tuple[str, str]], dict[datetime, float]] = {}
    free: dict[frozenset[tuple[str, str]], dict[datetime, float]] = {}
    step_s = max(1, math.ceil((end - start).total_seconds()))

    def read(metric: str, aggregation: Aggregation) -> list[RangeSeries]:
        found: dict[int, RangeSeries] = {}
        for matchers in selectors:
            for one in series.query_range(
                project_id,
                metric,
                matchers,
                start=start,
                end=end,
                step_s=step_s,
                aggregation=aggregation,
            ):
                found[one.series.id] = one  # a GPU matched by both rules counts once
        return list(found.values())

    for one in read(FB_USED_METRIC, Aggregation.MAX):
        values = [v for _, v in one.points if math.isfinite(v)]
        if values:
            peak[_device(one)] = max(values)
    for target, metric in ((used, FB_USED_METRIC), (free, FB_FREE_METRIC)):
        for one in read(metric, Aggregation.AVG):
            target[_device(one)] = {t: v for t, v in one.points if math.isfinite(v)}
    gpus: list[dict[str, Any]] = []
    for device, top in sorted(peak.items(), key=lambda item: sorted(item[0])):
        # used + free is the device's framebuffer (less what the driver reserves), bucket by
        # bucket: both gauges come from the same collection.
        both = used.get(device, {}).keys() & free.get(device, {}).keys()
        if not both:
            continue
        capacity = min(used[device][t] + free[device][t] for t in both)
        gpus.append({**dict(sorted(device)), "peak_mib": top, "capacity_mib": capacity})
    if not gpus:
        return None
    return GpuMemory(
        peak_mib=max(g["peak_mib"] for g in gpus),
        capacity_mib=min(g["capacity_mib"] for g in gpus),
        gpus=tuple(gpus),
    )


_IDENTITY_LABELS: Final = ("Hostname", UUID_LABEL, "gpu", "GPU_I_ID")


def _device(series: RangeSeries) -> frozenset[tuple[str, str]]:
    """A GPU (or MIG instance) by the labels that identify it, so that its used and free
    series pair up whatever else (the job label, attributes) they carry."""
    labels = series.series.labels
    return frozenset((k, labels[k]) for k in _IDENTITY_LABELS if k in labels)


# --------------------------------------------------------------------------- GPU energy


@dataclass(frozen=True, slots=True)
class GpuPower:
    """The mean power of a job's GPUs over a window, from their energy counters.

    ``watts``: the sum over the GPUs of each one's energy increase over the time between its
    first and last sample in the window (a MIG instance counts its share, as in cost
    accounting); ``joules``: ``watts`` times the window, what the job's GPUs drew in it;
    ``gpus``: each GPU's identifying labels, ``joules`` and ``seconds`` measured."""

    watts: float
    joules: float
    gpus: tuple[dict[str, Any], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"watts": self.watts, "joules": self.joules, "gpus": [dict(g) for g in self.gpus]}


def gpu_power(
    series: TimeSeriesBackend,
    project_id: int,
    job_name: str,
    gpu_uuids: Iterable[str] = (),
    *,
    start: datetime,
    end: datetime,
) -> GpuPower | None:
    """The job's GPUs' mean power in ``(start, end]`` (the GPUs of :func:`job_gpu_selectors`),
    or ``None`` when none has two energy samples in it. Read as raw samples, so the figure is
    the same whether the store or a TSDB keeps them; a decrease is a counter reset
    (:func:`tuneloop.cost.counter_growth`)."""
    if end <= start:
        return None
    start_ms = int(start.timestamp() * 1000)
    end_ms = int(end.timestamp() * 1000)
    name = Matcher("__name__", MatchOp.EQ, cost.ENERGY_METRIC)
    found: dict[tuple[tuple[str, str], ...], RawSeries] = {}
    for matchers in job_gpu_selectors(job_name, gpu_uuids):
        for one in series.read_raw(project_id, [name, *matchers], start_ms, end_ms):
            found[cost.labels_key(one.labels)] = one  # a GPU matched by both rules counts once
    shares = cost.mig_shares(one.labels for one in found.values())
    gpus: list[dict[str, Any]] = []
    watts = 0.0
    for key, one in sorted(found.items()):
        values = [float(v) for v in one.values if math.isfinite(v)]
        seconds = (int(one.times_ms[-1]) - int(one.times_ms[0])) / 1000.0
        if len(values) < 2 or seconds <= 0:
            continue
        millijoules = cost.mig_share(cost.counter_growth(values), shares, one.labels)
        identity = {k: v for k, v in key if k in _IDENTITY_LABELS}
        gpus.append({**identity, "joules": millijoules / 1000.0, "seconds": seconds})
        watts += millijoules / 1000.0 / seconds
    if not gpus:
        return None
    window_s = (end - start).total_seconds()
    return GpuPower(watts=watts, joules=watts * window_s, gpus=tuple(gpus))
