"""Disk per sample: the built-in store on SQLite and on PostgreSQL against VictoriaMetrics
holding the very same samples, written through tuneloop's own paths (``SampleWriter`` into the
store, ``PrometheusBackend`` over remote write into VictoriaMetrics).

Data: dcgm-exporter-like series (bench/storage_write.py's labels) x samples 15 s apart, values
integer-valued random walks as dcgm-exporter's gauges mostly are (utilization %, temperature,
clocks, MiB). Sizes: PostgreSQL, every ``samples`` partition with its indexes plus the ``series``
table (``pg_total_relation_size``) after ``VACUUM``; SQLite, the database file after a WAL
checkpoint and ``VACUUM``; VictoriaMetrics, its ``vm_data_size_bytes`` (data parts, indexes
excluded) after a forced flush and a forced merge. The ratio is the store's bytes per sample /
VictoriaMetrics'. It runs in a scratch database and directories that it removes::

    python bench/bytes_per_sample.py                    # 1,000 series x 1,000 samples
    python bench/bytes_per_sample.py --series 100 --per-series 100   # a smoke run
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy import Engine, text

sys.path.insert(0, str(Path(__file__).parent))
from remote_write import victoria_metrics
from storage_write import DEFAULT_URL, METRICS, new_project, scratch_database

from tuneloop.storage import make_engine
from tuneloop.storage.models import metadata
from tuneloop.storage.prometheus.backend import PrometheusBackend
from tuneloop.storage.timeseries.types import SeriesBatch
from tuneloop.storage.timeseries.writer import SampleWriter

START = datetime(2026, 11, 1, tzinfo=UTC)
STEP = timedelta(seconds=15)
CHUNK = 100
"""Samples per series per write, as a collector writes a few polls at a time."""


def make_batches(series: int, per_series: int, seed: int = 7) -> list[SeriesBatch]:
    rng = random.Random(seed)
    stamps = [START + STEP * i for i in range(per_series)]
    batches = []
    for number in range(series):
        metric, kind = METRICS[number % len(METRICS)]
        gpu = number // len(METRICS)
        labels = {
            "gpu": str(gpu % 8),
            "UUID": f"GPU-{uuid.UUID(int=rng.getrandbits(128))}",
            "modelName": "NVIDIA H100 80GB HBM3",
            "Hostname": f"gpu-node-{gpu // 8:03d}",
        }
        value, values = float(rng.randrange(100)), []
        for _ in stamps:
            value = max(0.0, value + rng.choice((-2, -1, 0, 0, 1, 2)))
            values.append(value)
        batches.append(SeriesBatch(metric, labels, stamps, values, kind))
    return batches


def chunks(batches: list[SeriesBatch], per_series: int) -> list[list[SeriesBatch]]:
    """The batches cut in time into writes of :data:`CHUNK` samples per series."""
    return [
        [
            SeriesBatch(
                b.metric, b.labels, b.timestamps[i : i + CHUNK], b.values[i : i + CHUNK], b.kind
            )
            for b in batches
        ]
        for i in range(0, per_series, CHUNK)
    ]


def store_bytes(engine: Engine, batches: list[list[SeriesBatch]]) -> int:
    metadata.create_all(engine)
    project = new_project(engine, "bytes")
    writer = SampleWriter(engine)
    for write in batches:
        writer.write(project, write)
    if engine.dialect.name == "sqlite":
        with engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        raw = engine.raw_connection()
        try:
            raw.driver_connection.execute("VACUUM")  # type: ignore[union-attr]
        finally:
            raw.close()
        return os.path.getsize(str(engine.url.database))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM samples"))
        connection.execute(text("VACUUM series"))
        size = connection.execute(
            text(
                "SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('samples')"
                " WHERE isleaf"
            )
        ).scalar_one()
        size += connection.execute(text("SELECT pg_total_relation_size('series')")).scalar_one()
    return int(size)


def vm_bytes(url: str, batches: list[list[SeriesBatch]]) -> int:
    backend = PrometheusBackend(url)
    try:
        for write in batches:
            assert not backend.write(1, write).rejected
    finally:
        backend.close()
    httpx.get(f"{url}/internal/force_flush", timeout=60).raise_for_status()
    httpx.get(f"{url}/internal/force_merge", timeout=60).raise_for_status()
    time.sleep(5)  # the merge runs in the background
    size = 0
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("vm_data_size_bytes{"):
            size += int(float(line.rsplit(" ", 1)[1]))
    return size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--series", type=int, default=1000)
    parser.add_argument("--per-series", type=int, default=1000)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL))
    args = parser.parse_args(argv)
    batches = chunks(make_batches(args.series, args.per_series), args.per_series)
    samples = args.series * args.per_series
    print(
        f"{args.series:,} series x {args.per_series:,} samples = {samples:,}; "
        f"load {os.getloadavg()}"
    )
    sizes: dict[str, int] = {}
    with victoria_metrics() as vm:
        sizes["VictoriaMetrics"] = vm_bytes(vm, batches)
    with tempfile.TemporaryDirectory() as directory:
        engine = make_engine(f"sqlite:///{Path(directory) / 'bytes.db'}")
        try:
            sizes["SQLite"] = store_bytes(engine, batches)
        finally:
            engine.dispose()
    with scratch_database(args.database_url) as url:
        engine = make_engine(url)
        try:
            sizes["PostgreSQL"] = store_bytes(engine, batches)
        finally:
            engine.dispose()
    baseline = sizes["VictoriaMetrics"] / samples
    print("| store | bytes | bytes per sample | ratio vs VictoriaMetrics |")
    print("|---|---:|---:|---:|")
    for name, size in sizes.items():
        per = size / samples
        print(f"| {name} | {size:,} | {per:.2f} | {per / baseline:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
