"""Every read answers exactly the same before and after compaction, on SQLite and PostgreSQL:
with everything compacted, with the boundary between rows and chunks inside the range, and
with the rollups' watermark deciding what may be compacted."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Engine

from tests.storage_compaction.fleet import (
    HOURS,
    NOW,
    T,
    counts,
    every_read,
    fleet,
    make_project,
    write,
)
from tuneloop.storage.models import samples
from tuneloop.storage.timeseries.compaction import compact
from tuneloop.storage.timeseries.rollups import update_rollups
from tuneloop.storage.timeseries.sample_source import sample_rows


def test_every_read_is_unchanged_when_everything_is_compacted(engine: Engine) -> None:
    project = make_project(engine)
    write(engine, project, fleet())
    update_rollups(engine, now=NOW)
    before = every_read(engine, project)
    raw_rows = counts(engine)[0]

    report = compact(engine, hot_window=timedelta(0), now=NOW)

    assert counts(engine) == (0, report.chunks_written, raw_rows)
    assert report.samples_compacted == raw_rows
    assert report.chunks_written == 12 * HOURS  # 12 series, one chunk per hour
    assert every_read(engine, project) == before


def test_the_boundary_between_rows_and_chunks_inside_every_range(engine: Engine) -> None:
    project = make_project(engine)
    write(engine, project, fleet())
    before = every_read(engine, project)
    # Half the fleet's hours compacted, the rest raw: every range crosses the boundary.
    compact(
        engine,
        hot_window=timedelta(hours=1),
        now=T + timedelta(hours=2, minutes=30),
        after_rollups=False,
    )
    raw_rows, chunks, held = counts(engine)
    assert chunks == 12 and raw_rows and held
    assert every_read(engine, project) == before


def test_only_what_the_rollups_have_read_is_compacted(engine: Engine) -> None:
    project = make_project(engine)
    write(engine, project, fleet())
    assert compact(engine, hot_window=timedelta(0), now=NOW).chunks_written == 0  # no rollups yet
    update_rollups(engine, now=T + timedelta(hours=1, minutes=1))  # watermark T + 59 min
    report = compact(engine, hot_window=timedelta(0), now=NOW)
    assert report.chunks_written == 0  # the first hour ends after watermark - lateness
    update_rollups(engine, now=T + timedelta(hours=1, minutes=5))
    before = every_read(engine, project)
    report = compact(engine, hot_window=timedelta(0), now=NOW)
    assert report.chunks_written == 12  # the first hour only
    assert every_read(engine, project) == before


def test_a_read_without_chunks_in_its_range_is_todays_statement(engine: Engine) -> None:
    project = make_project(engine)
    write(engine, project, fleet())
    compact(engine, hot_window=timedelta(0), now=T + timedelta(hours=1), after_rollups=False)
    with engine.connect() as connection:
        hot = sample_rows(connection, [1, 2], [(T + timedelta(hours=2), None)])
        cold = sample_rows(connection, [1, 2], [(T, T + timedelta(minutes=5))])
    assert hot is samples
    assert cold is not samples
