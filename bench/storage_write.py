"""Write benchmark: ``SampleWriter.write`` against raw psycopg binary COPY of the same rows.

Both load the very same (series_id, ts, value) rows into the same partitioned ``samples`` table
(same index, same partitions), truncated before every run, in interleaved order. The writer is
timed twice: *cold* (a fresh writer and a fresh project, so series creation, the cap count and the
partition check are included) and *warm* (series ids already cached, the steady state of a
collector). The ratio is raw_time / writer_time: 1.0 means the writer costs nothing over COPY.
With ``--replay`` the warm writer is also timed on its replay path (``dedupe=True``: COPY into a
staging table, then ``INSERT ... ON CONFLICT DO NOTHING``), what a replayed spool group costs.

The raw baseline drains its rows into ``Copy.write_row`` with ``deque(map(...))``, a loop in C,
so the ratio charges the writer for all of its own Python work (validation, id resolution, row
building). It runs in a scratch database that it creates and drops, never in existing data::

    .venv/bin/python bench/storage_write.py            # N = 10^5 and 10^6
    .venv/bin/python bench/storage_write.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import psycopg
from sqlalchemy import Engine, create_engine, insert, select, text
from sqlalchemy.engine import make_url

from tuneloop.storage import make_engine
from tuneloop.storage.models import Project, Series, metadata
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind, fingerprint
from tuneloop.storage.timeseries.writer import SampleWriter

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
START = datetime(2024, 5, 1, 8, 0, tzinfo=UTC)
STEP = timedelta(seconds=15)
# dcgm-exporter field names, with the kind a scrape would declare.
METRICS = [
    ("DCGM_FI_DEV_GPU_UTIL", SeriesKind.GAUGE),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", SeriesKind.GAUGE),
    ("DCGM_FI_DEV_FB_USED", SeriesKind.GAUGE),
    ("DCGM_FI_DEV_FB_FREE", SeriesKind.GAUGE),
    ("DCGM_FI_DEV_POWER_USAGE", SeriesKind.GAUGE),
    ("DCGM_FI_DEV_GPU_TEMP", SeriesKind.GAUGE),
    ("DCGM_FI_DEV_SM_CLOCK", SeriesKind.GAUGE),
    ("DCGM_FI_PROF_SM_ACTIVE", SeriesKind.GAUGE),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", SeriesKind.GAUGE),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", SeriesKind.COUNTER),
]
COPY_SQL = "COPY samples (series_id, ts, value) FROM STDIN (FORMAT BINARY)"


@dataclass(frozen=True, slots=True)
class Row:
    """Median seconds of each contender for one N."""

    samples: int
    series: int
    raw_s: float
    cold_s: float
    warm_s: float
    replay_s: float | None = None


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def make_batches(series: int, per_series: int, seed: int = 7) -> list[SeriesBatch]:
    """``series`` dcgm-like series (10 metrics x GPUs, 8 GPUs a node) sharing scrape times."""
    rng = random.Random(seed)
    stamps = [START + STEP * i for i in range(per_series)]
    batches = []
    for number in range(series):
        metric, kind = METRICS[number % len(METRICS)]
        gpu = number // len(METRICS)
        labels = {
            "gpu": str(gpu % 8),
            "UUID": f"GPU-{uuid.UUID(int=rng.getrandbits(128))}",
            "device": f"nvidia{gpu % 8}",
            "modelName": "NVIDIA H100 80GB HBM3",
            "Hostname": f"gpu-node-{gpu // 8:03d}",
            "namespace": "training",
            "pod": f"llm-pretrain-worker-{gpu // 8}",
            "container": "trainer",
        }
        values = [rng.uniform(0.0, 700.0) for _ in stamps]
        batches.append(SeriesBatch(metric, labels, stamps, values, kind))
    return batches


@contextmanager
def scratch_database(url: str) -> Iterator[str]:
    """A new, empty database next to ``url``'s, dropped afterwards whatever happens."""
    name = f"tuneloop_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def new_project(engine: Engine, name: str) -> int:
    with engine.begin() as connection:
        key = connection.execute(insert(Project).values(name=name)).inserted_primary_key
    assert key is not None
    return int(key[0])


def reset_samples(engine: Engine) -> None:
    """Empty ``samples`` (partitions kept) and flush dirty pages so that no run pays for the
    previous one's checkpoint."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("TRUNCATE samples"))
        connection.execute(text("CHECKPOINT"))


def series_ids(engine: Engine, project_id: int) -> dict[str, int]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(Series.fingerprint, Series.id).where(Series.project_id == project_id)
        )
        return {row.fingerprint: row.id for row in rows}


def count_samples(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(text("SELECT count(*) FROM samples")).scalar_one())


def raw_copy(engine: Engine, rows: list[tuple[int, datetime, float]]) -> None:
    with engine.begin() as connection:
        driver = cast("psycopg.Connection[Any]", connection.connection.driver_connection)
        with driver.cursor() as cursor, cursor.copy(COPY_SQL) as copy:
            copy.set_types(["int8", "timestamptz", "float8"])
            deque(map(copy.write_row, rows), maxlen=0)


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def measure(engine: Engine, samples: int, series: int, repeats: int, replay: bool) -> Row:
    per_series = samples // series
    batches = make_batches(series, per_series)
    # Series ids for the raw rows come from a setup write; so do the warm writer's cache and
    # the partitions, which every contender then finds in place.
    reference_project = new_project(engine, f"reference-{samples}")
    SampleWriter(engine).write(reference_project, batches)
    ids = series_ids(engine, reference_project)
    rows = [
        (ids[fingerprint(batch.metric, batch.labels)], ts, value)
        for batch in batches
        for ts, value in zip(batch.timestamps, batch.values, strict=True)
    ]
    warm_project = new_project(engine, f"warm-{samples}")
    warm = SampleWriter(engine)
    warm.write(warm_project, batches)

    def cold() -> Callable[[], object]:
        # Project and writer are made outside the timed call; series creation is inside it.
        project = new_project(engine, f"cold-{samples}-{uuid.uuid4().hex[:8]}")
        writer = SampleWriter(engine)
        return lambda: writer.write(project, batches)

    contenders: dict[str, Callable[[], Callable[[], object]]] = {
        "raw": lambda: lambda: raw_copy(engine, rows),
        "cold": cold,
        "warm": lambda: lambda: warm.write(warm_project, batches),
    }
    if replay:
        contenders["replay"] = lambda: lambda: warm.write(warm_project, batches, dedupe=True)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    order = list(contenders)
    for repeat in range(repeats):
        for name in order[repeat % len(order) :] + order[: repeat % len(order)]:
            action = contenders[name]()
            reset_samples(engine)
            elapsed = timed(action)
            assert count_samples(engine) == samples, f"{name} wrote the wrong number of rows"
            times[name].append(elapsed)
            log(f"  N={samples:>9,} repeat {repeat + 1}/{repeats} {name:>4}: {elapsed:7.3f} s")
    return Row(
        samples=samples,
        series=series,
        raw_s=statistics.median(times["raw"]),
        cold_s=statistics.median(times["cold"]),
        warm_s=statistics.median(times["warm"]),
        replay_s=statistics.median(times["replay"]) if replay else None,
    )


def table(rows: list[Row]) -> str:
    lines = [
        "| samples | series | raw COPY (s) | writer cold (s) | ratio cold | writer warm (s) "
        "| ratio warm | writer warm (samples/s) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.samples:,} | {row.series:,} | {row.raw_s:.3f} | {row.cold_s:.3f} "
            f"| **{row.raw_s / row.cold_s:.2f}** | {row.warm_s:.3f} "
            f"| **{row.raw_s / row.warm_s:.2f}** | {row.samples / row.warm_s:,.0f} |"
        )
    replayed = [row for row in rows if row.replay_s is not None]
    if replayed:
        lines += ["", "| samples | writer replay (s) | ratio replay |", "|---:|---:|---:|"]
        for row in replayed:
            assert row.replay_s is not None
            lines.append(
                f"| {row.samples:,} | {row.replay_s:.3f} | **{row.raw_s / row.replay_s:.2f}** |"
            )
    return "\n".join(lines)


def machine(engine: Engine) -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            cpu = next(
                line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    with engine.connect() as connection:
        server = str(connection.execute(text("SHOW server_version")).scalar_one())
    return (
        f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, "
        f"psycopg {psycopg.__version__} ({psycopg.pq.__impl__}), PostgreSQL {server}"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("TUNELOOP_BENCH_DATABASE_URL", DEFAULT_URL),
        help="PostgreSQL server to run on; a scratch database is created there and dropped",
    )
    parser.add_argument("--quick", action="store_true", help="small N, 3 repeats: a smoke run")
    parser.add_argument("--sizes", type=int, nargs="+", help="sample counts (default 1e5 1e6)")
    parser.add_argument("--series", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--replay", action="store_true", help="also time the replay path")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = args.sizes or ([20_000] if args.quick else [100_000, 1_000_000])
    repeats = 3 if args.quick else args.repeats
    series = min(args.series, 100) if args.quick else args.series
    results = []
    with scratch_database(args.database_url) as url:
        engine = make_engine(url)
        try:
            metadata.create_all(engine)
            log(f"machine: {machine(engine)}")
            for samples in sizes:
                log(f"N={samples:,}: {series:,} series x {samples // series:,} timestamps")
                results.append(measure(engine, samples, series, repeats, args.replay))
            print(f"\n{machine(engine)}; median of {repeats} interleaved runs\n")
            print(table(results))
        finally:
            engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
