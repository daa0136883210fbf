"""The on-disk spool: its format, its bounds, crash recovery, and a pipeline replaying what a
crashed process left behind, in order, into a real store."""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from collector.pipeline import Pipeline, PipelineConfig
from collector.sinks.store import StoreSink
from collector.spool import (
    MAGIC,
    Spool,
    SpoolFull,
    decode_record,
    encode_record,
)
from tests.collector.conftest import create_project
from tuneloop.storage.models import samples
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind, WriteResult
from tuneloop.storage.timeseries.writer import SampleWriter

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[2]


def batch(metric: str = "m", n: int = 3, start: int = 0, **labels: str) -> SeriesBatch:
    return SeriesBatch(
        metric,
        labels or {"gpu": "0"},
        [T0 + timedelta(seconds=start + i) for i in range(n)],
        [float(start + i) for i in range(n)],
    )


def segments(spool: Spool) -> list[Path]:
    assert spool.slot is not None
    return sorted(spool.slot.glob("*.seg"))


# --------------------------------------------------------------------------- format


def test_record_round_trip_is_exact() -> None:
    odd_zone = timezone(timedelta(hours=5, minutes=30))
    batches = [
        SeriesBatch(
            "gpu_util",
            {"gpu": "0", "host": "nœud-ü", "empty": ""},
            [T0, T0 + timedelta(microseconds=1), datetime(1969, 12, 31, 23, 59, tzinfo=UTC)],
            [0.1, math.inf, -math.inf],
            SeriesKind.COUNTER,
        ),
        SeriesBatch("other", {}, [T0.astimezone(odd_zone)], [1e308]),
    ]
    encoded = encode_record(42, batches)
    assert encoded.samples == 4 and not encoded.rejected
    project_id, decoded = decode_record(encoded.data[8:])
    assert project_id == 42
    assert [(b.metric, dict(b.labels), b.kind) for b in decoded] == [
        ("gpu_util", {"gpu": "0", "host": "nœud-ü", "empty": ""}, SeriesKind.COUNTER),
        ("other", {}, SeriesKind.GAUGE),
    ]
    assert list(decoded[0].timestamps) == list(batches[0].timestamps)
    assert list(decoded[0].values) == [0.1, math.inf, -math.inf]
    assert decoded[1].timestamps[0] == T0  # the same instant, given back in UTC
    assert decoded[1].timestamps[0].tzinfo is UTC


def test_record_keeps_nan_for_the_store_to_report() -> None:
    encoded = encode_record(1, [SeriesBatch("m", {}, [T0], [math.nan])])
    _, decoded = decode_record(encoded.data[8:])
    assert math.isnan(decoded[0].values[0])


@pytest.mark.parametrize(
    ("bad", "code"),
    [
        # The same codes as the store gives the same batches (tests/storage/test_writer.py).
        (SeriesBatch("m", {}, [datetime(2026, 1, 1)], [1.0]), "invalid_timestamp"),  # naive
        (SeriesBatch("m", {}, ["2026-01-01"], [1.0]), "invalid_timestamp"),  # type: ignore[list-item]
        (SeriesBatch("m", {}, [T0], ["1.0"]), "invalid_value"),  # type: ignore[list-item]
        (SeriesBatch("m", {}, [T0, T0], [1.0]), "length_mismatch"),
        (SeriesBatch("m", {1: "x"}, [T0], [1.0]), "invalid_labels"),  # type: ignore[dict-item]
        (SeriesBatch(7, {}, [T0], [1.0]), "invalid_metric"),  # type: ignore[arg-type]
        (SeriesBatch("m", {}, [T0], [1.0], "histogram"), "invalid_kind"),  # type: ignore[arg-type]
        (SeriesBatch("m", {}, None, None), "invalid_batch"),  # type: ignore[arg-type]
    ],
)
def test_unrepresentable_batches_are_rejected_and_the_rest_kept(
    bad: SeriesBatch, code: str
) -> None:
    encoded = encode_record(1, [batch(n=2), bad])
    assert encoded.samples == 2
    assert len(encoded.rejected) == 1
    assert encoded.rejected[0].reason.startswith("invalid batch")
    assert encoded.rejected[0].code == code


# --------------------------------------------------------------------------- append and replay


def test_nothing_touches_the_disk_until_something_is_spooled(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", max_bytes=1 << 20)
    assert spool.open() is False
    assert not (tmp_path / "spool").exists()
    spool.append(1, [batch()])
    assert spool.slot == tmp_path / "spool" / "slot-0"


def test_groups_are_consecutive_records_of_one_project_in_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=400)
    for start, project in [(0, 1), (3, 1), (6, 2), (9, 1), (12, 1), (15, 1)]:
        spool.append(project, [batch(start=start)])
    assert len(segments(spool)) > 1  # 400-byte segments rotate
    seen = []
    while (group := spool.read_group(max_samples=6)) is not None:
        seen.append((group.project_id, [b.values[0] for b in group.batches]))
        spool.ack(group)
    assert seen == [(1, [0.0, 3.0]), (2, [6.0]), (1, [9.0, 12.0]), (1, [15.0])]
    assert spool.empty and spool.pending_bytes == 0
    assert segments(spool) == []
    assert not (tmp_path / "slot-0" / "ack").exists()


def test_a_group_is_not_acknowledged_until_ack(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20)
    spool.append(1, [batch()])
    first = spool.read_group(100)
    again = spool.read_group(100)
    assert first is not None and again is not None
    assert first.end == again.end and first.samples == again.samples == 3


def test_the_size_bound_refuses_whole_records(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=2000, segment_bytes=2000)
    spool.append(1, [batch(n=20)])
    used = spool.pending_bytes
    with pytest.raises(SpoolFull):
        spool.append(1, [batch(n=200)])
    assert spool.pending_bytes == used
    group = spool.read_group(10_000)
    assert group is not None and group.samples == 20
    spool.ack(group)
    spool.append(1, [batch(n=20)])  # room again once replayed


def test_processes_lease_different_slots(tmp_path: Path) -> None:
    first, second = Spool(tmp_path, max_bytes=1 << 20), Spool(tmp_path, max_bytes=1 << 20)
    first.append(1, [batch()])
    second.append(1, [batch()])
    assert {first.slot, second.slot} == {tmp_path / "slot-0", tmp_path / "slot-1"}
    first.close()
    second.close()


def test_data_for_another_store_is_left_alone(tmp_path: Path) -> None:
    other = Spool(tmp_path, max_bytes=1 << 20, store="postgresql://a/x")
    other.append(1, [batch()])
    other.close()
    mine = Spool(tmp_path, max_bytes=1 << 20, store="postgresql://b/y")
    assert mine.open() is False
    mine.append(1, [batch()])
    assert mine.slot == tmp_path / "slot-1"
    again = Spool(tmp_path, max_bytes=1 << 20, store="postgresql://a/x")
    assert again.open() is True and again.slot == tmp_path / "slot-0"


def test_acknowledged_records_are_not_replayed_after_a_restart(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20)
    for start in (0, 10, 20):
        spool.append(start + 1, [batch(start=start)])  # three projects: three groups
    group = spool.read_group(100)
    assert group is not None
    spool.ack(group)
    spool.close()
    reopened = Spool(tmp_path, max_bytes=1 << 20)
    assert reopened.open() is True
    projects = []
    while (group := reopened.read_group(100)) is not None:
        projects.append(group.project_id)
        reopened.ack(group)
    assert projects == [11, 21]


def test_a_torn_last_record_is_cut_off_at_the_next_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20)
    spool.append(1, [batch(start=0)])
    spool.append(1, [batch(start=3)])
    last = segments(spool)[-1]
    whole = last.stat().st_size
    spool.close()
    # A crash in the middle of the third append: a header and half a payload.
    with open(last, "ab") as file:
        file.write(encode_record(1, [batch(start=6)]).data[:30])
    reopened = Spool(tmp_path, max_bytes=1 << 20)
    with caplog.at_level(logging.WARNING):
        assert reopened.open() is True
    assert "torn bytes" in caplog.text
    assert last.stat().st_size == whole
    group = reopened.read_group(100)
    assert group is not None and [b.values[0] for b in group.batches] == [0.0, 3.0]


def test_a_corrupt_record_is_skipped_and_the_rest_replayed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=100)  # one record each
    for start in (0, 3, 6):
        spool.append(1, [batch(start=start)])
    files = segments(spool)
    assert len(files) == 3
    spool.close()
    data = bytearray(files[1].read_bytes())
    data[len(MAGIC) + 20] ^= 0xFF  # a bit flip inside the second segment's record
    files[1].write_bytes(bytes(data))
    reopened = Spool(tmp_path, max_bytes=1 << 20)
    reopened.open()
    firsts = []
    with caplog.at_level(logging.ERROR):
        while (group := reopened.read_group(100)) is not None:
            firsts += [b.values[0] for b in group.batches]
            reopened.ack(group)
    assert firsts == [0.0, 6.0]
    assert "corrupt" in caplog.text


# --------------------------------------------------------------------------- crash and replay

CRASHING_COLLECTOR = textwrap.dedent(
    """
    import os, sys, time
    from datetime import UTC, datetime, timedelta
    from collector.pipeline import Pipeline, PipelineConfig
    from collector.sinks.store import StoreSink
    from collector.spool import Spool
    from tuneloop.storage import make_engine
    from tuneloop.storage.timeseries.types import SeriesBatch
    from tuneloop.storage.timeseries.writer import SampleWriter

    spool_dir, store, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    # Nothing listens on port 1: every write fails as "unreachable".
    engine = make_engine("postgresql+psycopg://postgres@127.0.0.1:1/none")
    pipeline = Pipeline(
        StoreSink(SampleWriter(engine)),
        config=PipelineConfig(flush_interval_s=0.01, retry_initial_s=5, retry_max_s=5),
        spool=Spool(spool_dir, max_bytes=1 << 24, store=store),
    )
    pipeline.start()
    for number in range(count):
        ts = [T0 + timedelta(seconds=number * 10 + i) for i in range(10)]
        pipeline.submit(1, [SeriesBatch("m", {"n": str(number % 3)}, ts, [float(number)] * 10)])
        if number == 0:
            while not pipeline.status().spooling:
                time.sleep(0.01)
    print("spooled", pipeline.status().spool_bytes, flush=True)
    os._exit(0)  # a crash: no stop(), no drain, no cleanup
    """
)


class RecordingSink:
    """The real store sink, remembering the order of what it wrote."""

    def __init__(self, inner: StoreSink) -> None:
        self.inner = inner
        self.firsts: list[float] = []

    def write(self, project_id: int, batches: Sequence[SeriesBatch]) -> WriteResult:
        result = self.inner.write(project_id, batches)
        self.firsts += [batch.values[0] for batch in batches]
        return result


def test_a_new_pipeline_replays_what_a_crashed_one_spooled_in_order(
    engine: Engine, tmp_path: Path
) -> None:
    project_id = create_project(engine)
    assert project_id == 1  # the crashed process wrote for project 1
    spool_dir = tmp_path / "spool"
    store = "the-test-store"
    crashed = subprocess.run(
        [sys.executable, "-c", CRASHING_COLLECTOR, str(spool_dir), store, "40"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert crashed.returncode == 0, crashed.stderr
    assert crashed.stdout.startswith("spooled")

    sink = RecordingSink(StoreSink(SampleWriter(engine)))
    pipeline = Pipeline(
        sink,
        config=PipelineConfig(batch_max_samples=50, flush_interval_s=0.05),
        spool=Spool(spool_dir, max_bytes=1 << 24, store=store),
    )
    pipeline.start()
    deadline = time.monotonic() + 10
    while pipeline.status().spooling and time.monotonic() < deadline:
        time.sleep(0.02)
    pipeline.stop()
    assert sink.firsts == [float(number) for number in range(40)]
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(samples)).scalar_one() == 400
    assert list((spool_dir / "slot-0").glob("*.seg")) == []
