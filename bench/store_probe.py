"""The price of the compacted-chunks probe on the hot path: the short reads of the last
minutes that the tuner, the actuators and the alert evaluator make, on a store whose older
hours are compacted and whose last hour is rows (what the periodic pass leaves), with the
probe and without it.

Data: ``--hours`` of dcgm-exporter data (``bench/fleet_day.py``: 1,000 series, a sample every
15 s) loaded with ``SampleWriter``, rolled up, and compacted but for the last hour
(``compact(hot_window=1 h)``). Reads (``StoreBackend``), all of the last minutes, all rows:

* ``query_range`` of 10 minutes at a 60 s step, one host's 8 GPUs (the tuner's window reads);
* ``query_range`` of 5 minutes as one bucket, one metric's 100 series (an alert rule);
* ``read_raw`` of 10 minutes, one host's 8 GPUs (the tuner's power reading).

Contenders, interleaved, ``--repeats`` times each: **probe** (the code as it is: whether a
chunk overlaps the range is asked of the database on every read) and **no probe** (the
same reads with ``sample_source.has_chunks_table`` answering ``False``, so that every read
runs the statements it ran before chunks existed). ratio = probe / no probe (1.0 means the
probe is free). Medians with 95% bootstrap intervals::

    python bench/store_probe.py            # about 3 minutes on 2 busy cores
    python bench/store_probe.py --hours 3  # a smoke run
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Engine, text

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dashboard_query import disposing
from fleet_day import Dataset, dcgm_day
from remote_write import interval
from storage_footprint import SETTLE, compaction
from storage_write import DEFAULT_URL, machine
from store_compaction import build_template, log, template_url

from tuneloop.storage import make_engine
from tuneloop.storage.timeseries import sample_source
from tuneloop.storage.timeseries.raw import RawSeries
from tuneloop.storage.timeseries.store_backend import StoreBackend
from tuneloop.storage.timeseries.types import Aggregation, Matcher, MatchOp
from tuneloop.storage.types import to_micros

UTIL = "DCGM_FI_DEV_GPU_UTIL"
HOST = [Matcher("Hostname", MatchOp.EQ, "gpu-node-003")]


def hot_reads(backend: StoreBackend, project: int, data: Dataset) -> dict[str, Callable[[], Any]]:
    end = data.end
    end_ms = to_micros(end) // 1000
    return {
        "query_range 10 min, 8 series, 60 s step": lambda: backend.query_range(
            project,
            UTIL,
            HOST,
            start=end - timedelta(minutes=10),
            end=end,
            step_s=60,
            aggregation=Aggregation.AVG,
        ),
        "query_range 5 min, 100 series, one bucket": lambda: backend.query_range(
            project,
            UTIL,
            start=end - timedelta(minutes=5),
            end=end,
            step_s=10**9,
            aggregation=Aggregation.MAX,
            max_series=500,
        ),
        "read_raw 10 min, 8 series": lambda: backend.read_raw(
            project, [Matcher("__name__", MatchOp.EQ, UTIL), *HOST], end_ms - 600_000, end_ms
        ),
    }


@contextmanager
def probe_skipped() -> Iterator[None]:
    """Reads as before chunks existed: the store says it has no chunks table."""
    original = sample_source.has_chunks_table
    sample_source.has_chunks_table = lambda connection: False
    try:
        yield
    finally:
        sample_source.has_chunks_table = original


def same(first: list[Any], second: list[Any]) -> bool:
    if not first or not isinstance(first[0], RawSeries):
        return first == second
    return len(first) == len(second) and all(
        a.labels == b.labels
        and np.array_equal(a.times_ms, b.times_ms)
        and np.array_equal(a.values, b.values)
        for a, b in zip(first, second, strict=True)
    )


def fmt(values: list[float]) -> str:
    median, low, high = interval(values)
    return f"{median * 1000:.2f} [{low * 1000:.2f}-{high * 1000:.2f}]"


def measure(
    engine: Engine, project: int, data: Dataset, repeats: int
) -> dict[str, tuple[list[float], list[float]]]:
    """Seconds of each read with the probe and without, interleaved."""
    backend = StoreBackend(engine)
    out: dict[str, tuple[list[float], list[float]]] = {}
    for name, read in hot_reads(backend, project, data).items():
        with_probe = read()
        with probe_skipped():
            assert same(read(), with_probe) and with_probe, name  # same answer, not empty
        times: dict[str, list[float]] = {"probe": [], "none": []}
        for round_ in range(repeats):
            for which in ("probe", "none") if round_ % 2 == 0 else ("none", "probe"):
                with ExitStack() as stack:
                    if which == "none":
                        stack.enter_context(probe_skipped())
                    began = time.perf_counter()
                    read()
                    times[which].append(time.perf_counter() - began)
        out[name] = (times["none"], times["probe"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--repeats", type=int, default=201)
    parser.add_argument(
        "--stores", nargs="+", choices=("PostgreSQL", "SQLite"), default=["PostgreSQL", "SQLite"]
    )
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL))
    args = parser.parse_args(argv)
    compact = compaction()
    if compact is None:
        print("compaction not available (tuneloop.storage.timeseries.compaction is missing)")
        return 1
    data = dcgm_day(hours=args.hours)
    log(f"dcgm: {data.series:,} series, {data.samples:,} samples over {args.hours:g} h")
    lines, loads, server = [], [os.getloadavg()[0]], ""
    for kind in args.stores:
        log(f" {kind}")
        with template_url(kind, args.database_url) as url:
            project, _ = build_template(url, data)
            with disposing(make_engine(url)) as engine:
                report = compact(engine, hot_window=timedelta(hours=1), now=data.end + SETTLE)
                log(f"  {report}")
                if kind == "PostgreSQL":
                    server = machine(engine)
                    with engine.connect().execution_options(
                        isolation_level="AUTOCOMMIT"
                    ) as connection:
                        connection.execute(text("VACUUM ANALYZE"))
                loads.append(os.getloadavg()[0])
                for name, (none, probe) in measure(engine, project, data, args.repeats).items():
                    median, low, high = interval([p / n for n, p in zip(none, probe, strict=True)])
                    lines.append(
                        f"| {kind} | {name} | {fmt(none)} | {fmt(probe)} "
                        f"| **{median:.3f}** [{low:.3f}-{high:.3f}] |"
                    )
                loads.append(os.getloadavg()[0])
    print(f"\n{server}; load average {min(loads):.1f} to {max(loads):.1f}")
    print(f"median of {args.repeats}, [95% interval]; times in ms\n")
    print("| database | read | no probe ms | probe ms | probe / no probe |")
    print("|---|---|---:|---:|---:|")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
