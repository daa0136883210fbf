"""The dashboards' SQL functions over compacted samples, on real PostgreSQL (the only backend
with them; migration 0015): ``tuneloop_series`` and ``tuneloop_gpu_usage`` answered before and
after ``compact`` on the same fleet (tests/storage_compaction/fleet.py: 15 s samples with
jitter, an energy counter that restarts half way).

- ``tuneloop_series`` at a minute or coarser gives the same rows after compaction; under a
  minute, it gives the 1-minute rows inside the compacted spans and raw rows elsewhere.
- The energy is the same for every range whose edges are whole minutes; an edge inside a
  compacted minute counts the minutes that start in the range. GPU time and
  ``tuneloop_gpu_cost`` (rollups, and raw rows after the watermark) are the same throughout.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text, update

from tests.storage_compaction.fleet import (
    ENERGY,
    HOURS,
    NOW,
    POWER,
    UTIL,
    T,
    fleet,
    make_project,
    write,
)
from tuneloop import cost
from tuneloop.storage import make_engine, migrate
from tuneloop.storage.models import samples_1m
from tuneloop.storage.timeseries.compaction import compact
from tuneloop.storage.timeseries.counter_increase import fill_increase
from tuneloop.storage.timeseries.rollups import update_rollups
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind

pytestmark = pytest.mark.postgres

POSTGRES = [pytest.param("postgresql", id="postgresql")]
MINUTE = timedelta(minutes=1)
Row = tuple[Any, ...]


@pytest.fixture
def store(empty_database_url: str) -> Iterator[Engine]:
    """The fleet written and rolled up on a database migrated to the newest revision."""
    migrate.upgrade(empty_database_url)
    engine = make_engine(empty_database_url)
    write(engine, make_project(engine, "p"), fleet())
    update_rollups(engine, now=NOW)
    yield engine
    engine.dispose()


def series(engine: Engine, metric: str, start: datetime, end: datetime, step_ms: int) -> list[Row]:
    with engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT series_id, bucket, avg, min, max, sum, count "
                "FROM tuneloop_series('p', :metric, :start, :end, :step) ORDER BY 1, 2"
            ),
            {"metric": metric, "start": start, "end": end, "step": step_ms},
        )
        return [tuple(row) for row in rows]


def usage(engine: Engine, start: datetime, end: datetime) -> dict[str, tuple[float, ...]]:
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT * FROM tuneloop_gpu_usage('p', :start, :end, 5.0)"),
            {"start": start, "end": end},
        ).mappings()
        return {
            row["labels"]["UUID"]: (
                row["gpu_seconds"],
                row["idle_gpu_seconds"],
                row["energy_joules"],
            )
            for row in rows
        }


def energy(engine: Engine, start: datetime, end: datetime) -> dict[str, float]:
    return {gpu: figures[2] for gpu, figures in usage(engine, start, end).items()}


SERIES_READS = [
    # (range, panel interval): resolutions 3600, 60 and 60 (a long range at a short interval)
    ((T, T + timedelta(days=4)), 3_600_000),
    ((T + timedelta(minutes=7, seconds=30), T + timedelta(hours=HOURS)), 60_000),
    ((T - timedelta(hours=2), T + timedelta(hours=5)), 15_000),
]
ENERGY_RANGES = [
    (T, T + timedelta(hours=HOURS)),
    (T - timedelta(hours=1), NOW),
    (T + timedelta(minutes=37), T + timedelta(hours=2, minutes=11)),  # across chunk edges
    (T + timedelta(hours=1), T + timedelta(hours=2)),  # exactly one chunk
    (T + timedelta(hours=1, minutes=30), T + timedelta(hours=1, minutes=31)),  # the restart
]


@pytest.mark.parametrize("empty_database_url", POSTGRES, indirect=True)
def test_series_at_a_minute_or_coarser_is_unchanged_by_compaction(store: Engine) -> None:
    before = {
        (metric, bounds, step): series(store, metric, *bounds, step)
        for metric in (UTIL, POWER)
        for bounds, step in SERIES_READS
    }
    assert all(before.values())

    assert compact(store, hot_window=timedelta(0), now=NOW).chunks_written

    assert {key: series(store, *key[:1], *key[1], key[2]) for key in before} == before


@pytest.mark.parametrize("empty_database_url", POSTGRES, indirect=True)
def test_series_under_a_minute_reads_minutes_where_compacted_and_rows_elsewhere(
    store: Engine,
) -> None:
    start, end = T + timedelta(minutes=30), T + timedelta(hours=1, minutes=30)
    raw_before = series(store, UTIL, start, end, 15_000)
    minutes = series(store, UTIL, start, end, 60_000)
    assert len(raw_before) > len(minutes) > 0
    # The first hour compacted, the rest raw: the range crosses the boundary at T + 1 h.
    compact(store, hot_window=timedelta(hours=1), now=T + timedelta(hours=2, minutes=30))
    boundary = T + timedelta(hours=1)

    after = series(store, UTIL, start, end, 15_000)

    expected = sorted(
        [row for row in minutes if row[1] < boundary]
        + [row for row in raw_before if row[1] >= boundary]
    )
    assert after == expected
    # Everything compacted: minute buckets all along, as the 1-minute resolution reads them.
    compact(store, hot_window=timedelta(0), now=NOW)
    assert series(store, UTIL, start, end, 15_000) == minutes


@pytest.mark.parametrize("empty_database_url", POSTGRES, indirect=True)
def test_energy_and_usage_are_unchanged_by_compaction_for_whole_minute_edges(
    store: Engine,
) -> None:
    before = {bounds: usage(store, *bounds) for bounds in ENERGY_RANGES}
    assert all(figures[2] > 0 for gpus in before.values() for figures in gpus.values())

    # Part compacted (the frontier at T + 1 h, inside most ranges), then everything.
    compacted = compact(
        store, hot_window=timedelta(hours=1), now=T + timedelta(hours=2, minutes=30)
    )
    assert compacted.chunks_written == 12  # one hour of the fleet's 12 series
    assert {bounds: usage(store, *bounds) for bounds in ENERGY_RANGES} == before
    compact(store, hot_window=timedelta(0), now=NOW)
    assert {bounds: usage(store, *bounds) for bounds in ENERGY_RANGES} == before


@pytest.mark.parametrize("empty_database_url", POSTGRES, indirect=True)
def test_the_cost_function_is_unchanged_by_compaction(store: Engine) -> None:
    with store.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO gpu_prices (model, capacity_type, price_per_gpu_hour, currency, "
                "created_at) VALUES ('*', 'on_demand', 2.5, 'USD', now())"
            )
        )
    before = {bounds: money(store, *bounds) for bounds in ENERGY_RANGES}
    assert all(cost_ for rows in before.values() for _, cost_, _ in rows)

    assert compact(store, hot_window=timedelta(0), now=NOW).chunks_written

    assert {bounds: money(store, *bounds) for bounds in ENERGY_RANGES} == before


def money(engine: Engine, start: datetime, end: datetime) -> list[Row]:
    with engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT labels->>'UUID', cost, idle_cost "
                "FROM tuneloop_gpu_cost('p', :start, :end, 5.0) ORDER BY 1"
            ),
            {"start": start, "end": end},
        )
        return [tuple(row) for row in rows]


@pytest.mark.parametrize("empty_database_url", POSTGRES, indirect=True)
def test_an_edge_inside_a_compacted_minute_counts_the_minutes_starting_in_the_range(
    store: Engine,
) -> None:
    edge = timedelta(seconds=20)
    start, end = T + timedelta(minutes=30), T + timedelta(hours=2, minutes=10)
    # Raw rows answer exactly: the pairs whose later sample lies in the range.
    expected = energy(store, start + MINUTE, end + MINUTE)
    exact = energy(store, start + edge, end + edge)
    assert exact != expected

    compact(store, hot_window=timedelta(0), now=NOW)

    # The minute holding the start is left out, the minute holding the end counted whole.
    assert energy(store, start + edge, end + edge) == expected


@pytest.mark.parametrize("empty_database_url", POSTGRES, indirect=True)
def test_a_late_sample_in_a_compacted_span_is_left_out_of_the_energy(store: Engine) -> None:
    compact(store, hot_window=timedelta(0), now=NOW)
    bounds = (T, T + timedelta(hours=HOURS))
    before = energy(store, *bounds)
    late = T + timedelta(minutes=10, seconds=14, milliseconds=999)  # between two samples
    with store.connect() as connection:
        (series_id,) = connection.execute(
            text("SELECT id FROM series WHERE metric = :metric ORDER BY id LIMIT 1"),
            {"metric": ENERGY},
        ).one()
    write(
        store,
        1,
        [SeriesBatch(ENERGY, _labels(store, series_id), [late], [1e12], SeriesKind.COUNTER)],
    )

    assert energy(store, *bounds) == before  # no rollup holds it: nor does the function
    assert compact(store, hot_window=timedelta(0), now=NOW).late_samples_merged == 1
    assert energy(store, *bounds) == before


def _labels(engine: Engine, series_id: int) -> dict[str, str]:
    with engine.connect() as connection:
        labels = connection.execute(
            text("SELECT labels FROM series WHERE id = :id"), {"id": series_id}
        ).scalar_one()
    return dict(labels)


@pytest.mark.parametrize("empty_database_url", POSTGRES, indirect=True)
def test_the_increase_of_existing_rows_is_filled_from_rows_and_chunks(store: Engine) -> None:
    compact(store, hot_window=timedelta(hours=1), now=T + timedelta(hours=2, minutes=30))
    with store.connect() as connection:
        filled = list(connection.execute(text(_INCREASES)))
        connection.execute(update(samples_1m).values(increase=None))
        connection.commit()
        assert fill_increase(connection, NOW) == len(filled)
        connection.commit()
        assert list(connection.execute(text(_INCREASES))) == filled
    # Only the counter has one (every minute the fleet wrote, per GPU).
    assert len(filled) == 2 * HOURS * 60
    assert {row[0] for row in filled} == {ENERGY}


@pytest.mark.parametrize("empty_database_url", POSTGRES, indirect=True)
def test_the_migration_fills_the_increase_and_its_downgrade_restores_the_functions(
    store: Engine, empty_database_url: str
) -> None:
    compact(store, hot_window=timedelta(0), now=NOW)
    bounds = (T, T + timedelta(hours=HOURS))
    after = usage(store, *bounds)
    store.dispose()

    migrate.downgrade(empty_database_url, "0014")
    # 0011's function: blind to the compacted energy.
    assert {gpu: f[2] for gpu, f in usage(store, *bounds).items()} == {"GPU-0": 0, "GPU-1": 0}
    migrate.upgrade(empty_database_url)

    assert usage(store, *bounds) == after


@pytest.mark.parametrize("empty_database_url", POSTGRES, indirect=True)
def test_the_rollup_passes_give_each_minute_the_growth_of_the_pairs_ending_in_it(
    empty_database_url: str,
) -> None:
    migrate.upgrade(empty_database_url)
    engine = make_engine(empty_database_url)
    try:
        write(engine, make_project(engine, "p"), fleet())
        # Many small passes and transactions: the pair across each edge starts in a minute
        # an earlier transaction or pass wrote.
        for minutes in range(0, HOURS * 60 + 10, 37):
            update_rollups(engine, now=T + timedelta(minutes=minutes), chunk=timedelta(minutes=7))
        update_rollups(engine, now=NOW)
        with engine.connect() as connection:
            stored = {(row[1], row[2]): row[3] for row in connection.execute(text(_INCREASES))}
            points = connection.execute(
                text(
                    "SELECT x.series_id, x.ts, x.value FROM samples AS x "
                    "JOIN series AS s ON s.id = x.series_id WHERE s.metric = :metric "
                    "ORDER BY 1, 2"
                ),
                {"metric": ENERGY},
            ).all()
    finally:
        engine.dispose()
    expected: dict[tuple[int, datetime], float] = {}
    for (series_id, ts, value), previous in zip(points, [None, *points[:-1]], strict=True):
        minute = ts.replace(second=0, microsecond=0)
        growth = 0.0
        if previous is not None and previous[0] == series_id:
            growth = cost.counter_growth([previous[2], value])
        expected[series_id, minute] = expected.get((series_id, minute), 0.0) + growth
    assert stored == expected


_INCREASES = """
SELECT s.metric, m.series_id, m.bucket, m.increase FROM samples_1m AS m
JOIN series AS s ON s.id = m.series_id WHERE m.increase IS NOT NULL ORDER BY 2, 3
"""


@pytest.mark.parametrize("empty_database_url", POSTGRES, indirect=True)
def test_chunks_of_two_widths_sharing_time_count_each_minute_once(store: Engine) -> None:
    start, end = T + timedelta(minutes=30), T + timedelta(hours=2, minutes=30)
    minutes = series(store, UTIL, start, end, 60_000)
    before = {bounds: usage(store, *bounds) for bounds in ENERGY_RANGES}
    # One-hour chunks for the first hour, then (as a store that went on with wider chunks
    # the same day) wide ones spanning it.
    compact(store, hot_window=timedelta(0), now=T + timedelta(hours=1), min_samples=1)
    compact(store, hot_window=timedelta(0), now=NOW, min_samples=500)
    with store.connect() as connection:
        spans = connection.execute(text("SELECT DISTINCT start_ts, end_ts FROM sample_chunks"))
        widths = {end_ts - start_ts for start_ts, end_ts in spans}
    assert timedelta(hours=1) in widths and max(widths) > timedelta(hours=HOURS)

    assert series(store, UTIL, start, end, 15_000) == minutes
    assert {bounds: usage(store, *bounds) for bounds in ENERGY_RANGES} == before
