"""Writes are idempotent (issue 15, item 9): ``samples`` is unique on ``(series_id, ts)``, and a
batch written twice, through the normal path or the replay path (``dedupe=True``), is stored
once, on real SQLite and real PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from tests.helpers import stored_totals
from tests.storage.test_writer import T0, batch, make_project, stored
from tests.storage.test_writer_columns import block, table
from tuneloop.storage.timeseries.writer import SampleWriter


@pytest.mark.parametrize("dedupe", [False, True], ids=["normal", "replay"])
def test_the_same_batches_written_twice_are_stored_once(engine: Engine, dedupe: bool) -> None:
    project = make_project(engine)
    batches = [batch(gpu=str(gpu), count=4) for gpu in range(3)]
    first = SampleWriter(engine).write(project, batches)
    before = stored(engine)

    again = SampleWriter(engine).write(project, batches, dedupe=dedupe)

    assert stored(engine) == before and len(before) == 12
    assert (first.samples_written, first.samples_duplicate) == (12, 0)
    assert (again.samples_written, again.samples_duplicate) == (12, 12)
    assert not again.rejected and again.series_created == 0


@pytest.mark.parametrize("dedupe", [False, True], ids=["normal", "replay"])
def test_a_block_written_twice_is_stored_once(engine: Engine, dedupe: bool) -> None:
    project = make_project(engine)
    writer = SampleWriter(engine)
    columns = block(table(), 6)
    writer.write(project, [columns])
    before = stored(engine)

    result = writer.write(project, [columns], dedupe=dedupe)

    assert stored(engine) == before and len(before) == 24
    assert result.samples_duplicate == 24


@pytest.mark.parametrize("dedupe", [False, True], ids=["normal", "replay"])
def test_a_write_half_stored_already_stores_only_the_new_half(engine: Engine, dedupe: bool) -> None:
    project = make_project(engine)
    writer = SampleWriter(engine)
    writer.write(project, [batch(count=3)])

    # Steps 0-2 again (the stored values kept) and steps 3-5 new, in one batch and a block.
    result = writer.write(
        project, [batch(count=6, start=T0), block(table(), 2, first=0)], dedupe=dedupe
    )

    assert (result.samples_written, result.samples_duplicate) == (6 + 8, 3)
    assert stored_totals(engine)[0] == 6 + 8
    assert stored_totals(engine)[2] == 0
    assert [value for _, _, value in stored(engine)[:6]] == [0.5, 1.5, 2.5, 3.5, 4.5, 5.5]


def test_the_same_timestamp_twice_in_one_write_is_stored_once(engine: Engine) -> None:
    project = make_project(engine)
    twice = batch(count=2, step=timedelta(0))  # T0 and T0 again

    result = SampleWriter(engine).write(project, [twice, batch(count=1)])

    assert result.samples_written == 3 and not result.rejected
    assert len(stored(engine)) == 1


def test_the_table_refuses_a_duplicate_row(engine: Engine) -> None:
    project = make_project(engine)
    SampleWriter(engine).write(project, [batch(count=1)])
    with pytest.raises(IntegrityError), engine.begin() as connection:
        connection.execute(
            text("INSERT INTO samples (series_id, ts, value) SELECT series_id, ts, 9 FROM samples")
        )
    assert len(stored(engine)) == 1
