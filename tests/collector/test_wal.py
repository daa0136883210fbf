"""The durable pipeline: a submission is on disk in the spool (the write-ahead log) before
``submit`` returns, concurrent submissions share fsyncs, the log is truncated as the store
catches up, and an outage replays from the log without holding anything twice in memory."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from collector.pipeline import Pipeline, PipelineConfig
from collector.sinks.base import SinkUnavailable
from collector.spool import SEGMENT_SUFFIX, Spool
from collector.spool_format import MAGIC, decode_record, read_record
from tests.helpers import wait_for
from tuneloop.storage.timeseries.columns import Batch, expand
from tuneloop.storage.timeseries.types import SeriesBatch, WriteResult

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
DURABLE = PipelineConfig(durable=True, flush_interval_s=0.05, retry_initial_s=0.05)


def batch(number: int, size: int = 5) -> list[SeriesBatch]:
    timestamps = [T0 + timedelta(seconds=number * size + i) for i in range(size)]
    return [SeriesBatch("m", {"n": str(number % 3)}, timestamps, [float(number)] * size)]


class MemorySink:
    """Stores in a list; ``down`` makes it unreachable, ``gate`` holds writes back."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, datetime, float]] = []
        self.down = False
        self.gate = threading.Event()
        self.gate.set()

    def write(self, project_id: int, batches: Sequence[Batch]) -> WriteResult:
        self.gate.wait()
        if self.down:
            raise SinkUnavailable("down")
        added = [
            (project_id, ts, value)
            for one in expand(batches)
            for ts, value in zip(one.timestamps, one.values, strict=True)
        ]
        self.rows.extend(added)
        return WriteResult(samples_written=len(added))


def logged_samples(root: Path) -> int:
    """Samples in the spool's segment files, read straight from disk."""
    total = 0
    for segment in sorted(root.glob(f"slot-*/*{SEGMENT_SUFFIX}")):
        with open(segment, "rb") as file:
            size = segment.stat().st_size
            assert file.read(len(MAGIC)) == MAGIC
            offset = len(MAGIC)
            while offset < size:
                payload = read_record(file, size - offset)
                offset += 8 + len(payload)
                total += sum(len(b.values) for b in decode_record(payload)[1])
    return total


def test_a_submission_is_on_disk_before_submit_returns(tmp_path: Path) -> None:
    sink = MemorySink()
    sink.gate.clear()  # the store never answers: only the log can hold the samples
    pipeline = Pipeline(sink, config=DURABLE, spool=Spool(tmp_path, max_bytes=1 << 24))
    pipeline.start()
    for number in range(10):
        pipeline.submit(1, batch(number))
        assert logged_samples(tmp_path) == 5 * (number + 1)
    sink.gate.set()
    pipeline.stop(5)
    assert len(sink.rows) == 50


def test_the_log_is_truncated_as_the_store_catches_up(tmp_path: Path) -> None:
    sink = MemorySink()
    spool = Spool(tmp_path, max_bytes=1 << 24)
    pipeline = Pipeline(sink, config=DURABLE, spool=spool)
    pipeline.start()
    for number in range(20):
        pipeline.submit(1, batch(number))
    wait_for(lambda: len(sink.rows) == 100)
    wait_for(lambda: spool.empty)
    assert logged_samples(tmp_path) == 0
    assert pipeline.status().spooling is False
    pipeline.stop(5)
    assert len(sink.rows) == 100  # nothing replayed twice


def test_concurrent_submissions_share_fsyncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncs = 0
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        nonlocal syncs
        syncs += 1
        time.sleep(0.01)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    sink = MemorySink()
    pipeline = Pipeline(sink, config=DURABLE, spool=Spool(tmp_path, max_bytes=1 << 24))
    pipeline.start()
    senders, each = 8, 10

    def send(sender: int) -> None:
        for number in range(each):
            pipeline.submit(1, batch(sender * each + number))

    threads = [threading.Thread(target=send, args=(s,)) for s in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    pipeline.stop(5)
    assert len(sink.rows) == senders * each * 5
    # One fsync per submission would be 80 (plus segment and ack syncs); groups share them.
    assert syncs < senders * each * 0.75, syncs


def test_an_outage_replays_from_the_log(tmp_path: Path) -> None:
    sink = MemorySink()
    spool = Spool(tmp_path, max_bytes=1 << 24)
    pipeline = Pipeline(sink, config=DURABLE, spool=spool)
    pipeline.start()
    sink.down = True
    for number in range(30):
        pipeline.submit(1, batch(number))
    wait_for(lambda: pipeline.status().spooling)
    assert pipeline.status().queued_samples == 0  # the log holds it, not memory
    sink.down = False
    wait_for(lambda: len(sink.rows) >= 150)
    wait_for(lambda: not pipeline.status().spooling)
    pipeline.stop(5)
    assert sorted({row[1] for row in sink.rows}) == sorted(
        ts for number in range(30) for ts in batch(number)[0].timestamps
    )


def test_what_a_dead_process_logged_is_replayed_at_the_next_start(tmp_path: Path) -> None:
    sink = MemorySink()
    sink.gate.clear()
    first = Pipeline(sink, config=DURABLE, spool=Spool(tmp_path, max_bytes=1 << 24))
    first.start()
    for number in range(10):
        first.submit(1, batch(number))
    # A crash: the process is gone, its flock with it; nothing was drained.
    spool = first._spool
    assert spool is not None and spool._lock_fd is not None
    os.close(spool._lock_fd)
    spool._lock_fd = None
    second_sink = MemorySink()
    second = Pipeline(second_sink, config=DURABLE, spool=Spool(tmp_path, max_bytes=1 << 24))
    second.start()
    wait_for(lambda: len(second_sink.rows) == 50)
    second.stop(5)
    assert len(second_sink.rows) == 50
