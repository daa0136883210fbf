"""The price of the energy counter's ``increase`` in the 1-minute rollup pass: one
``update_rollups`` pass over ``--span`` minutes of a dcgm-exporter fleet, with the step that
sets ``samples_1m.increase`` (``counter_increase.update_increase``, a second statement that
reads the counters' raw rows of the pass again) and without it.

Data: ``--hours`` of dcgm-exporter data (``bench/fleet_day.py``: 100 GPUs, 10 fields, 1,000
series, a sample every 15 s; the energy counter is 1 series in 10 there, against about 1 in
40 in a default dcgm-exporter scrape, so the step's share here is an upper bound) loaded with
``SampleWriter`` and rolled up: the state the periodic task leaves.

Each pass starts from the same state, set up untimed: the 1-minute rows of the last
``--span`` minutes before the pass's end deleted and the 1-minute watermark put back to their
start (then ``VACUUM`` on PostgreSQL). The timed call is ``update_rollups(now=...)`` itself:
the ``--span`` new minutes plus the 2 minutes of lateness it recomputes, one transaction, the
hourly level finding nothing to do, as a pass after a ``--span``-minute pause does.
Contenders, interleaved, ``--repeats`` times each: **with** (the code as it is) and
**without** (``update_increase`` replaced by a no-op). share = 1 - without / with, paired
(SQLite keeps no ``increase``: the step is a no-op there, measured as a control). Medians with
95% bootstrap intervals::

    python bench/rollup_pass.py              # about a minute on 2 busy cores
    python bench/rollup_pass.py --repeats 9  # a smoke run
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, delete, func, select, text, update

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dashboard_query import disposing
from fleet_day import dcgm_day
from remote_write import interval
from storage_footprint import SETTLE
from storage_write import DEFAULT_URL, machine
from store_compaction import build_template, log, template_url

from tuneloop.storage import make_engine
from tuneloop.storage.models import RollupState, Series, samples_1m
from tuneloop.storage.timeseries import rollups
from tuneloop.storage.timeseries.counter_increase import INCREASE_METRICS
from tuneloop.storage.timeseries.rollups import DEFAULT_LATENESS_S, MINUTE_S, floor_time

LATENESS = timedelta(seconds=DEFAULT_LATENESS_S)


@contextmanager
def increase_skipped() -> Iterator[None]:
    """The pass without its second statement: ``increase`` is left as it was."""
    original = rollups.update_increase
    rollups.update_increase = lambda *args, **kwargs: 0
    try:
        yield
    finally:
        rollups.update_increase = original


def reset(engine: Engine, begin: datetime, end: datetime) -> None:
    """The store as before a pass over ``[begin, end)``: those minutes not rolled up yet."""
    with engine.begin() as connection:
        connection.execute(
            delete(samples_1m).where(samples_1m.c.bucket >= begin, samples_1m.c.bucket < end)
        )
        connection.execute(
            update(RollupState).where(RollupState.resolution_s == MINUTE_S).values(watermark=begin)
        )
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.execute(text("VACUUM samples_1m"))


def increases(engine: Engine, begin: datetime, end: datetime) -> int:
    """The counters' 1-minute rows in ``[begin, end)`` that hold an ``increase``."""
    statement = (
        select(func.count())
        .select_from(samples_1m.join(Series, Series.id == samples_1m.c.series_id))
        .where(
            Series.metric.in_(INCREASE_METRICS),
            samples_1m.c.increase.is_not(None),
            samples_1m.c.bucket >= begin,
            samples_1m.c.bucket < end,
        )
    )
    with engine.connect() as connection:
        found = connection.execute(statement).scalar_one()
    return int(found)


def one_pass(engine: Engine, begin: datetime, end: datetime, with_increase: bool) -> float:
    reset(engine, begin, end)
    began = time.perf_counter()
    if with_increase:
        upserted = rollups.update_rollups(engine, now=end + LATENESS)
    else:
        with increase_skipped():
            upserted = rollups.update_rollups(engine, now=end + LATENESS)
    seconds = time.perf_counter() - began
    assert upserted[MINUTE_S] > 0 and upserted[rollups.HOUR_S] == 0, upserted
    return seconds


def measure(
    engine: Engine, begin: datetime, end: datetime, repeats: int
) -> tuple[list[float], list[float]]:
    """Seconds of the pass with the increase step and without, interleaved."""
    one_pass(engine, begin, end, with_increase=True)  # warm the caches
    counted = increases(engine, begin, end)
    log(f"  the pass with the step: {counted} counter minutes hold an increase")
    assert counted > 0 or engine.dialect.name != "postgresql", "the pass set no increase"
    times: dict[bool, list[float]] = {True: [], False: []}
    for round_ in range(repeats):
        for which in (True, False) if round_ % 2 == 0 else (False, True):
            times[which].append(one_pass(engine, begin, end, with_increase=which))
        if (round_ + 1) % 10 == 0:
            log(f"  {round_ + 1}/{repeats} rounds")
    return times[True], times[False]


def fmt(values: list[float]) -> str:
    median, low, high = interval(values)
    return f"{median * 1000:.1f} [{low * 1000:.1f}-{high * 1000:.1f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=1.0, help="data loaded")
    parser.add_argument("--span", type=int, default=10, help="new minutes in the timed pass")
    parser.add_argument("--repeats", type=int, default=101)
    parser.add_argument(
        "--stores", nargs="+", choices=("PostgreSQL", "SQLite"), default=["PostgreSQL", "SQLite"]
    )
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL))
    args = parser.parse_args(argv)
    data = dcgm_day(hours=args.hours)
    log(f"dcgm: {data.series:,} series, {data.samples:,} samples over {args.hours:g} h")
    # The pass ends a few minutes before the data does, so that every minute it reads is full.
    end = floor_time(data.end - timedelta(minutes=5), MINUTE_S)
    begin = end - timedelta(minutes=args.span)
    lines, loads, server = [], [os.getloadavg()[0]], ""
    for kind in args.stores:
        log(f" {kind}")
        with template_url(kind, args.database_url) as url:
            build_template(url, data)
            with disposing(make_engine(url)) as engine:
                if kind == "PostgreSQL":
                    server = machine(engine)
                    with engine.connect().execution_options(
                        isolation_level="AUTOCOMMIT"
                    ) as connection:
                        connection.execute(text("VACUUM ANALYZE"))
                loads.append(os.getloadavg()[0])
                with_, without = measure(engine, begin, end, args.repeats)
                loads.append(os.getloadavg()[0])
            shares = [1 - b / a for a, b in zip(with_, without, strict=True)]
            ratios = [a / b for a, b in zip(with_, without, strict=True)]
            share, share_low, share_high = interval(shares)
            ratio, ratio_low, ratio_high = interval(ratios)
            lines.append(
                f"| {kind} | {fmt(without)} | {fmt(with_)} "
                f"| **{ratio:.3f}** [{ratio_low:.3f}-{ratio_high:.3f}] "
                f"| {share:.1%} [{share_low:.1%}-{share_high:.1%}] |"
            )
    print(f"\n{server}; load average {min(loads):.1f} to {max(loads):.1f}")
    print(
        f"one pass: {args.span} new minutes + {DEFAULT_LATENESS_S // 60} recomputed, "
        f"{data.series:,} series; median of {args.repeats}, [95% interval]; times in ms\n"
    )
    print("| database | without increase ms | with increase ms | with / without | share |")
    print("|---|---:|---:|---:|---:|")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
