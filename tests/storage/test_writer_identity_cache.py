"""SampleWriter's memory of the batches it checked before (metric, labels and kind, with their
fingerprint): a batch seen again skips the checks, and nothing it must refuse gets through."""

from __future__ import annotations

import gc
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

from sqlalchemy import Engine, func, select

from tests.storage.test_writer import make_project
from tuneloop.storage.models import Series, samples
from tuneloop.storage.timeseries.types import RejectionCode, SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter

T0 = datetime(2024, 3, 10, 12, 0, tzinfo=UTC)


def one(labels: Any, at: int = 0, kind: Any = SeriesKind.GAUGE, value: Any = 1.0) -> SeriesBatch:
    """One sample, as a periodic source or OTLP exporter sends it."""
    return SeriesBatch("gpu_util", labels, [T0 + timedelta(seconds=at)], [value], kind)


def counts(engine: Engine) -> tuple[int, int]:
    with engine.connect() as connection:
        series = connection.execute(select(func.count()).select_from(Series)).scalar_one()
        rows = connection.execute(select(func.count()).select_from(samples)).scalar_one()
    return int(series), int(rows)


def new_project(engine: Engine) -> int:
    return make_project(engine)


def test_one_sample_batches_of_a_series_share_it_within_and_across_calls(
    engine: Engine,
) -> None:
    project = new_project(engine)
    writer = SampleWriter(engine)
    labels = {"gpu": "0", "host": "a"}
    first = writer.write(project, [one(labels, at) for at in range(50)])
    # Another dict, other order, kind as a plain string: the same series.
    again = writer.write(project, [one({"host": "a", "gpu": "0"}, 60, kind="gauge")])
    assert (first.samples_written, first.series_created) == (50, 1)
    assert (again.samples_written, again.series_created, again.rejected) == (1, 0, [])
    assert counts(engine) == (1, 51)


def test_a_labels_dict_changed_between_writes_is_another_series(engine: Engine) -> None:
    project = new_project(engine)
    writer = SampleWriter(engine)
    labels = {"gpu": "0"}
    writer.write(project, [one(labels)])
    labels["gpu"] = "1"  # the same object, other content
    result = writer.write(project, [one(labels, 15)])
    assert result.series_created == 1
    with engine.connect() as connection:
        stored = connection.execute(select(Series.labels).order_by(Series.id)).scalars().all()
    assert stored == [{"gpu": "0"}, {"gpu": "1"}]


def test_what_was_accepted_before_does_not_let_bad_batches_through(engine: Engine) -> None:
    project = new_project(engine)
    writer = SampleWriter(engine)
    labels = {"gpu": "0"}
    assert not writer.write(project, [one(labels)]).rejected
    bad = [
        one(labels, 1, kind="histogram"),
        one({"gpu": ["0"]}, 2),  # unhashable: must not break the lookup
        one({"gpu": 0}, 3),
        one({"gpu": "0\x00"}, 4),
        one(labels, 5, value="1.0"),
        SeriesBatch("gpu_util", labels, [T0, T0], [1.0]),
        SeriesBatch("gpu_util", labels, [T0.replace(tzinfo=None)], [1.0]),
    ]
    result = writer.write(project, bad)
    assert [rejection.code for rejection in result.rejected] == [
        RejectionCode.INVALID_KIND,
        RejectionCode.INVALID_LABELS,
        RejectionCode.INVALID_LABELS,
        RejectionCode.INVALID_LABELS,
        RejectionCode.INVALID_VALUE,
        RejectionCode.LENGTH_MISMATCH,
        RejectionCode.INVALID_TIMESTAMP,
    ]
    assert result.samples_written == 0
    assert counts(engine) == (1, 1)


def test_labels_that_are_not_a_dict_are_checked_every_time(engine: Engine) -> None:
    project = new_project(engine)
    writer = SampleWriter(engine)
    frozen = MappingProxyType({"gpu": "0"})
    results = [writer.write(project, [one(frozen, at)]) for at in range(3)]
    assert [r.samples_written for r in results] == [1, 1, 1]
    assert counts(engine) == (1, 3)


def test_nan_is_still_dropped_from_a_known_series(engine: Engine) -> None:
    project = new_project(engine)
    writer = SampleWriter(engine)
    labels = {"gpu": "0"}
    writer.write(project, [one(labels)])
    result = writer.write(project, [one(labels, 1, value=float("nan")), one(labels, 2)])
    assert [r.code for r in result.rejected] == [RejectionCode.NAN_VALUE]
    assert result.samples_written == 1


def test_a_write_leaves_the_garbage_collector_as_it_found_it(engine: Engine) -> None:
    project = new_project(engine)
    writer = SampleWriter(engine)
    assert gc.isenabled()
    writer.write(project, [one({"gpu": "0"})])
    assert gc.isenabled()
    gc.disable()
    try:
        writer.write(project, [one({"gpu": "0"}, 1)])
        assert not gc.isenabled()
    finally:
        gc.enable()
