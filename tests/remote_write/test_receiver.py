"""The receiver without HTTP or a store: what it hands on, what it refuses and why."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from collector.remote_write.receiver import (
    MAX_REASONS,
    Malformed,
    RemoteWriteReceiver,
    TooLarge,
    UnsupportedMedia,
    WriteOutcome,
    check_headers,
    kind_of,
)
from tuneloop import remote_write
from tuneloop.remote_write import RemoteSeries
from tuneloop.storage.timeseries.columns import Batch, SampleColumns
from tuneloop.storage.timeseries.types import SeriesKind

T0 = 1_750_000_000_000


def receive(*items: RemoteSeries, limit: int = 1 << 20) -> tuple[list[Batch], WriteOutcome]:
    handed: list[Batch] = []

    def submit(batches: Sequence[Batch]) -> None:
        handed.extend(batches)

    outcome = RemoteWriteReceiver(max_body_bytes=limit).write(
        remote_write.encode(items), content_type=None, content_encoding=None, submit=submit
    )
    return handed, outcome


@pytest.mark.parametrize(
    ("metric", "kind"),
    [
        ("train_tokens_total", SeriesKind.COUNTER),
        ("http_request_duration_seconds_bucket", SeriesKind.COUNTER),
        ("http_request_duration_seconds_sum", SeriesKind.COUNTER),
        ("http_request_duration_seconds_count", SeriesKind.COUNTER),
        ("DCGM_FI_DEV_GPU_UTIL", SeriesKind.GAUGE),
        ("total_memory_bytes", SeriesKind.GAUGE),
    ],
)
def test_the_kind_follows_prometheus_naming(metric: str, kind: SeriesKind) -> None:
    assert kind_of(metric) is kind


@pytest.mark.parametrize(
    ("content_type", "content_encoding"),
    [
        (None, None),
        ("application/x-protobuf", "snappy"),
        ("Application/X-Protobuf; proto=prometheus.WriteRequest", "SNAPPY"),
    ],
)
def test_remote_write_1_0_headers_pass(
    content_type: str | None, content_encoding: str | None
) -> None:
    check_headers(content_type, content_encoding)


@pytest.mark.parametrize(
    ("content_type", "content_encoding"),
    [
        ("application/json", "snappy"),
        ("application/x-protobuf;proto=io.prometheus.write.v2.Request", "snappy"),
        ("application/x-protobuf", "zstd"),
    ],
)
def test_other_headers_are_unsupported(content_type: str, content_encoding: str) -> None:
    with pytest.raises(UnsupportedMedia):
        check_headers(content_type, content_encoding)


def test_one_block_holds_the_request_in_order() -> None:
    handed, outcome = receive(
        remote_write.series("a_total", {"x": "1"}, [T0, T0 + 1], [1.0, 2.0]),
        remote_write.series("b", {}, [T0], [3.0]),
        remote_write.series("a_total", {"x": "1"}, [T0 + 2], [4.0]),  # the same series again
    )
    [block] = handed
    assert isinstance(block, SampleColumns)
    assert block.table.metrics == ("a_total", "b")
    assert block.table.kinds == (SeriesKind.COUNTER, SeriesKind.GAUGE)
    assert block.series.tolist() == [0, 0, 1, 0]
    assert (block.micros // 1000).tolist() == [T0, T0 + 1, T0, T0 + 2]
    assert np.array_equal(block.values, [1.0, 2.0, 3.0, 4.0])
    assert outcome.samples_kept == 4


def test_a_later_repeat_of_a_series_must_come_after_its_samples() -> None:
    _, outcome = receive(
        remote_write.series("g", {}, [T0 + 5], [1.0]),
        remote_write.series("g", {}, [T0 + 1], [2.0]),
    )
    assert outcome.samples_refused == 1
    assert "out-of-order" in outcome.message


def test_the_answer_names_a_few_refusals_and_counts_the_rest() -> None:
    bad = [RemoteSeries([("__name__", f"bad-{i}")], [T0], [1.0]) for i in range(MAX_REASONS + 3)]
    handed, outcome = receive(*bad)
    assert handed == []
    assert outcome.message.count("invalid metric name") == MAX_REASONS
    assert outcome.message.endswith("; and 3 more")


def test_a_request_refused_whole_hands_on_nothing() -> None:
    receiver = RemoteWriteReceiver(max_body_bytes=1024)
    handed: list[Batch] = []
    with pytest.raises(TooLarge):
        receiver.write(b"x" * 1025, content_type=None, content_encoding=None, submit=handed.extend)
    with pytest.raises(Malformed):
        receiver.write(b"\xff" * 10, content_type=None, content_encoding=None, submit=handed.extend)
    assert handed == []
