"""The energy counter's ``samples_1m.increase``, written by the 1-minute rollup upsert itself,
is what the pass's former second statement (``counter_increase.update_increase`` after the
upsert) made of it, chunk by chunk, on real SQLite and real PostgreSQL: counters that reset,
that pause for minutes, that get samples late (inside the lateness the pass recomputes, and
beyond it), passes of many small chunks whose edges fall inside the data.

The check: after each chunk's upsert, in its transaction, the old statement runs on the same
rows and must find nothing to change (it rewrites only rows whose figure differs, NULL
included). Every chunk then starts from what the old pass left, so the passes are equal.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, insert, select

from tuneloop.cost import ENERGY_METRIC
from tuneloop.storage.models import Project, Series, samples_1m
from tuneloop.storage.timeseries import rollups
from tuneloop.storage.timeseries.counter_increase import update_increase
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter

T0 = datetime(2024, 3, 1, 23, 20, tzinfo=UTC)  # crosses midnight: two partitions
MINUTES = 70
LATENESS = timedelta(seconds=rollups.DEFAULT_LATENESS_S)


def counter(gpu: int) -> tuple[list[datetime], list[float]]:
    """Samples every 10-25 s (uneven, a minute may hold one or several), a pause of 6 minutes,
    and a reset to a small value half way: each GPU at its own offsets."""
    times, values, value, at = [], [], 1e9 * (gpu + 1), T0 + timedelta(seconds=gpu * 7)
    step = 0
    while at < T0 + timedelta(minutes=MINUTES):
        pause = T0 + timedelta(minutes=20 + gpu) <= at < T0 + timedelta(minutes=26 + gpu)
        if not pause:
            value = 3.0 + gpu if step == 150 + gpu * 5 else value + 1000 * ((step * 13) % 7 + 1)
            times.append(at)
            values.append(value)
        step += 1
        at += timedelta(seconds=10 + (step * 7 + gpu) % 16)
    return times, values


def write(engine: Engine, project: int, batches: list[SeriesBatch]) -> None:
    assert not SampleWriter(engine).write(project, batches).rejected


def fleet(engine: Engine) -> int:
    with engine.begin() as connection:
        key = connection.execute(insert(Project).values(name="p")).inserted_primary_key
    assert key is not None
    project = int(key[0])
    batches = []
    for gpu in range(3):
        times, values = counter(gpu)
        labels = {"gpu": str(gpu)}
        batches.append(SeriesBatch(ENERGY_METRIC, labels, times, values, SeriesKind.COUNTER))
        batches.append(SeriesBatch("DCGM_FI_DEV_POWER_USAGE", labels, times, values))
    write(engine, project, batches)
    return project


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Runs the old second statement after each 1-minute upsert; yields the counter rows each
    one found to change (all must be 0)."""
    changed: list[int] = []
    upsert = rollups._upsert_buckets

    def upsert_then_check(
        connection: Connection, level: Any, begin: datetime, end: datetime
    ) -> int:
        upserted = upsert(connection, level, begin, end)
        if level.resolution_s == rollups.MINUTE_S:
            changed.append(update_increase(connection, begin, end))
        return upserted

    monkeypatch.setattr(rollups, "_upsert_buckets", upsert_then_check)
    yield changed


def increases(engine: Engine) -> dict[tuple[str, int, datetime], float | None]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(
                Series.metric, samples_1m.c.series_id, samples_1m.c.bucket, samples_1m.c.increase
            )
            .join_from(samples_1m, Series, Series.id == samples_1m.c.series_id)
            .order_by(samples_1m.c.series_id, samples_1m.c.bucket)
        )
        return {(row[0], row[1], row[2]): row[3] for row in rows}


def test_the_upsert_writes_the_increase_the_update_after_it_wrote(
    engine: Engine, checked: list[int]
) -> None:
    project = fleet(engine)
    chunk = timedelta(minutes=7)
    for minutes in range(3, MINUTES // 2, 4):
        rollups.update_rollups(engine, now=T0 + timedelta(minutes=minutes), chunk=chunk)
    with engine.connect() as connection:
        watermark = rollups.read_watermarks(connection)[rollups.MINUTE_S]
    # Late samples of GPU 0's counter: one inside the lateness the next pass recomputes (it
    # moves that minute's increase and the next one's), one beyond it (no rollup takes it).
    late = [watermark - timedelta(seconds=30), watermark - LATENESS - timedelta(seconds=30)]
    labels = {"gpu": "0"}
    write(
        engine,
        project,
        [SeriesBatch(ENERGY_METRIC, labels, late, [5e12, 6e12], SeriesKind.COUNTER)],
    )
    for minutes in range(MINUTES // 2, MINUTES + 5, 5):
        rollups.update_rollups(engine, now=T0 + timedelta(minutes=minutes), chunk=chunk)

    assert len(checked) > 10 and checked == [0] * len(checked)
    found = increases(engine)
    counters = {key: value for key, value in found.items() if key[0] == ENERGY_METRIC}
    assert len(counters) > 150
    assert all(value is None for key, value in found.items() if key[0] != ENERGY_METRIC)
    if engine.dialect.name == "sqlite":  # no SQL function reads it there: the column stays NULL
        assert all(value is None for value in counters.values())
        return
    assert all(value is not None for value in counters.values())
    # The late sample inside the lateness is in: 5e12 grew.
    assert max(value or 0 for value in counters.values()) >= 4e12
