"""Chunk encoding and compaction speed: what a compacted hour of a series costs, and how fast
``compact`` turns raw rows into chunks.

1. Encoding. The same hour-long chunks of dcgm-exporter-like series (240 samples 15 s apart
   with up to 900 ms of jitter; kinds: integer utilization, temperature, a noisy full-precision
   power reading, an energy counter, clocks) encoded two ways, on PostgreSQL, as bytes on disk
   per sample (``pg_total_relation_size`` after ``VACUUM``, table, TOAST and primary key):
   ``sample_chunks`` with pcodec blobs (what the store writes: one-hour chunks, and chunks
   widened to ``chunk_min_samples``, here a day), and the alternative the issue
   names, the timestamps and values as ``int8[]`` / ``float8[]`` columns compressed by lz4 in
   TOAST. Also pcodec's own bytes per sample, per kind.
2. Compaction speed, on PostgreSQL and SQLite: samples written through ``SampleWriter``, then
   ``compact`` timed; repeated, the two databases interleaved; medians with 95% bootstrap
   intervals, and the ratio against writing the same samples (the write path, the baseline
   measured in the same runs).

Run (scratch PostgreSQL database and SQLite file, removed afterwards)::

    python bench/chunk_encoding.py                           # 200 series x 4 h, 5 rounds
    python bench/chunk_encoding.py --series 20 --rounds 2    # a smoke run
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from sqlalchemy import Engine, text

sys.path.insert(0, str(Path(__file__).parent))
from storage_write import DEFAULT_URL, new_project, scratch_database

from tuneloop.settings import get_settings
from tuneloop.storage import make_engine
from tuneloop.storage.models import metadata
from tuneloop.storage.timeseries.chunk_codec import encode_chunk
from tuneloop.storage.timeseries.compaction import compact
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter

START = datetime(2026, 11, 1, tzinfo=UTC)
PER_HOUR = 240
KINDS = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_SM_CLOCK",
)


def series_values(kind: str, count: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "DCGM_FI_DEV_GPU_UTIL":
        return np.clip(np.cumsum(rng.integers(-5, 6, count)) + 60, 0, 100).astype(float)
    if kind == "DCGM_FI_DEV_GPU_TEMP":
        return (np.cumsum(rng.integers(-1, 2, count)) + 55).astype(float)
    if kind == "DCGM_FI_DEV_POWER_USAGE":
        return rng.normal(420.0, 35.0, count)
    if kind == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION":
        return np.cumsum(rng.integers(5_000_000, 7_000_000, count)).astype(float)
    return (1980 - 15 * rng.integers(0, 3, count)).astype(float)


def fleet(series: int, hours: int, seed: int = 18) -> list[SeriesBatch]:
    rng = np.random.default_rng(seed)
    count = hours * PER_HOUR
    batches = []
    for number in range(series):
        kind = KINDS[number % len(KINDS)]
        jitter = rng.integers(0, 900, count) * 1000  # collectors stamp milliseconds
        micros = np.arange(count) * 15_000_000 + jitter
        times = [START + timedelta(microseconds=int(us)) for us in micros]
        labels = {"gpu": str(number // len(KINDS)), "Hostname": "node-1"}
        is_counter = kind.endswith("CONSUMPTION")
        batches.append(
            SeriesBatch(
                kind,
                labels,
                times,
                series_values(kind, count, rng).tolist(),
                SeriesKind.COUNTER if is_counter else SeriesKind.GAUGE,
            )
        )
    return batches


def interval(values: Sequence[float], seed: int = 1) -> tuple[float, float, float]:
    """Median and its 95% bootstrap interval."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(2000))
    return statistics.median(values), medians[49], medians[1949]


# ---------------------------------------------------------------------- encoding


def codec_bytes(batches: list[SeriesBatch]) -> dict[str, tuple[float, float]]:
    """Per kind: pcodec bytes per sample of the timestamps and of the values, hour by hour."""
    out: dict[str, list[tuple[int, int, int]]] = {}
    for batch in batches:
        micros = np.array([int(t.timestamp() * 1_000_000) for t in batch.timestamps])
        values = np.array(batch.values)
        for hour in range(0, len(values), PER_HOUR):
            ts_blob, values_blob = encode_chunk(
                micros[hour : hour + PER_HOUR], values[hour : hour + PER_HOUR]
            )
            out.setdefault(batch.metric, []).append((len(ts_blob), len(values_blob), PER_HOUR))
    return {
        kind: (
            sum(r[0] for r in rows) / sum(r[2] for r in rows),
            sum(r[1] for r in rows) / sum(r[2] for r in rows),
        )
        for kind, rows in out.items()
    }


ARRAYS_DDL = """
CREATE TABLE chunk_arrays (
    series_id bigint NOT NULL, start_ts timestamptz NOT NULL,
    ts int8[] NOT NULL, vals float8[] NOT NULL, PRIMARY KEY (series_id, start_ts)
);
ALTER TABLE chunk_arrays ALTER COLUMN ts SET COMPRESSION lz4;
ALTER TABLE chunk_arrays ALTER COLUMN vals SET COMPRESSION lz4;
"""
# The same chunks as arrays, built in SQL from the raw rows before compaction.
ARRAYS_FILL = """
INSERT INTO chunk_arrays
SELECT series_id, date_bin('1 hour', ts, 'epoch'::timestamptz),
       array_agg((extract(epoch FROM ts) * 1000000)::int8 ORDER BY ts),
       array_agg(value ORDER BY ts)
FROM samples GROUP BY 1, 2
"""
SIZE = """
SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class AS c
WHERE c.relkind = 'r' AND (c.relname = :name OR c.relname LIKE :prefix)
"""


def encoding_on_postgres(
    url: str, batches: list[SeriesBatch], samples: int, min_samples: int
) -> dict[str, float]:
    """Bytes per sample of ``sample_chunks`` compacted with ``min_samples`` (1: one-hour
    chunks; the default: widened, here one chunk per series and day) and of ``chunk_arrays``."""
    with scratch_database(url) as scratch:
        engine = make_engine(scratch)
        metadata.create_all(engine)
        SampleWriter(engine).write(new_project(engine, "bench"), batches)
        with engine.begin() as connection:
            connection.exec_driver_sql(ARRAYS_DDL)
            connection.execute(text(ARRAYS_FILL))
        compact(
            engine,
            hot_window=timedelta(0),
            now=START + timedelta(days=2),
            after_rollups=False,
            min_samples=min_samples,
        )
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.execute(text("VACUUM"))
            sizes = {
                name: connection.execute(
                    text(SIZE), {"name": name, "prefix": f"{name}_p%"}
                ).scalar_one()
                / samples
                for name in ("sample_chunks", "chunk_arrays")
            }
        engine.dispose()
    return sizes


# ---------------------------------------------------------------------- speed


def one_round(engine: Engine, batches: list[SeriesBatch], samples: int) -> tuple[float, float]:
    """(write samples/s, compaction samples/s) on a store emptied first."""
    with engine.begin() as connection:
        connection.execute(text("DELETE FROM sample_chunks"))
        connection.execute(text("DELETE FROM samples"))
    writer = SampleWriter(engine)
    project = new_project(engine, f"p{time.monotonic_ns()}")
    started = time.perf_counter()
    writer.write(project, batches)
    wrote = time.perf_counter() - started
    report = compact(
        engine, hot_window=timedelta(0), now=START + timedelta(days=2), after_rollups=False
    )
    assert report.samples_compacted == samples, report
    return samples / wrote, samples / report.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=200)
    parser.add_argument("--hours", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--url", default=os.environ.get("TUNELOOP_BENCH_POSTGRES_URL", DEFAULT_URL))
    args = parser.parse_args()
    batches = fleet(args.series, args.hours)
    samples = args.series * args.hours * PER_HOUR
    print(f"load: {os.getloadavg()}; {args.series} series x {args.hours} h = {samples} samples")

    print("\npcodec bytes per sample, by kind (timestamps, values):")
    for kind, (ts, values) in codec_bytes(batches).items():
        print(f"  {kind:40s} {ts:5.2f} {values:5.2f}  total {ts + values:5.2f}")
    print("\nPostgreSQL bytes on disk per sample (table + TOAST + primary key, after VACUUM):")
    least = get_settings().chunk_min_samples
    for label, min_samples in (("one-hour chunks", 1), (f"chunk_min_samples={least}", least)):
        for name, size in encoding_on_postgres(args.url, batches, samples, min_samples).items():
            print(f"  {name:15s} {size:6.2f}  ({label})")

    speeds: dict[str, dict[str, list[float]]] = {"postgresql": {}, "sqlite": {}}
    with scratch_database(args.url) as scratch, tempfile.TemporaryDirectory() as folder:
        engines = {
            "postgresql": make_engine(scratch),
            "sqlite": make_engine(f"sqlite:///{folder}/bench.db"),
        }
        for engine in engines.values():
            metadata.create_all(engine)
        for number in range(args.rounds):
            for name, engine in engines.items():  # interleaved
                write_rate, compact_rate = one_round(engine, batches, samples)
                speeds[name].setdefault("write", []).append(write_rate)
                speeds[name].setdefault("compact", []).append(compact_rate)
                print(
                    f"round {number + 1} {name}: write {write_rate:,.0f}/s"
                    f" compact {compact_rate:,.0f}/s"
                )
        for engine in engines.values():
            engine.dispose()
    print(f"\nload: {os.getloadavg()}")
    print("\nsamples/s, median [95% interval]; ratio = compaction / write of the same samples")
    for name, runs in speeds.items():
        wrote, compacted = interval(runs["write"]), interval(runs["compact"])  # (median, low, high)
        ratios = interval([c / w for c, w in zip(runs["compact"], runs["write"], strict=True)])
        print(
            f"  {name:10s} compact {compacted[0]:,.0f} [{compacted[1]:,.0f}, {compacted[2]:,.0f}]"
            f"  write {wrote[0]:,.0f} [{wrote[1]:,.0f}, {wrote[2]:,.0f}]"
            f"  ratio {ratios[0]:.2f} [{ratios[1]:.2f}, {ratios[2]:.2f}]"
        )


if __name__ == "__main__":
    main()
