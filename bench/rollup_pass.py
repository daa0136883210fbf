"""The price of the energy counter's ``increase`` in the 1-minute rollup pass: one
``update_rollups`` pass over ``--span`` minutes of a dcgm-exporter fleet, three ways.

* **none**: the minute rows upserted without ``increase`` (the pass before migration 0015);
* **UPDATE after** (the pass until the increase joined the upsert): the same upsert, then
  ``counter_increase.update_increase`` over the same minutes, a second statement that reads
  the counters' raw rows again and writes a second version of each counter row;
* **one statement** (the code as it is): the upsert writes ``increase`` with the row.

Data: ``--hours`` of dcgm-exporter data (``bench/fleet_day.py``: 100 GPUs, 10 fields, 1,000
series, a sample every 15 s; the energy counter is 1 series in 10 there, against about 1 in
40 in a default dcgm-exporter scrape, so the step's share here is an upper bound) loaded with
``SampleWriter`` and rolled up: the state the periodic task leaves.

Each pass starts from the same state, set up untimed: the 1-minute rows of the last
``--span`` minutes before the pass's end deleted and the 1-minute watermark put back to their
start (then ``VACUUM`` on PostgreSQL). The timed call is ``update_rollups(now=...)`` itself:
the ``--span`` new minutes plus the 2 minutes of lateness it recomputes, one transaction, the
hourly level finding nothing to do, as a pass after a ``--span``-minute pause does. The three
contenders run interleaved (the order rotating), ``--repeats`` times each, after a check that
the two with ``increase`` leave the same rows. Paired ratios against **none**, and of
**UPDATE after** to **one statement**; SQLite keeps no ``increase`` (all three run the same
statements there: a control). Medians with 95% bootstrap intervals::

    python bench/rollup_pass.py              # about 2 minutes on 2 busy cores
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
from typing import Any

from sqlalchemy import Connection, Engine, delete, select, text, update
from sqlalchemy.dialects import postgresql, sqlite

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dashboard_query import disposing
from fleet_day import Dataset, Group, dcgm_day
from fleet_day import Series as FleetSeries
from remote_write import interval
from storage_write import DEFAULT_URL, machine
from store_compaction import build_template, log, template_url

from collector.sources import dcgm_fields
from tuneloop.storage import make_engine
from tuneloop.storage.models import ROLLUP_TABLES, RollupState, Series, samples, samples_1m
from tuneloop.storage.timeseries import rollups
from tuneloop.storage.timeseries.counter_increase import update_increase
from tuneloop.storage.timeseries.rollups import (
    DEFAULT_LATENESS_S,
    MINUTE_S,
    PARTIAL_FIELDS,
    floor_time,
)

LATENESS = timedelta(seconds=DEFAULT_LATENESS_S)
CONTENDERS = ("none", "UPDATE after", "one statement")


def default_fields(data: Dataset) -> Dataset:
    """``data`` with every metric field of dcgm-exporter's default list on each GPU (25, the
    energy counter one of them): the fields ``fleet_day`` does not make carry a copy of the
    GPU's utilization (a rollup's work does not depend on the values)."""
    fields = [field for field in dcgm_fields.load_counters() if not field.is_label]
    groups = []
    for group in data.groups:
        series = list(group.series)
        for util in (s for s in group.series if s.metric == "DCGM_FI_DEV_GPU_UTIL"):
            have = {s.metric for s in group.series if s.labels == util.labels}
            series += [
                FleetSeries(field.name, util.labels, field.kind, util.values)
                for field in fields
                if field.name not in have
            ]
        groups.append(Group(group.stamps_us, series))
    return Dataset(data.name, data.start, data.end, groups)


def upsert_minutes(connection: Connection, level: Any, begin: datetime, end: datetime) -> int:
    """The 1-minute upsert without ``increase``: the statement as it was before migration
    0015, the rows (count, sum, min, max, last, last_ts) only."""
    dialect = connection.dialect.name
    table = ROLLUP_TABLES[level.resolution_s]
    ts = samples.c.ts
    rows = (
        rollups.partial_rows(samples, MINUTE_S, dialect, PARTIAL_FIELDS, ts >= begin, ts < end)
        .join_from(samples, Series, Series.id == samples.c.series_id)
        .subquery("rows")
    )
    merged = select(
        rows.c.series_id,
        rows.c.bucket,
        *(rollups.merge(rows, field, dialect) for field in PARTIAL_FIELDS),
    ).group_by(rows.c.series_id, rows.c.bucket)
    insert = postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)
    insert = insert.from_select(["series_id", "bucket", *PARTIAL_FIELDS], merged)
    statement = insert.on_conflict_do_update(
        index_elements=[table.c.series_id, table.c.bucket],
        set_={field: insert.excluded[field] for field in PARTIAL_FIELDS},
    )
    result = connection.execute(statement.execution_options(preserve_rowcount=True))
    return max(result.rowcount, 0)


def upsert_then_update(connection: Connection, level: Any, begin: datetime, end: datetime) -> int:
    """The pass's statements until the increase joined the upsert."""
    upserted = upsert_minutes(connection, level, begin, end)
    update_increase(connection, begin, end)
    return upserted


@contextmanager
def contender(name: str) -> Iterator[None]:
    """The rollup pass as ``name`` runs it: the 1-minute level's statements swapped."""
    replacement = {"none": upsert_minutes, "UPDATE after": upsert_then_update}.get(name)
    original = rollups._upsert_buckets
    if replacement is not None:

        def swapped(connection: Connection, level: Any, begin: datetime, end: datetime) -> int:
            if level.source is not samples:  # the hourly level as it is
                return original(connection, level, begin, end)
            return replacement(connection, level, begin, end)

        rollups._upsert_buckets = swapped
    try:
        yield
    finally:
        rollups._upsert_buckets = original


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


def minute_rows(engine: Engine, begin: datetime) -> list[tuple[Any, ...]]:
    """Every 1-minute row from two minutes before ``begin`` (what a pass rewrites)."""
    with engine.connect() as connection:
        found = connection.execute(
            select(samples_1m)
            .where(samples_1m.c.bucket >= begin - LATENESS)
            .order_by(samples_1m.c.series_id, samples_1m.c.bucket)
        )
        return [tuple(row) for row in found]


def one_pass(engine: Engine, begin: datetime, end: datetime, name: str) -> float:
    reset(engine, begin, end)
    with contender(name):
        began = time.perf_counter()
        upserted = rollups.update_rollups(engine, now=end + LATENESS)
        seconds = time.perf_counter() - began
    assert upserted[MINUTE_S] > 0 and upserted[rollups.HOUR_S] == 0, upserted
    return seconds


def check(engine: Engine, begin: datetime, end: datetime) -> None:
    """The two passes with ``increase`` leave the same rows, and (PostgreSQL) the counters'
    new minutes hold one."""
    left = {}
    for name in CONTENDERS[1:]:
        one_pass(engine, begin, end, name)
        left[name] = minute_rows(engine, begin)
    assert left["UPDATE after"] == left["one statement"], "the passes leave different rows"
    index = [column.name for column in samples_1m.c].index("increase")
    held = sum(row[index] is not None for row in left["one statement"])
    log(
        f"  both passes leave the same {len(left['one statement']):,} rows; {held} hold an increase"
    )
    assert held > 0 or engine.dialect.name != "postgresql", "the pass set no increase"


def measure(engine: Engine, begin: datetime, end: datetime, repeats: int) -> dict[str, list[float]]:
    """Seconds of the pass of each contender, interleaved, the order rotating."""
    check(engine, begin, end)
    times: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    for round_ in range(repeats):
        shift = round_ % len(CONTENDERS)
        for name in CONTENDERS[shift:] + CONTENDERS[:shift]:
            times[name].append(one_pass(engine, begin, end, name))
        if (round_ + 1) % 20 == 0:
            log(f"  {round_ + 1}/{repeats} rounds")
    return times


def fmt(values: list[float]) -> str:
    median, low, high = interval(values)
    return f"{median * 1000:.1f} [{low * 1000:.1f}-{high * 1000:.1f}]"


def ratio(numerator: list[float], denominator: list[float]) -> str:
    median, low, high = interval([a / b for a, b in zip(numerator, denominator, strict=True)])
    return f"**{median:.3f}** [{low:.3f}-{high:.3f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=1.0, help="data loaded")
    parser.add_argument("--span", type=int, default=10, help="new minutes in the timed pass")
    parser.add_argument("--repeats", type=int, default=101)
    parser.add_argument(
        "--default-fields",
        action="store_true",
        help="every field of dcgm-exporter's default list (energy 1 series in 25, not 1 in 10)",
    )
    parser.add_argument(
        "--stores", nargs="+", choices=("PostgreSQL", "SQLite"), default=["PostgreSQL", "SQLite"]
    )
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL))
    args = parser.parse_args(argv)
    data = dcgm_day(hours=args.hours)
    if args.default_fields:
        data = default_fields(data)
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
                times = measure(engine, begin, end, args.repeats)
                loads.append(os.getloadavg()[0])
        none, before, now = (times[name] for name in CONTENDERS)
        lines.append(
            f"| {kind} | {fmt(none)} | {fmt(before)} | {fmt(now)} | {ratio(before, none)} "
            f"| {ratio(now, none)} | {ratio(before, now)} |"
        )
    print(f"\n{server}; load average {min(loads):.1f} to {max(loads):.1f}")
    print(
        f"one pass: {args.span} new minutes + {DEFAULT_LATENESS_S // 60} recomputed, "
        f"{data.series:,} series; median of {args.repeats}, [95% interval]; times in ms\n"
    )
    print(
        "| database | none ms | UPDATE after ms | one statement ms | UPDATE after / none "
        "| one statement / none | UPDATE after / one statement |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
