"""Disk per sample: the built-in store on SQLite and on PostgreSQL, before and after compaction,
against VictoriaMetrics holding the very same samples, on a day of fleet data.

Data (``bench/fleet_day.py``): a day of dcgm-exporter data (1,000 series, a sample every 15 s:
5.76 million samples) and a day of OTLP step timing (576 series, about 5.3 million samples),
each loaded in the same run into each store: ``SampleWriter`` into the built-in store (an hour
of every series a write), ``/api/v1/import`` into VictoriaMetrics (Debian's package, started
here with a temporary data directory).

Sizes: the built-in store, every table's bytes with its indexes (PostgreSQL
``pg_total_relation_size``, partitions summed; SQLite ``dbstat`` pages), less what the same
tables held empty, split into *samples* (raw rows, compacted chunks, series) and *rollups*
(``samples_1m``, ``samples_1h``, which compaction needs first and VictoriaMetrics does not
keep); measured after ``VACUUM FULL`` (PostgreSQL) or ``VACUUM`` (SQLite): the live data, what
the store holds once new rows have reused the space that compaction freed. "after, on disk"
is measured right after compaction, no ``VACUUM`` of any kind: what the disk holds at once
(PostgreSQL: compaction truncates the partitions it emptied; SQLite: the free pages the file
keeps for new rows are counted with the samples).
VictoriaMetrics: ``vm_data_size_bytes`` (data parts, no index) after a forced flush and merge.

Steps, per dataset and database: load, measure ("before": today's row layout), roll up
(``update_rollups`` as the periodic task does), ``compact(hot_window=0)`` when the store has
it once the data's last day has closed (so that its partition is emptied whole), measure
("after"). Without compaction the "after" columns say so. It runs in scratch
databases and directories that it removes::

    python bench/storage_footprint.py            # a day of each dataset, about 10 minutes
    python bench/storage_footprint.py --quick    # 2 hours of each: a smoke run
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import httpx
from sqlalchemy import Engine

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fleet_day import DATASETS, Dataset, import_victoria_metrics, load_store, table_sizes, vacuum
from remote_write import victoria_metrics
from storage_write import DEFAULT_URL, machine, new_project, scratch_database

from tuneloop.storage import make_engine, migrate
from tuneloop.storage.models import ROLLUP_TABLES
from tuneloop.storage.timeseries.rollups import update_rollups

ROLLUPS = {table.name for table in ROLLUP_TABLES.values()}
SETTLE = timedelta(minutes=10)
"""How long after the data's end the rollup and compaction passes run: every hour closed."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def compaction() -> Callable[..., Any] | None:
    """The store's ``compact``, or None where this version of the store has none."""
    try:
        module = importlib.import_module("tuneloop.storage.timeseries.compaction")
    except ModuleNotFoundError:
        return None
    return cast("Callable[..., Any]", module.compact)


@dataclass(frozen=True, slots=True)
class Split:
    samples: int
    rollups: int


@dataclass(frozen=True, slots=True)
class Footprint:
    before: Split
    after_plain: Split | None
    after: Split | None
    compact_s: float | None
    compacted: int | None


def split(engine: Engine, empty: dict[str, int], *, with_free_pages: bool = False) -> Split:
    """Bytes of samples and of rollups; ``with_free_pages``: SQLite's free pages (which the
    file keeps until ``VACUUM``) counted with the samples, whose deletion freed them."""
    sizes = {name: size - empty.get(name, 0) for name, size in table_sizes(engine).items()}
    if with_free_pages and engine.dialect.name == "sqlite":
        with engine.connect() as connection:
            free = connection.exec_driver_sql("PRAGMA freelist_count").scalar_one()
            page = connection.exec_driver_sql("PRAGMA page_size").scalar_one()
        sizes["free pages"] = int(free) * int(page)
    for name, size in sorted(sizes.items(), key=lambda item: -item[1]):
        if size >= 1 << 20:
            log(f"    {name}: {size / (1 << 20):,.1f} MiB")
    rollups = sum(size for name, size in sizes.items() if name in ROLLUPS)
    return Split(sum(sizes.values()) - rollups, rollups)


def footprint(
    engine: Engine, url: str, data: Dataset, compact: Callable[..., Any] | None
) -> Footprint:
    migrate.upgrade(url)
    vacuum(engine, full=True)
    empty = table_sizes(engine)
    project = new_project(engine, data.name)
    began = time.perf_counter()
    load_store(engine, data, project)
    log(f"  loaded in {time.perf_counter() - began:.1f} s")
    vacuum(engine, full=True)
    before = split(engine, empty)
    if compact is None:
        log("  compaction not available (tuneloop.storage.timeseries.compaction is missing)")
        return Footprint(before, None, None, None, None)
    # The end of the data's last day: a --quick run's partition is then closed too.
    now = data.end + (-(data.end - data.start) % timedelta(days=1)) + SETTLE
    began = time.perf_counter()
    update_rollups(engine, now=now)
    log(f"  rolled up in {time.perf_counter() - began:.1f} s")
    report = compact(engine, hot_window=timedelta(0), now=now, progress=lambda m: log(f"    {m}"))
    log(f"  {report}")
    after_plain = split(engine, empty, with_free_pages=True)
    vacuum(engine, full=True)
    after = split(engine, empty)
    return Footprint(before, after_plain, after, report.seconds, report.samples_compacted)


def vm_size(url: str) -> int:
    """``vm_data_size_bytes`` once a forced flush and merge have settled (unchanged twice)."""
    httpx.get(f"{url}/internal/force_flush", timeout=120).raise_for_status()
    httpx.get(f"{url}/internal/force_merge", timeout=120).raise_for_status()
    sizes: list[int] = []
    for _ in range(60):
        time.sleep(2)
        metrics = httpx.get(f"{url}/metrics", timeout=30).text.splitlines()
        sizes.append(
            sum(
                int(float(line.rsplit(" ", 1)[1]))
                for line in metrics
                if line.startswith("vm_data_size_bytes{")
            )
        )
        if len(sizes) >= 3 and sizes[-1] == sizes[-2] == sizes[-3]:
            break
    return sizes[-1]


def vm_rows(url: str) -> int:
    metrics = httpx.get(f"{url}/metrics", timeout=30).text.splitlines()
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in metrics
        if line.startswith("vm_rows{") and "storage/" in line
    )


def victoria_bytes(data: Dataset) -> int:
    with victoria_metrics() as url:
        began = time.perf_counter()
        import_victoria_metrics(url, data)
        size = vm_size(url)
        rows = vm_rows(url)
        seconds = time.perf_counter() - began
        log(f"  VictoriaMetrics: {rows:,} rows, imported and merged in {seconds:.1f} s")
        assert rows == data.samples, f"VictoriaMetrics holds {rows:,} of {data.samples:,} samples"
    return size


@contextmanager
def sqlite_url() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="tuneloop-bench-") as directory:
        yield f"sqlite:///{Path(directory) / 'footprint.db'}"


@contextmanager
def postgres_url(server: str) -> Iterator[str]:
    with scratch_database(server) as url:
        yield url


def per(size: int | None, samples: int) -> str:
    return "-" if size is None else f"{size / samples:.2f}"


def rows_for(name: str, data: Dataset, vm: int, stores: dict[str, Footprint]) -> list[str]:
    n = data.samples
    lines = [f"| {name} | VictoriaMetrics | {per(vm, n)} | 1.0 | | | 1.0 | | | |"]
    for store, found in stores.items():
        plain = found.after_plain.samples if found.after_plain else None
        after = found.after.samples if found.after else None
        seconds = found.compact_s
        lines.append(
            f"| {name} | {store} | {per(found.before.samples, n)} "
            f"| {found.before.samples / vm:.0f} | {per(plain, n)} | **{per(after, n)}** "
            f"| {'-' if after is None else f'{after / vm:.1f}'} "
            f"| {per(found.after.rollups if found.after else None, n)} "
            f"| {'-' if seconds is None else f'{seconds:.1f}'} "
            f"| {'-' if seconds is None else f'{(found.compacted or 0) / seconds:,.0f}'} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 hours of each dataset")
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS))
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL))
    args = parser.parse_args(argv)
    hours = 2.0 if args.quick else args.hours
    compact = compaction()
    lines = [
        "| data | store | before B/sample | before / VM | after, on disk | after B/sample "
        "| after / VM | rollups B/sample | compact s | compacted samples/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    loads, server = [os.getloadavg()[0]], ""
    for name in args.datasets:
        data = DATASETS[name](hours)
        log(f"{name}: {data.series:,} series, {data.samples:,} samples over {hours:g} h")
        vm = victoria_bytes(data)
        stores: dict[str, Footprint] = {}
        for store, urls in (
            ("SQLite", sqlite_url()),
            ("PostgreSQL", postgres_url(args.database_url)),
        ):
            log(f" {store}")
            with urls as url:
                engine = make_engine(url)
                try:
                    stores[store] = footprint(engine, url, data, compact)
                    if store == "PostgreSQL":
                        server = machine(engine)
                finally:
                    engine.dispose()
            loads.append(os.getloadavg()[0])
        lines += rows_for(name, data, vm, stores)
    print(f"\n{server}; load average {min(loads):.1f} to {max(loads):.1f}")
    if compact is None:
        print("compaction not available: the 'after' columns are empty")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
