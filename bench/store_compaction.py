"""Compaction of the built-in store: how fast ``compact`` turns a day of rows into compressed
chunks, against a raw binary ``COPY`` of the very same rows, and how fast raw reads are over
compacted data, against the same reads over the same data kept as rows.

Data: a day of dcgm-exporter data (``bench/fleet_day.py``: 1,000 series, a sample every 15 s,
5.76 million samples) loaded once per database with ``SampleWriter`` and rolled up with
``update_rollups``: the template. Then, on PostgreSQL and on SQLite:

* **throughput**, ``--repeats`` rounds, the two contenders in alternating order, each on a
  fresh copy of the template (``CREATE DATABASE ... TEMPLATE``, or SQLite's backup API; the
  copy is not timed): ``compact(hot_window=0)``, which compacts every closed hour, timed from
  the call to its return; and the baseline, the same rows (sorted by series and time) loaded
  into the emptied ``samples`` table in one transaction, by binary ``COPY`` from a buffer built
  up front (PostgreSQL) or ``executemany`` of a plain ``INSERT`` (SQLite). ratio = baseline
  time / compaction time: 1.0 means compaction goes as fast as the fastest way to write the
  rows. The target: samples/s well above 100,000 (the ingest compaction must keep up with).
* **reads**: ``StoreBackend.read_raw`` (what the PromQL engine reads) of one hour in the middle
  of the day, for one metric (100 series) and for all 1,000 series, on a copy compacted and a
  copy not, interleaved, ``--read-repeats`` times after a check that both return the same
  samples. ratio = compacted / rows (lower is better; the target is within 2x).

Medians with 95% bootstrap intervals. It runs in scratch databases and directories that it
removes::

    python bench/store_compaction.py             # about 10 minutes on 2 busy cores
    python bench/store_compaction.py --quick     # 2 hours of data: a smoke run
    python bench/store_compaction.py --reads-only  # one compaction, then only the reads
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from itertools import chain, repeat
from pathlib import Path
from typing import Any, cast

import numpy as np
import psycopg
from sqlalchemy import Engine, select, text

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dashboard_query import disposing
from dashboard_query import scratch_database as pg_database
from fleet_day import Dataset, dcgm_day, load_store
from remote_write import interval
from storage_footprint import SETTLE, compaction
from storage_write import DEFAULT_URL, machine, new_project

from tuneloop.storage import make_engine, migrate
from tuneloop.storage.models import Series
from tuneloop.storage.timeseries.rollups import update_rollups
from tuneloop.storage.timeseries.store_backend import StoreBackend
from tuneloop.storage.timeseries.types import Matcher, MatchOp, fingerprint
from tuneloop.storage.types import to_micros

PG_EPOCH_US = 946_684_800_000_000
"""PostgreSQL's binary timestamps count microseconds from 2000-01-01."""
COPY_ROW = np.dtype(
    [
        ("fields", ">i2"),
        ("id_len", ">i4"),
        ("id", ">i8"),
        ("ts_len", ">i4"),
        ("ts", ">i8"),
        ("value_len", ">i4"),
        ("value", ">f8"),
    ]
)
COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
COPY_TRAILER = b"\xff\xff"
READS = {
    "1 h, 1 metric (100 series)": [Matcher("__name__", MatchOp.EQ, "DCGM_FI_DEV_GPU_UTIL")],
    "1 h, all 1,000 series": [Matcher("__name__", MatchOp.RE, "DCGM_.*")],
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- copies


class Copies:
    """Fresh copies of one loaded, rolled-up database (the template), each removed when the
    stack it is made in closes."""

    def __init__(self, template: str, server: str) -> None:
        self.template, self.server = template, server
        self.sqlite = template.startswith("sqlite")

    def fresh(self, stack: ExitStack) -> Engine:
        if self.sqlite:
            source = Path(self.template.removeprefix("sqlite:///"))
            target = source.with_name(f"copy-{time.monotonic_ns()}.db")
            with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
                src.backup(dst)
            stack.callback(target.unlink, missing_ok=True)
            return stack.enter_context(disposing(make_engine(f"sqlite:///{target}")))
        url = stack.enter_context(pg_database(self.server, template=self.template))
        return stack.enter_context(disposing(make_engine(url)))


@contextmanager
def template_url(kind: str, server: str) -> Iterator[str]:
    if kind == "PostgreSQL":
        with pg_database(server) as url:
            yield url
        return
    with tempfile.TemporaryDirectory(prefix="tuneloop-bench-") as directory:
        yield f"sqlite:///{Path(directory) / 'template.db'}"


def build_template(url: str, data: Dataset) -> tuple[int, dict[str, int]]:
    """Load and roll up ``data``; the project id and the series ids by fingerprint."""
    migrate.upgrade(url)
    with disposing(make_engine(url)) as engine:
        project = new_project(engine, data.name)
        began = time.perf_counter()
        load_store(engine, data, project)
        update_rollups(engine, now=data.end + SETTLE)
        log(f"  template loaded and rolled up in {time.perf_counter() - began:.1f} s")
        with engine.begin() as connection:
            if engine.dialect.name == "postgresql":
                connection.execute(text("CHECKPOINT"))
            rows = connection.execute(select(Series.fingerprint, Series.id)).all()
            ids = {str(row[0]): int(row[1]) for row in rows}
    return project, ids


# --------------------------------------------------------------------------- baseline


def sorted_rows(data: Dataset, ids: dict[str, int]) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(series id, times in us, values) of every series, by series id."""
    found = [
        (ids[fingerprint(s.metric, s.labels)], group.stamps_us, s.values)
        for group in data.groups
        for s in group.series
    ]
    return iter(sorted(found, key=lambda item: item[0]))


def copy_buffer(data: Dataset, ids: dict[str, int]) -> bytes:
    parts = []
    for series_id, stamps, values in sorted_rows(data, ids):
        rows = np.empty(len(stamps), dtype=COPY_ROW)
        rows["fields"], rows["id_len"], rows["ts_len"], rows["value_len"] = 3, 8, 8, 8
        rows["id"], rows["ts"], rows["value"] = series_id, stamps - PG_EPOCH_US, values
        parts.append(rows.tobytes())
    return COPY_HEADER + b"".join(parts) + COPY_TRAILER


def baseline(engine: Engine, data: Dataset, ids: dict[str, int], buffer: bytes) -> float:
    """Seconds to load the rows into the emptied ``samples`` in one transaction."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(
            text("DELETE FROM samples" if engine.dialect.name == "sqlite" else "TRUNCATE samples")
        )
    raw = engine.raw_connection()
    try:
        driver = raw.driver_connection
        began = time.perf_counter()
        if isinstance(driver, sqlite3.Connection):
            rows = chain.from_iterable(
                zip(repeat(series_id), stamps.tolist(), values.tolist(), strict=False)
                for series_id, stamps, values in sorted_rows(data, ids)
            )
            driver.executemany("INSERT INTO samples (series_id, ts, value) VALUES (?, ?, ?)", rows)
        else:
            pg = cast("psycopg.Connection[Any]", driver)
            with (
                pg.cursor() as cursor,
                cursor.copy(
                    "COPY samples (series_id, ts, value) FROM STDIN (FORMAT BINARY)"
                ) as copy,
            ):
                view = memoryview(buffer)
                for at in range(0, len(view), 1 << 23):
                    copy.write(view[at : at + (1 << 23)])
        raw.commit()
        return time.perf_counter() - began
    finally:
        raw.close()


# --------------------------------------------------------------------------- rounds


def throughput(
    copies: Copies,
    kept: ExitStack,
    data: Dataset,
    ids: dict[str, int],
    repeats: int,
    compact: Callable[..., Any],
) -> tuple[list[float], list[float], int, Engine]:
    """Seconds of each contender per round, the samples compacted, and the last round's
    compacted copy (left open in ``kept``)."""
    buffer = b"" if copies.sqlite else copy_buffer(data, ids)
    compact_s: list[float] = []
    copy_s: list[float] = []
    compacted, last = 0, None
    for round_ in range(repeats):
        for name in ("compact", "baseline") if round_ % 2 == 0 else ("baseline", "compact"):
            with ExitStack() as stack:
                if name == "baseline":
                    copy_s.append(baseline(copies.fresh(stack), data, ids, buffer))
                    log(f"    round {round_ + 1}: baseline {copy_s[-1]:.2f} s")
                    continue
                engine = copies.fresh(kept if round_ == repeats - 1 else stack)
                began = time.perf_counter()
                report = compact(engine, hot_window=timedelta(0), now=data.end + SETTLE)
                compact_s.append(time.perf_counter() - began)
                compacted, last = report.samples_compacted, engine
                log(f"    round {round_ + 1}: compact {compact_s[-1]:.2f} s ({report})")
    assert last is not None
    return compact_s, copy_s, compacted, last


def read_all(
    backend: StoreBackend, project: int, matchers: list[Matcher], span: tuple[int, int]
) -> list[Any]:
    return backend.read_raw(project, matchers, *span)


def reads(
    rows: Engine, compacted: Engine, project: int, data: Dataset, repeats: int
) -> dict[str, tuple[list[float], list[float]]]:
    """Seconds of each read on the row copy and the compacted copy, interleaved."""
    for engine in (rows, compacted):
        if engine.dialect.name == "postgresql":
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
                connection.execute(text("VACUUM ANALYZE"))  # as autovacuum leaves them
    start_ms = to_micros(data.start + (data.end - data.start) / 2) // 1000
    span = (start_ms, start_ms + 3_600_000)
    backends = {"rows": StoreBackend(rows), "compacted": StoreBackend(compacted)}
    out: dict[str, tuple[list[float], list[float]]] = {}
    for name, matchers in READS.items():
        answers = [read_all(backend, project, matchers, span) for backend in backends.values()]
        first, second = answers
        assert len(first) == len(second) and first, (len(first), len(second))
        for a, b in zip(sorted(first, key=str), sorted(second, key=str), strict=True):
            assert np.array_equal(a.times_ms, b.times_ms) and np.array_equal(a.values, b.values)
        times: dict[str, list[float]] = {"rows": [], "compacted": []}
        for round_ in range(repeats):
            order = list(backends) if round_ % 2 == 0 else list(reversed(backends))
            for which in order:
                began = time.perf_counter()
                read_all(backends[which], project, matchers, span)
                times[which].append(time.perf_counter() - began)
        out[name] = (times["rows"], times["compacted"])
        samples = sum(len(series.times_ms) for series in first)
        log(f"    {name}: {len(first)} series, {samples:,} samples")
    return out


def fmt(values: list[float]) -> str:
    median, low, high = interval(values)
    return f"{median * 1000:,.1f} [{low * 1000:,.1f}-{high * 1000:,.1f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 hours of data, 2 rounds")
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--read-repeats", type=int, default=15)
    parser.add_argument(
        "--reads-only", action="store_true", help="compact one copy (untimed), then the reads"
    )
    parser.add_argument(
        "--stores", nargs="+", choices=("PostgreSQL", "SQLite"), default=["PostgreSQL", "SQLite"]
    )
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL))
    args = parser.parse_args(argv)
    if args.quick:
        args.hours, args.repeats, args.read_repeats = 2.0, 2, 5
    compact = compaction()
    if compact is None:
        print("compaction not available (tuneloop.storage.timeseries.compaction is missing)")
        return 1
    data = dcgm_day(hours=args.hours)
    log(f"dcgm: {data.series:,} series, {data.samples:,} samples over {args.hours:g} h")
    speed, read_lines, loads, server = [], [], [os.getloadavg()[0]], ""
    for kind in args.stores:
        log(f" {kind}")
        with template_url(kind, args.database_url) as url, ExitStack() as stack:
            project, ids = build_template(url, data)
            copies = Copies(url, args.database_url)
            if args.reads_only:
                done = copies.fresh(stack)
                compact(done, hot_window=timedelta(0), now=data.end + SETTLE)
            else:
                compact_s, copy_s, compacted, done = throughput(
                    copies, stack, data, ids, args.repeats, compact
                )
                ratio = statistics.median(copy_s) / statistics.median(compact_s)
                speed.append(
                    f"| {kind} | {compacted:,} | {fmt(copy_s)} | {fmt(compact_s)} "
                    f"| **{ratio:.2f}** | {compacted / statistics.median(compact_s):,.0f} |"
                )
            loads.append(os.getloadavg()[0])
            if kind == "PostgreSQL":
                server = machine(done)
            for name, (rows, packed) in reads(
                copies.fresh(stack), done, project, data, args.read_repeats
            ).items():
                ratios = [p / r for r, p in zip(rows, packed, strict=True)]
                median, low, high = interval(ratios)
                read_lines.append(
                    f"| {kind} | {name} | {fmt(rows)} | {fmt(packed)} "
                    f"| **{median:.2f}** [{low:.2f}-{high:.2f}] |"
                )
            loads.append(os.getloadavg()[0])
    print(f"\n{server}; load average {min(loads):.1f} to {max(loads):.1f}")
    if speed:
        print(f"median of {args.repeats} rounds, [95% interval]; times in ms\n")
        print("| database | samples | raw COPY ms | compact ms | ratio | compact samples/s |")
        print("|---|---:|---:|---:|---:|---:|")
        print("\n".join(speed))
    print(f"\nreads: median of {args.read_repeats}, [95% interval]\n")
    print("| database | read | rows ms | compacted ms | compacted / rows |")
    print("|---|---|---:|---:|---:|")
    print("\n".join(read_lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
