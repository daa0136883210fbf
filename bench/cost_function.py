"""The Cost dashboard's SQL functions over a fleet's week: ``tuneloop_gpu_usage`` and
``tuneloop_gpu_cost`` as migration 0016 left them (only the raw rows after the 1-minute
watermark grouped into minutes) against the same functions as they were before it (0015's
usage, 0012's cost: every minute grouped, rollup rows included), created beside them in the
same database as ``*_before``, on the same rows.

The data is ``bench/dashboard_query.py``'s: 1,000 GPU utilization series (dcgm-exporter
labels) sampled every minute for 7 days, rolled up as the periodic task leaves them, one price
row. The script checks that both versions give the same rows, then times them interleaved on
the server (``EXPLAIN (ANALYZE, TIMING OFF)``), and prints medians with 95% bootstrap
intervals and the paired ratio before / after::

    .venv/bin/python bench/cost_function.py               # 1,000 series, 7 days
    .venv/bin/python bench/cost_function.py --days 1      # quicker
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import statistics
import sys
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dashboard_query import (
    DEFAULT_URL,
    disposing,
    fill,
    log,
    roll_up,
    same_rows,
    scratch_database,
    server_time,
)
from remote_write import interval

from tuneloop.storage import make_engine, migrate

CALLS = {
    "usage": "SELECT * FROM {name}('bench', '{start}', '{end}', 5.0)",
    "cost": "SELECT * FROM {name}('bench', '{start}', '{end}', 5.0)",
}
FUNCTIONS = {"usage": "tuneloop_gpu_usage", "cost": "tuneloop_gpu_cost"}


def previous_definitions() -> dict[str, str]:
    """The functions as they were before 0016, renamed ``*_before``."""
    path = migrate.migrations_dir() / "versions" / "0016_cost_minutes_ungrouped.py"
    spec = importlib.util.spec_from_file_location("tuneloop_migration_0016", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    usage, cost = module._previous()
    return {
        "usage": usage.replace("tuneloop_gpu_usage(", "tuneloop_gpu_usage_before(", 1),
        "cost": cost.replace("tuneloop_gpu_cost(", "tuneloop_gpu_cost_before(", 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=1_000)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--url", default=DEFAULT_URL)
    args = parser.parse_args()
    end = datetime(2026, 11, 16, tzinfo=UTC)
    start = end - timedelta(days=args.days)
    with ExitStack() as stack:
        url = stack.enter_context(scratch_database(args.url))
        migrate.upgrade(url)
        engine = stack.enter_context(disposing(make_engine(url)))
        log(f"filled {fill(engine, args.series, start, end, 60):,} samples")
        roll_up(engine, start, end)
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO gpu_prices (model, capacity_type, price_per_gpu_hour, "
                    "currency, created_at) VALUES ('*', 'on_demand', 2.5, 'USD', now())"
                )
            )
            for definition in previous_definitions().values():
                connection.execute(text(definition))
            connection.execute(text("ANALYZE"))
        log("rolled up; checking both versions give the same rows")
        timings: dict[str, dict[str, list[float]]] = {}
        for kind, name in FUNCTIONS.items():
            after = CALLS[kind].format(name=name, start=start, end=end)
            before = CALLS[kind].format(name=f"{name}_before", start=start, end=end)
            same_rows([(engine, after), (engine, before)])
            timings[kind] = {"before": [], "after": []}
            for repeat in range(args.repeats):
                order = [("before", before), ("after", after)]
                for label, sql in order if repeat % 2 == 0 else order[::-1]:
                    timings[kind][label].append(server_time(engine, sql))
                log(f"  {kind} repeat {repeat + 1}/{args.repeats}")
    print(
        f"\n{args.series:,} series x {args.days:g} days, 1 sample/min; Python "
        f"{platform.python_version()}; median of {args.repeats} interleaved, [95% interval]\n"
    )
    print("| function | before 0016 ms | after ms | before / after (paired) |")
    print("|---|---:|---:|---:|")
    for kind, name in FUNCTIONS.items():
        old, new = timings[kind]["before"], timings[kind]["after"]
        ratios = [b / a for b, a in zip(old, new, strict=True)]
        cells = []
        for values in (old, new):
            median, low, high = interval([v * 1000 for v in values])
            cells.append(f"{median:,.0f} [{low:,.0f}-{high:,.0f}]")
        median, low, high = interval(ratios)
        print(f"| `{name}` | {cells[0]} | {cells[1]} | **{median:.1f}x** [{low:.1f}-{high:.1f}] |")
    print(f"(mean of the paired ratios: {statistics.mean(ratios):.2f})")


if __name__ == "__main__":
    main()
