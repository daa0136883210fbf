"""A day of realistic fleet data for the storage benchmarks, generated with numpy, and the
ways to load it: into the built-in store (``SampleWriter``, the collectors' path) and into
VictoriaMetrics (``/api/v1/import``), plus what each then takes on disk.

Two shapes (``DATASETS``):

* **dcgm**: dcgm-exporter as it scrapes 100 GPUs (8 a host) every 15 s: 10 of its default
  fields x 100 GPUs = 1,000 series, 5,760 samples each a day. Labels and formats are
  dcgm-exporter's (``/work/shared/fixtures/dcgm-exporter``): integer utilizations, clocks,
  temperatures and MiB; power in W with NVML's milliwatt precision, slowly varying; the energy
  counter in mJ, monotonic; the tensor pipe ratio printed with six decimals. Each host runs
  jobs for hours then idles, so the GPUs move between a busy and an idle level together; every
  host is scraped at its own offset in the 15 s with a few ms of jitter, times in us.
* **steps**: the step-timing series the OTLP receiver writes from a job's step and phase spans
  (``collector/otlp/traces.py``): for 8 jobs x 8 ranks, step duration, the five phases,
  samples/s, tokens/s and the step number, stamped at the step's end (us), durations from
  nanosecond span times; jobs step every 4 to 30 s, ranks of a job end a step within a
  fraction of a millisecond. 576 series, about 5.4 million samples a day.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
import numpy as np
from sqlalchemy import Engine, text

from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter
from tuneloop.storage.types import from_micros, to_micros

START = datetime(2026, 11, 2, tzinfo=UTC)
HOUR_US = 3_600_000_000
GPUS_PER_HOST = 8


@dataclass(frozen=True, slots=True)
class Series:
    metric: str
    labels: dict[str, str]
    kind: SeriesKind
    values: np.ndarray


@dataclass(frozen=True, slots=True)
class Group:
    """Series sampled at the same instants: one host's scrape, one rank's steps."""

    stamps_us: np.ndarray
    series: list[Series]


@dataclass(frozen=True, slots=True)
class Dataset:
    name: str
    start: datetime
    end: datetime
    groups: list[Group]

    @property
    def series(self) -> int:
        return sum(len(group.series) for group in self.groups)

    @property
    def samples(self) -> int:
        return sum(len(group.stamps_us) * len(group.series) for group in self.groups)


def _busy(rng: np.random.Generator, n: int, step_s: float) -> np.ndarray:
    """Whether a host runs a job at each of ``n`` ticks: busy spells of 1-8 h, idle ones of
    10 min-2 h, busy about 80% of the time."""
    out = np.zeros(n, dtype=bool)
    at, busy = 0, bool(rng.random() < 0.8)
    while at < n:
        hours = rng.uniform(1, 8) if busy else rng.uniform(1 / 6, 2)
        length = max(1, int(hours * 3600 / step_s))
        out[at : at + length] = busy
        at, busy = at + length, not busy
    return out


def _smooth(rng: np.random.Generator, target: np.ndarray, keep: float, noise: float) -> np.ndarray:
    """An AR(1) walk that follows ``target`` (a sensor's thermal or electrical inertia)."""
    out = np.empty_like(target, dtype=np.float64)
    level = float(target[0])
    shocks = rng.normal(0.0, noise, len(target))
    for i, (goal, shock) in enumerate(zip(target.tolist(), shocks.tolist(), strict=True)):
        level = keep * level + (1 - keep) * goal + shock
        out[i] = level
    return out


def dcgm_day(gpus: int = 100, hours: float = 24.0, step_s: int = 15, seed: int = 7) -> Dataset:
    rng = np.random.default_rng(seed)
    n = int(hours * 3600 // step_s)
    start_us = to_micros(START)
    groups = []
    for host in range(math.ceil(gpus / GPUS_PER_HOST)):
        offset = int(rng.integers(0, step_s * 1_000_000))
        jitter = rng.integers(0, 3_000, n)
        stamps = start_us + offset + np.arange(n, dtype=np.int64) * step_s * 1_000_000 + jitter
        busy = _busy(rng, n, step_s)
        series = []
        for gpu in range(host * GPUS_PER_HOST, min(gpus, (host + 1) * GPUS_PER_HOST)):
            labels = {
                "gpu": str(gpu % GPUS_PER_HOST),
                "UUID": f"GPU-{rng.bytes(16).hex()}",
                "pci_bus_id": f"00000000:{0x18 + 0x10 * (gpu % GPUS_PER_HOST):02X}:00.0",
                "device": f"nvidia{gpu % GPUS_PER_HOST}",
                "modelName": "NVIDIA H100 80GB HBM3",
                "Hostname": f"gpu-node-{host:03d}",
                "DCGM_FI_DRIVER_VERSION": "550.90.07",
                "container": "trainer",
                "namespace": "training",
                "pod": f"llm-pretrain-worker-{host}",
            }
            series += [
                Series(metric, labels, kind, values)
                for metric, kind, values in _gpu_fields(rng, busy, step_s)
            ]
        groups.append(Group(stamps, series))
    end = START + timedelta(hours=hours)
    return Dataset("dcgm", START, end, groups)


def _gpu_fields(
    rng: np.random.Generator, busy: np.ndarray, step_s: int
) -> list[tuple[str, SeriesKind, np.ndarray]]:
    n = len(busy)
    gauge, counter = SeriesKind.GAUGE, SeriesKind.COUNTER
    util = np.where(busy, np.clip(np.rint(rng.normal(97, 2.5, n)), 0, 100), 0.0)
    copy_util = np.where(busy, np.clip(np.rint(rng.normal(38, 6, n)), 0, 100), 0.0)
    temp = np.rint(_smooth(rng, np.where(busy, 66.0, 33.0), 0.97, 0.4))
    memory_temp = np.rint(_smooth(rng, np.where(busy, 72.0, 35.0), 0.98, 0.3))
    watts = _smooth(rng, np.where(busy, 640.0, 71.0), 0.9, 6.0)
    power = np.round(np.clip(watts, 60.0, 700.0), 3)  # NVML reports milliwatts
    energy = float(rng.integers(10**11, 10**12)) + np.cumsum(np.rint(power * step_s * 1000))
    throttled = rng.random(n) < 0.03
    clock = np.where(busy, np.where(throttled, 1755.0, 1980.0), 345.0)
    fb_used = np.where(busy, 71_234.0 + 64 * rng.integers(0, 4, n), 1.0)
    xid = np.zeros(n)
    tensor = np.where(busy, np.round(np.clip(rng.normal(0.46, 0.04, n), 0, 1), 6), 0.0)
    return [
        ("DCGM_FI_DEV_GPU_UTIL", gauge, util),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", gauge, copy_util),
        ("DCGM_FI_DEV_GPU_TEMP", gauge, temp),
        ("DCGM_FI_DEV_MEMORY_TEMP", gauge, memory_temp),
        ("DCGM_FI_DEV_POWER_USAGE", gauge, power),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", counter, energy),
        ("DCGM_FI_DEV_SM_CLOCK", gauge, clock),
        ("DCGM_FI_DEV_FB_USED", gauge, fb_used),
        ("DCGM_FI_DEV_XID_ERRORS", gauge, xid),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", gauge, tensor),
    ]


PHASE_SHARES = {
    "data_loading": 0.04,
    "forward": 0.30,
    "backward": 0.52,
    "grad_sync": 0.10,
    "optimizer": 0.04,
}
STEP_PERIODS_S = (4, 6, 8, 10, 12, 15, 20, 30)
BATCH_SAMPLES = 8 * 32
"""The ``tuneloop.samples`` of a step (8 GPUs x 32); ``tuneloop.tokens`` at 4,096 a sample."""
BATCH_TOKENS = BATCH_SAMPLES * 4096


def steps_day(jobs: int = 8, ranks: int = 8, hours: float = 24.0, seed: int = 11) -> Dataset:
    rng = np.random.default_rng(seed)
    start_ns = to_micros(START) * 1000
    span_ns = int(hours * 3600e9)
    groups = []
    for job in range(jobs):
        period = STEP_PERIODS_S[job % len(STEP_PERIODS_S)]
        n = int(span_ns / (period * 1e9))
        # A step's duration: a few % of noise, and now and then a slow one (a checkpoint).
        base = period * 1e9 * rng.lognormal(0.0, 0.03, n) * np.where(rng.random(n) < 0.01, 3, 1)
        first_step = int(rng.integers(1_000, 100_000))
        job_end_ns = start_ns + np.cumsum(base).astype(np.int64)
        for rank in range(ranks):
            # Ranks end a step together (they wait on one another), a fraction of a ms apart.
            end_ns = job_end_ns + rng.integers(0, 500_000, n)
            end_ns = end_ns[end_ns < start_ns + span_ns]
            duration_ns = np.rint(base * rng.normal(1.0, 0.002, n))
            m = len(end_ns)
            seconds = duration_ns[:m] / 1e9
            labels = {"job": f"llm-pretrain-{job}", "rank": str(rank)}
            series = [
                Series("tuneloop_step_duration_seconds", labels, SeriesKind.GAUGE, seconds),
                Series(
                    "tuneloop_step_number",
                    labels,
                    SeriesKind.GAUGE,
                    np.arange(first_step, first_step + m, dtype=np.float64),
                ),
                Series(
                    "tuneloop_samples_per_second", labels, SeriesKind.GAUGE, BATCH_SAMPLES / seconds
                ),
                Series(
                    "tuneloop_tokens_per_second", labels, SeriesKind.GAUGE, BATCH_TOKENS / seconds
                ),
            ]
            for phase, share in PHASE_SHARES.items():
                phase_ns = np.rint(duration_ns[:m] * share * rng.normal(1.0, 0.05, m))
                series.append(
                    Series(
                        "tuneloop_step_phase_seconds",
                        {**labels, "phase": phase},
                        SeriesKind.GAUGE,
                        phase_ns / 1e9,
                    )
                )
            groups.append(Group(end_ns // 1000, series))
    return Dataset("steps", START, START + timedelta(hours=hours), groups)


DATASETS: dict[str, Callable[[float], Dataset]] = {
    "dcgm": lambda hours: dcgm_day(hours=hours),
    "steps": lambda hours: steps_day(hours=hours),
}


# --------------------------------------------------------------------------- loading


def writes(data: Dataset, span_us: int = HOUR_US) -> Iterator[list[SeriesBatch]]:
    """The dataset cut in time into writes of ``span_us`` of every series, oldest first: a
    collector that writes an hour at a time (the store's own batching is not measured here)."""
    first = to_micros(data.start)
    for window in range(first, to_micros(data.end) + span_us, span_us):
        batches = []
        for group in data.groups:
            lo, hi = np.searchsorted(group.stamps_us, [window, window + span_us])
            if lo == hi:
                continue
            stamps = [from_micros(stamp) for stamp in group.stamps_us[lo:hi].tolist()]
            batches += [
                SeriesBatch(s.metric, s.labels, stamps, s.values[lo:hi].tolist(), s.kind)
                for s in group.series
            ]
        if batches:
            yield batches


def load_store(engine: Engine, data: Dataset, project_id: int) -> None:
    writer = SampleWriter(engine)
    for batches in writes(data):
        result = writer.write(project_id, batches)
        assert not result.rejected, result.rejected[:3]


def import_victoria_metrics(url: str, data: Dataset) -> None:
    """Every series as one JSON line of ``/api/v1/import`` (times in ms, as VictoriaMetrics
    keeps them), 100 series a request."""
    lines = []
    for group in data.groups:
        millis = (group.stamps_us // 1000).tolist()
        for s in group.series:
            metric = {"__name__": s.metric, **s.labels}
            lines.append(
                json.dumps({"metric": metric, "values": s.values.tolist(), "timestamps": millis})
            )
    with httpx.Client(timeout=300) as client:
        for at in range(0, len(lines), 100):
            body = "\n".join(lines[at : at + 100]).encode()
            client.post(f"{url}/api/v1/import", content=body).raise_for_status()


# --------------------------------------------------------------------------- disk


def table_sizes(engine: Engine) -> dict[str, int]:
    """Bytes per table, indexes and (PostgreSQL) TOAST and partitions counted with it."""
    with engine.connect() as connection:
        if engine.dialect.name == "sqlite":
            rows = connection.execute(
                text(
                    "SELECT coalesce(m.tbl_name, d.name), sum(d.pgsize) FROM dbstat AS d"
                    " LEFT JOIN sqlite_master AS m ON m.name = d.name GROUP BY 1"
                )
            )
        else:
            rows = connection.execute(
                text(
                    "SELECT coalesce(pg_partition_root(c.oid), c.oid)::regclass::text,"
                    " sum(pg_total_relation_size(c.oid))"
                    " FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace"
                    " WHERE n.nspname = 'public' AND c.relkind = 'r' GROUP BY 1"
                )
            )
        return {str(name): int(size) for name, size in rows}


def vacuum(engine: Engine, *, full: bool) -> None:
    """Reclaim what deleted rows held: SQLite rebuilds the file; PostgreSQL ``VACUUM``
    (trailing empty pages only) or ``VACUUM FULL`` (the live rows alone)."""
    if engine.dialect.name == "sqlite":
        raw = engine.raw_connection()
        try:
            raw.driver_connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # type: ignore[union-attr]
            raw.driver_connection.execute("VACUUM")  # type: ignore[union-attr]
        finally:
            raw.close()
        return
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM FULL" if full else "VACUUM"))
