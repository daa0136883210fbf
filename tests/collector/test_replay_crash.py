"""A crash during spool replay stores nothing twice (issue 15, item 9): the process dies after
the store committed a group and before the spool recorded the ack, so the next run replays the
group again; the store keeps one row per (series, ts). On real SQLite and real PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine

from collector.pipeline import Pipeline
from collector.sinks.store import StoreSink
from collector.spool import Spool
from tests.helpers import stored_totals
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
RECORDS, SERIES, PER_SERIES = 4, 3, 5


def record(number: int) -> list[SeriesBatch]:
    """Samples unique by (series, ts) across the records, values encoding both."""
    return [
        SeriesBatch(
            "replay_value",
            {"series": str(series)},
            [T0 + timedelta(seconds=number * PER_SERIES + index) for index in range(PER_SERIES)],
            [float(number * 100 + series * 10 + index) for index in range(PER_SERIES)],
            SeriesKind.GAUGE,
        )
        for series in range(SERIES)
    ]


def expected_totals() -> tuple[int, float, int]:
    values = [value for number in range(RECORDS) for b in record(number) for value in b.values]
    return len(values), sum(values), 0


def test_a_group_committed_but_not_acknowledged_is_replayed_without_duplicates(
    engine: Engine, project_id: int, tmp_path: Path
) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, fsync=False)
    for number in range(RECORDS):
        spool.append(project_id, record(number))
    # The first run replays two groups: the first acknowledged, the second committed in the
    # store and then the process dies before its ack.
    sink = StoreSink(SampleWriter(engine))
    for acknowledged in (True, False):
        group = spool.read_group(SERIES * PER_SERIES)
        assert group is not None
        sink.write(group.project_id, group.batches)
        if acknowledged:
            spool.ack(group)
    spool.close()

    # The next run replays what the spool still holds, the committed group included.
    reopened = Spool(tmp_path, max_bytes=1 << 20, fsync=False)
    pipeline = Pipeline(StoreSink(SampleWriter(engine)), spool=reopened)
    pipeline.start()
    pipeline.stop()

    assert stored_totals(engine) == expected_totals()
    # Three groups written by this run, the replayed one included (stored already: skipped).
    written = pipeline.registry.get_sample_value("tuneloop_collector_points_written_total")
    assert written == 3 * SERIES * PER_SERIES
    assert reopened.empty
    reopened.close()


def test_a_crash_before_every_ack_still_stores_each_sample_once(
    engine: Engine, project_id: int, tmp_path: Path
) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, fsync=False)
    for number in range(RECORDS):
        spool.append(project_id, record(number))
    spool.close()
    # Every group is committed, then the process dies before its ack; the next run commits it
    # again, acknowledges it, and dies after committing the group that follows.
    crashed: set[tuple[int, int]] = set()
    runs = 0
    while True:
        runs += 1
        run = Spool(tmp_path, max_bytes=1 << 20, fsync=False)
        assert run.open() is True
        sink = StoreSink(SampleWriter(engine))
        died = False
        while (group := run.read_group(SERIES * PER_SERIES)) is not None:
            sink.write(group.project_id, group.batches)
            if (group.end.segment, group.end.offset) not in crashed:
                crashed.add((group.end.segment, group.end.offset))
                died = True
                break
            run.ack(group)
        run.close()
        assert stored_totals(engine)[2] == 0
        if not died:
            break

    assert runs == RECORDS + 1
    assert stored_totals(engine) == expected_totals()
