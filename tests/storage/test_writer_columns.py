"""SampleWriter with SampleColumns blocks, on real SQLite and real PostgreSQL: a block stores
exactly what the batches it means store (series, times, values, rejections), whichever path it
takes through the writer."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from sqlalchemy import Engine, select

from tests.storage.test_writer import make_project
from tuneloop.storage.models import Series, samples
from tuneloop.storage.timeseries.columns import (
    Batch,
    SampleColumns,
    SeriesTable,
    expand,
)
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind, WriteResult
from tuneloop.storage.timeseries.writer import SampleWriter

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Two minutes before midnight: the samples cross into the next day's partition.
T0_US = (datetime(2024, 3, 10, 23, 58, 0, 123456, tzinfo=UTC) - EPOCH) // timedelta(microseconds=1)
STEP_US = 15_000_000


def table(count: int = 4, metric: str = "gpu_utilization") -> SeriesTable:
    return SeriesTable(
        tuple(metric if i % 2 else f"{metric}_total" for i in range(count)),
        tuple({"gpu": str(i), "host": "node-1"} for i in range(count)),
        tuple(SeriesKind.GAUGE if i % 2 else SeriesKind.COUNTER for i in range(count)),
    )


def block(
    series_table: SeriesTable, points: int = 12, seed: int = 1, first: int = 0
) -> SampleColumns:
    """``points`` samples per series, the series interleaved as a periodic exporter sends,
    from step ``first`` on."""
    rng = np.random.default_rng(seed)
    count = len(series_table)
    series = np.tile(np.arange(count, dtype=np.intp), points)
    steps = np.arange(first, first + points, dtype=np.int64)
    micros = np.repeat(T0_US + STEP_US * steps, count)
    values = rng.normal(size=count * points) * 1e6
    return SampleColumns(series_table, series, micros, values)


def stored_by_series(
    engine: Engine, project_id: int
) -> dict[tuple[object, ...], list[tuple[datetime, float]]]:
    with engine.connect() as connection:
        series = {
            row.id: (row.metric, tuple(sorted(row.labels.items())), row.kind, row.fingerprint)
            for row in connection.execute(
                select(
                    Series.id, Series.metric, Series.labels, Series.kind, Series.fingerprint
                ).where(Series.project_id == project_id)
            )
        }
        rows = connection.execute(
            select(samples.c.series_id, samples.c.ts, samples.c.value)
            .where(samples.c.series_id.in_(list(series)))
            .order_by(samples.c.series_id, samples.c.ts)
        )
        out: dict[tuple[object, ...], list[tuple[datetime, float]]] = {
            key: [] for key in series.values()
        }
        for row in rows:
            out[series[row.series_id]].append((row.ts, row.value))
    # Sorted in full: two blocks may hold one series at one time (the table allows it).
    return {key: sorted(rows) for key, rows in out.items()}


def rejections(result: WriteResult) -> list[tuple[object, ...]]:
    return [
        (r.metric, dict(r.labels), r.samples, r.code, re.sub(r"project \d+", "", r.reason))
        for r in result.rejected
    ]


def same_as_batches(
    engine: Engine, parts: Sequence[Batch], *, cap: int = 1_000, twice: bool = False
) -> WriteResult:
    """Write ``parts`` to one project and the batches they mean to another; assert the two
    store and report the same. ``twice``: write again (the writer's caches warm)."""
    bulk, one_by_one = make_project(engine, "bulk"), make_project(engine, "batches")
    bulk_writer, batch_writer = SampleWriter(engine), SampleWriter(engine)
    for _ in range(2 if twice else 1):
        got = bulk_writer.write(bulk, parts, max_series=cap)
        want = batch_writer.write(one_by_one, expand(parts), max_series=cap)
        assert rejections(got) == rejections(want)
        assert (got.samples_written, got.series_created) == (
            want.samples_written,
            want.series_created,
        )
    assert stored_by_series(engine, bulk) == stored_by_series(engine, one_by_one)
    return got


def test_a_block_stores_what_its_batches_store(engine: Engine) -> None:
    result = same_as_batches(engine, [block(table())], twice=True)
    assert result.samples_written == 48 and not result.rejected


def test_blocks_and_batches_mixed_in_one_write(engine: Engine) -> None:
    shared = table(3)
    lone = SeriesBatch(
        "other", {"a": "b"}, [EPOCH + timedelta(microseconds=T0_US)], [1.5], SeriesKind.GAUGE
    )
    parts: list[Batch] = [lone, block(shared, 3), block(table(2, "mem"), 2, seed=2)]
    parts.append(block(shared, 5, seed=3))
    result = same_as_batches(engine, parts)
    assert result.samples_written == 1 + 9 + 4 + 15


def test_the_series_cap_refuses_the_same_series(engine: Engine) -> None:
    result = same_as_batches(engine, [block(table(6))], cap=4)
    assert [r.samples for r in result.rejected] == [12, 12]
    assert result.samples_written == 48


def test_nan_values_are_dropped_and_reported_as_for_batches(engine: Engine) -> None:
    with_nan = block(table(3), 4)
    with_nan.values[[1, 4, 5]] = np.nan
    with_nan.values[0] = np.inf
    result = same_as_batches(engine, [with_nan])
    assert sum(r.samples for r in result.rejected) == 3


def test_a_series_that_cannot_be_stored_is_refused_as_its_batch(engine: Engine) -> None:
    bad = SeriesTable(
        ("ok", "bad\x00name", "ok"),
        ({"i": "0"}, {"i": "1"}, {"i": "2", "x": "nul\x00"}),
        (SeriesKind.GAUGE,) * 3,
    )
    result = same_as_batches(engine, [block(bad, 2)])
    assert [r.code for r in result.rejected] == ["invalid_metric", "invalid_labels"]


def test_forgetting_a_project_resolves_its_tables_again(engine: Engine) -> None:
    project = make_project(engine)
    writer = SampleWriter(engine)
    shared = table()
    assert writer.write(project, [block(shared, 1)]).samples_written == 4
    writer.forget(project)
    assert writer.write(project, [block(shared, 2, seed=5, first=1)]).samples_written == 8
    assert sum(map(len, stored_by_series(engine, project).values())) == 12


def test_to_batches_groups_by_series_in_table_order() -> None:
    shared = table(2)
    columns = SampleColumns(
        shared,
        np.array([1, 0, 1], dtype=np.intp),
        np.array([T0_US + 2, T0_US + 1, T0_US], dtype=np.int64),
        np.array([3.0, 2.0, 1.0]),
    )
    batches = columns.to_batches()
    assert [(b.metric, b.values) for b in batches] == [
        ("gpu_utilization_total", [2.0]),
        ("gpu_utilization", [3.0, 1.0]),
    ]
    assert batches[1].timestamps[1] == EPOCH + timedelta(microseconds=T0_US)


@pytest.mark.parametrize(
    ("series", "micros", "values"),
    [
        (np.array([0, 2], dtype=np.intp), np.zeros(2, np.int64), np.zeros(2)),
        (np.array([0], dtype=np.intp), np.zeros(2, np.int64), np.zeros(2)),
        (np.array([0], dtype=np.int32), np.zeros(1, np.int64), np.zeros(1)),
        (np.array([0], dtype=np.intp), np.array([2**62], np.int64), np.zeros(1)),
    ],
)
def test_columns_that_do_not_fit_are_refused(
    series: np.ndarray, micros: np.ndarray, values: np.ndarray
) -> None:
    with pytest.raises(ValueError):
        SampleColumns(table(2), series, micros, values)
