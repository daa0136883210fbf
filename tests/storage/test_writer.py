"""SampleWriter on real SQLite and real PostgreSQL: round trip, series reuse, the series cap,
concurrent writers and per-batch rejection of bad input."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import Engine, delete, func, insert, select

from tuneloop.storage.models import Project, Series, samples
from tuneloop.storage.timeseries.types import RejectionCode, SeriesBatch, SeriesKind, WriteResult
from tuneloop.storage.timeseries.writer import SampleWriter

T0 = datetime(2024, 3, 10, 12, 0, 0, 123456, tzinfo=UTC)


def make_project(engine: Engine, name: str = "p") -> int:
    with engine.begin() as connection:
        key = connection.execute(insert(Project).values(name=name)).inserted_primary_key
    assert key is not None
    return int(key[0])


def batch(
    metric: str = "DCGM_FI_DEV_GPU_UTIL",
    gpu: str = "0",
    count: int = 3,
    start: datetime = T0,
    step: timedelta = timedelta(seconds=15),
    **extra: Any,
) -> SeriesBatch:
    return SeriesBatch(
        metric=metric,
        labels={"gpu": gpu, "Hostname": "node-1"},
        timestamps=[start + step * i for i in range(count)],
        values=[float(i) + 0.5 for i in range(count)],
        **extra,
    )


def untyped(
    metric: Any, labels: Any, timestamps: Any, values: Any, kind: Any = "gauge"
) -> SeriesBatch:
    """A batch as a careless caller (JSON decoded, no type checker) could send it."""
    return SeriesBatch(metric, labels, timestamps, values, kind)


def stored(engine: Engine) -> list[tuple[int, datetime, float]]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(samples.c.series_id, samples.c.ts, samples.c.value).order_by(
                samples.c.series_id, samples.c.ts
            )
        )
        return [(row.series_id, row.ts, row.value) for row in rows]


def series_count(engine: Engine, project_id: int) -> int:
    with engine.connect() as connection:
        return connection.execute(
            select(func.count()).select_from(Series).where(Series.project_id == project_id)
        ).scalar_one()


def reasons(result: WriteResult) -> list[str]:
    return [rejection.reason for rejection in result.rejected]


def test_round_trip_is_exact(engine: Engine) -> None:
    project = make_project(engine)
    india = timezone(timedelta(hours=5, minutes=30))
    timestamps = [
        T0,
        T0 + timedelta(microseconds=1),
        (T0 + timedelta(days=1, microseconds=999_999)).astimezone(india),
        datetime(1999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
    ]
    values = [0.1, -1e-300, 1.7976931348623157e308, math.inf]
    result = SampleWriter(engine).write(
        project,
        [
            SeriesBatch(
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                {"gpu": "3", "UUID": "GPU-ab12"},
                timestamps,
                values,
                SeriesKind.COUNTER,
            )
        ],
    )
    assert result == WriteResult(samples_written=4, series_created=1)
    with engine.connect() as connection:
        series = connection.execute(select(Series.__table__)).one()
    assert (series.project_id, series.metric, series.kind) == (
        project,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "counter",
    )
    assert series.labels == {"gpu": "3", "UUID": "GPU-ab12"}
    expected = sorted(
        (series.id, ts.astimezone(UTC), value) for ts, value in zip(timestamps, values)
    )
    rows = stored(engine)
    assert rows == expected
    assert all(ts.tzinfo is not None and ts.utcoffset() == timedelta(0) for _, ts, _ in rows)


def test_series_are_reused_across_calls_and_by_a_cold_writer(engine: Engine) -> None:
    project = make_project(engine)
    first = SampleWriter(engine).write(project, [batch(), batch(gpu="1")])
    again = SampleWriter(engine)
    later = T0 + timedelta(hours=1)  # new samples: samples already stored are skipped
    second = again.write(project, [batch(start=later), batch(gpu="1", start=later)])
    third = again.write(project, [batch(start=T0 + timedelta(hours=2))])
    assert [r.series_created for r in (first, second, third)] == [2, 0, 0]
    assert [r.samples_written for r in (first, second, third)] == [6, 6, 3]
    assert series_count(engine, project) == 2
    assert len(stored(engine)) == 15


def test_same_labels_in_another_project_are_another_series(engine: Engine) -> None:
    one, two = make_project(engine, "one"), make_project(engine, "two")
    writer = SampleWriter(engine)
    assert writer.write(one, [batch()]).series_created == 1
    assert writer.write(two, [batch()]).series_created == 1
    assert {row[0] for row in stored(engine)} == {1, 2}


def test_duplicate_series_in_one_call_is_created_once(engine: Engine) -> None:
    project = make_project(engine)
    result = SampleWriter(engine, max_series_per_project=1).write(
        project, [batch(), batch(start=T0 + timedelta(hours=1))]
    )
    assert (result.series_created, result.samples_written, result.rejected) == (1, 6, [])


def test_series_cap_rejects_only_the_excess_within_one_call(engine: Engine) -> None:
    project = make_project(engine)
    writer = SampleWriter(engine, max_series_per_project=3)
    result = writer.write(project, [batch(gpu=str(gpu), count=2) for gpu in range(5)])
    assert (result.series_created, result.samples_written) == (3, 6)
    assert [r.labels["gpu"] for r in result.rejected] == ["3", "4"]
    assert result.samples_rejected == 4
    assert all("max_series_per_project=3" in reason for reason in reasons(result))
    assert all("at most 3 series" in reason for reason in reasons(result))
    assert {r.code for r in result.rejected} == {RejectionCode.SERIES_LIMIT}
    # Existing series keep being written once the cap is reached; new ones are still refused,
    # also by a cold writer that has to count them in the database.
    later = SampleWriter(engine, max_series_per_project=3).write(
        project, [batch(gpu="0", start=T0 + timedelta(hours=1)), batch(gpu="9")]
    )
    assert (later.series_created, later.samples_written, later.samples_rejected) == (0, 3, 3)
    assert series_count(engine, project) == 3


def test_per_call_cap_overrides_the_writer_cap(engine: Engine) -> None:
    project = make_project(engine)
    writer = SampleWriter(engine, max_series_per_project=100)
    result = writer.write(project, [batch(gpu=str(g)) for g in range(3)], max_series=1)
    assert (result.series_created, len(result.rejected)) == (1, 2)
    assert "max_series_per_project=1" in result.rejected[0].reason


def test_concurrent_writers_do_not_overshoot_the_cap(engine: Engine) -> None:
    project = make_project(engine)
    cap, threads, calls, per_call = 37, 4, 6, 5
    barrier = threading.Barrier(threads)
    results: list[WriteResult] = []
    errors: list[BaseException] = []

    def run(worker: int) -> None:
        writer = SampleWriter(engine, max_series_per_project=cap)
        try:
            barrier.wait()
            for call in range(calls):
                gpus = [f"{worker}-{call}-{i}" for i in range(per_call)]
                # Every worker also asks for one shared series, to race on the same row too;
                # at a time of its own, since a sample already stored is skipped.
                start = T0 + timedelta(minutes=worker * calls + call)
                wanted = [batch(gpu=gpu, count=1, start=start) for gpu in [*gpus, "shared"]]
                results.append(writer.write(project, wanted))
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    assert series_count(engine, project) == cap
    assert sum(r.series_created for r in results) == cap
    written = sum(r.samples_written for r in results)
    assert written + sum(r.samples_rejected for r in results) == threads * calls * (per_call + 1)
    assert len(stored(engine)) == written


def test_bad_batches_are_rejected_and_the_rest_is_written(engine: Engine) -> None:
    project = make_project(engine)
    naive = [datetime(2024, 3, 10, 12, 0), datetime(2024, 3, 10, 12, 1)]
    ts, length, metric, labels, value, kind, shape = (
        RejectionCode.INVALID_TIMESTAMP,
        RejectionCode.LENGTH_MISMATCH,
        RejectionCode.INVALID_METRIC,
        RejectionCode.INVALID_LABELS,
        RejectionCode.INVALID_VALUE,
        RejectionCode.INVALID_KIND,
        RejectionCode.INVALID_BATCH,
    )
    bad: list[tuple[SeriesBatch, str, RejectionCode]] = [
        (untyped("m", {"gpu": "0"}, naive, [1.0, 2.0]), "timestamps[0] is a naive datetime", ts),
        (untyped("m", {"gpu": "1"}, [T0, naive[0]], [1.0, 2.0]), "timestamps[1] is a naive", ts),
        (untyped("m", {"gpu": "2"}, [T0, "x"], [1.0, 2.0]), "timestamps[1] is not a dat", ts),
        (untyped("m", {"gpu": "3"}, [1, 2], [1.0, 2.0]), "timestamps[0] is not a datetime", ts),
        (untyped("m", {"gpu": "4"}, [T0, T0], [1.0]), "2 timestamps but 1 values", length),
        (untyped("", {"gpu": "5"}, [T0], [1.0]), "metric name must be a non-empty", metric),
        (untyped("m" * 201, {}, [T0], [1.0]), "longer than 200 characters", metric),
        (untyped("m\x00", {}, [T0], [1.0]), "metric name contains a NUL", metric),
        (untyped("m", {"gpu": 7}, [T0], [1.0]), "label 'gpu' has a non-string value", labels),
        (untyped("m", {"gpu": "\x00"}, [T0], [1.0]), "NUL character", labels),
        (untyped("m", {"": "x"}, [T0], [1.0]), "label name '' is not a non-empty", labels),
        (untyped("m", {"gpu": "9"}, [T0], ["1.0"]), "values[0] is not a real number (str)", value),
        (untyped("m", {"gpu": "10"}, [T0], [None]), "values[0] is not a real number", value),
        (untyped("m", {"gpu": "11"}, [T0], [10**400]), "values[0] does not fit in a 64", value),
        (untyped("m", {"gpu": "12"}, [T0], [1.0], "histogram"), "kind must be one of", kind),
        (untyped("m", {"gpu": "13"}, None, None), "must be sequences", shape),
    ]
    good = [batch(gpu="ok-1"), batch(gpu="ok-2", count=2)]
    result = SampleWriter(engine).write(project, [good[0], *(b for b, _, _ in bad), good[1]])
    assert (result.samples_written, result.series_created) == (5, 2)
    assert len(result.rejected) == len(bad)
    for rejection, (sent, expected, code) in zip(result.rejected, bad, strict=True):
        assert expected in rejection.reason
        assert rejection.code == code, rejection.reason
        # A batch without sequences has no size to report.
        size = max(len(sent.timestamps), len(sent.values)) if sent.values is not None else 0
        assert rejection.samples == size
    assert len(stored(engine)) == 5
    assert series_count(engine, project) == 2


def test_nan_values_are_dropped_and_reported(engine: Engine) -> None:
    project = make_project(engine)
    timestamps = [T0 + timedelta(seconds=i) for i in range(4)]
    mixed = SeriesBatch("m", {"gpu": "0"}, timestamps, [1.0, math.nan, -math.inf, math.nan])
    only_nan = SeriesBatch("m", {"gpu": "1"}, timestamps[:1], [math.nan])
    result = SampleWriter(engine).write(project, [mixed, only_nan])
    assert (result.samples_written, result.series_created) == (2, 1)
    assert [(r.labels["gpu"], r.samples) for r in result.rejected] == [("0", 2), ("1", 1)]
    assert all("NaN" in reason for reason in reasons(result))
    assert {r.code for r in result.rejected} == {RejectionCode.NAN_VALUE}
    assert [(ts, value) for _, ts, value in stored(engine)] == [
        (timestamps[0], 1.0),
        (timestamps[2], -math.inf),
    ]


def test_empty_input_writes_nothing(engine: Engine) -> None:
    project = make_project(engine)
    empty: Sequence[SeriesBatch] = [SeriesBatch("m", {}, [], [])]
    assert SampleWriter(engine).write(project, []) == WriteResult()
    assert SampleWriter(engine).write(project, empty) == WriteResult()
    assert series_count(engine, project) == 0


def test_integer_values_are_stored_as_floats(engine: Engine) -> None:
    project = make_project(engine)
    result = SampleWriter(engine).write(project, [SeriesBatch("m", {}, [T0], [7])])
    assert result.samples_written == 1
    [(_, _, value)] = stored(engine)
    assert value == 7.0 and isinstance(value, float)


def test_invalid_writer_settings_fail_at_once(engine: Engine) -> None:
    with pytest.raises(ValueError, match="partition_days"):
        SampleWriter(engine, partition_days=0)


def test_forget_drops_cached_ids_of_deleted_series(engine: Engine) -> None:
    project = make_project(engine)
    writer = SampleWriter(engine)
    writer.write(project, [batch()])
    with engine.begin() as connection:
        connection.execute(delete(samples))
        connection.execute(delete(Series))
    writer.forget(project)
    result = writer.write(project, [batch()])
    assert result.series_created == 1
    [series_id] = {row[0] for row in stored(engine)}
    with engine.connect() as connection:
        assert connection.execute(select(Series.id)).scalar_one() == series_id
