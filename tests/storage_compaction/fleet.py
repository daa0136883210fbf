"""A small fleet written three hours in the past, and every kind of read of it, so that the
same answers can be compared before and after compaction.

Values are integers (utilization, energy in millijoules, histogram counts) or a full-precision
power reading read back raw only: sums of integers are exact in any order, so the comparison
can be exact whatever order a database adds rows in.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import Engine, func, insert, select

from tuneloop import cost
from tuneloop.storage.models import Project, sample_chunks, samples
from tuneloop.storage.timeseries import functions, query, raw
from tuneloop.storage.timeseries.store_backend import StoreBackend
from tuneloop.storage.timeseries.types import Aggregation, Matcher, MatchOp, SeriesBatch, SeriesKind

T = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
"""Start of the fleet's samples (a fixed past hour)."""
HOURS = 3
NOW = T + timedelta(days=1)
"""What the tests pass as now: every span written is long closed."""
UTIL = cost.UTILIZATION_METRIC
ENERGY = cost.ENERGY_METRIC
POWER = "DCGM_FI_DEV_POWER_USAGE"
LATENCY = "request_seconds_bucket"


def make_project(engine: Engine, name: str = "p") -> int:
    with engine.begin() as connection:
        key = connection.execute(insert(Project).values(name=name)).inserted_primary_key
    assert key is not None
    return int(key[0])


def fleet(start: datetime = T, hours: int = HOURS, seed: int = 7) -> list[SeriesBatch]:
    rng = np.random.default_rng(seed)
    count = hours * 240
    batches = []
    for gpu in ("0", "1"):
        labels = {"Hostname": "h1", "UUID": f"GPU-{gpu}", "gpu": gpu, "modelName": "H100"}
        jitter = rng.integers(0, 900, count)
        times = [
            start + timedelta(seconds=15 * i, milliseconds=int(j)) for i, j in enumerate(jitter)
        ]
        util = rng.integers(0, 101, count).astype(float)
        util[: count // 4] = 0  # an idle stretch
        energy = np.cumsum(rng.integers(1_000, 5_000, count)).astype(float)
        energy[count // 2 :] -= energy[count // 2] - 7  # the counter restarts
        power = rng.normal(300, 20, count)
        batches += [
            SeriesBatch(UTIL, labels, times, util.tolist()),
            SeriesBatch(ENERGY, labels, times, energy.tolist(), SeriesKind.COUNTER),
            SeriesBatch(POWER, labels, times, power.tolist()),
        ]
        for le, share in (("0.1", 1), ("1", 3), ("+Inf", 4)):
            counts = np.cumsum(rng.integers(0, 3, count) * share).astype(float)
            batches.append(
                SeriesBatch(
                    LATENCY, {**labels, "le": le}, times, counts.tolist(), SeriesKind.COUNTER
                )
            )
    return batches


def write(engine: Engine, project: int, batches: list[SeriesBatch]) -> None:
    result = StoreBackend(engine).write(project, batches)
    assert not result.rejected, result.rejected


def counts(engine: Engine) -> tuple[int, int, int]:
    """(raw rows, chunk rows, samples held in chunks)."""
    with engine.connect() as connection:
        rows = connection.execute(select(func.count()).select_from(samples)).scalar_one()
        chunks, held = connection.execute(
            select(func.count(), func.coalesce(func.sum(sample_chunks.c.sample_count), 0))
        ).one()
    return int(rows), int(chunks), int(held)


def every_read(engine: Engine, project: int) -> dict[str, Any]:
    """The answer of every kind of read over the fleet, edges falling inside chunk spans."""
    backend = StoreBackend(engine)
    start, end = T + timedelta(minutes=7, seconds=30), T + timedelta(hours=HOURS, minutes=-13)
    out: dict[str, Any] = {}
    for aggregation in Aggregation:
        q = 0.9 if aggregation is Aggregation.QUANTILE else None
        for step in (60, 300, 3600):
            for rollups in (True, False):
                out[f"range {aggregation.value} {step} {rollups}"] = query.query_range(
                    engine,
                    project,
                    UTIL,
                    start=start,
                    end=end,
                    step_s=step,
                    aggregation=aggregation,
                    q=q,
                    use_rollups=rollups,
                )
    out["latest"] = backend.latest(project, None)
    out["latest since"] = backend.latest(project, None, since=T + timedelta(hours=1))
    out["latest none"] = backend.latest(project, None, since=T + timedelta(hours=HOURS + 1))
    for name in ("rate", "increase"):
        read = getattr(functions, name)
        out[name] = read(engine, project, ENERGY, start=start, end=end, step_s=300, window_s=600)
    out["histogram_quantile"] = backend.histogram_quantile(
        project, 0.9, "request_seconds", start=start, end=end, step_s=300, window_s=600
    )
    start_ms, end_ms = int(start.timestamp() * 1000), int(end.timestamp() * 1000)
    everything = [Matcher("__name__", MatchOp.RE, ".+")]
    with engine.connect() as connection:
        out["raw"] = [
            (s.labels, s.times_ms.tolist(), s.values.view(np.uint64).tolist())
            for s in raw.read(connection, project, everything, start_ms, end_ms)
        ]
        out["count"] = raw.count_samples(connection, project, everything, start_ms, end_ms, 10**7)
        out["count capped"] = raw.count_samples(
            connection, project, everything, start_ms, end_ms, 9
        )
        for label, window in (
            ("all", (None, None)),
            ("inside", (start, end)),
            ("edge", (T + timedelta(hours=HOURS) - timedelta(seconds=20), None)),
            ("after", (T + timedelta(hours=HOURS + 1), None)),
        ):
            out[f"series {label}"] = raw.series_in_range(
                connection, project, [everything], *window, max_series=100
            )
            out[f"names {label}"] = raw.label_names(connection, project, [], *window)
            out[f"values {label}"] = raw.label_values(connection, project, "gpu", [], *window)
    out["cost"] = cost.gpu_usage(engine, project, start, end)
    out["cost from before"] = cost.gpu_usage(engine, project, T - timedelta(hours=1), end)
    return out
