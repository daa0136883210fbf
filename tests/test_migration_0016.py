"""Migration 0016 stops grouping the 1-minute rollup rows of the Cost dashboard's functions:
``tuneloop_gpu_usage`` and ``tuneloop_gpu_cost`` answer the same to the bit before and after
it, over rollup minutes, raw rows after the watermark and a minute the two would share if
grouping mattered; on real PostgreSQL (SQLite has no stored functions)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text

from tests.storage_compaction.fleet import HOURS, T, fleet, make_project, write
from tuneloop.storage import make_engine, migrate
from tuneloop.storage.timeseries.rollups import update_rollups

pytestmark = pytest.mark.postgres
RANGES = [
    (T, T + timedelta(hours=HOURS)),
    (T + timedelta(minutes=7, seconds=30), T + timedelta(hours=2, minutes=11, seconds=5)),
    (T + timedelta(hours=1, minutes=30), T + timedelta(hours=1, minutes=31)),
]


def answers(engine: Engine) -> list[Any]:
    out = []
    with engine.connect() as connection:
        for start, end in RANGES:
            for function in ("tuneloop_gpu_usage", "tuneloop_gpu_cost"):
                rows = connection.execute(
                    text(f"SELECT * FROM {function}('p', :start, :end, 5.0)"),
                    {"start": start, "end": end},
                )
                # Equal as numbers (Decimal compares by value, whatever its scale).
                out.append((function, start, sorted((tuple(row) for row in rows), key=str)))
    return out


@pytest.mark.parametrize("empty_database_url", ["postgresql"], indirect=True)
def test_the_cost_functions_answer_the_same_after_0016(empty_database_url: str) -> None:
    url = empty_database_url
    migrate.upgrade(url)
    engine = make_engine(url)
    try:
        write(engine, make_project(engine, "p"), fleet())
        # Rolled up to the middle of the data: rollup minutes before, raw rows after.
        update_rollups(engine, now=T + timedelta(hours=1, minutes=30, seconds=40))
        with engine.begin() as connection:
            # A price for all, a change in the range, and one the project's own from later.
            connection.execute(
                text(
                    "INSERT INTO gpu_prices (project_id, model, capacity_type, "
                    "price_per_gpu_hour, currency, valid_from, created_at) VALUES "
                    "(NULL, '*', 'on_demand', 2.5, 'USD', NULL, now()), "
                    "(NULL, 'H*', 'on_demand', 3.25, 'USD', :change, now()), "
                    "((SELECT id FROM projects WHERE name = 'p'), 'H100', 'on_demand', 1.75, "
                    "'USD', :own, now()), "
                    "(NULL, '*', 'spot', 0.5, 'USD', :change, now())"
                ),
                {"change": T + timedelta(minutes=50), "own": T + timedelta(hours=2, minutes=5)},
            )
        after = answers(engine)
        assert all(rows for _, _, rows in after)
        engine.dispose()
        migrate.downgrade(url, "0015")
        assert answers(engine) == after
        migrate.upgrade(url)
        assert answers(engine) == after
    finally:
        engine.dispose()
