"""The remote-write client against a real VictoriaMetrics and a real HTTP server that answers
what a busy TSDB answers: writes split into requests, the project label, NaN left out, 4xx
reported as rejections, connection errors, 5xx and 429 raised as temporary."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from collector.sinks.base import SinkUnavailable
from collector.sinks.remote_write import RemoteWriteSink
from tests.peers import running_victoria_metrics
from tests.remote_write.conftest import exported
from tuneloop.ports import free_port
from tuneloop.storage.prometheus.remote_writer import RemoteWriter, RemoteWriteUnavailable
from tuneloop.storage.timeseries.columns import SampleColumns, SeriesTable
from tuneloop.storage.timeseries.types import RejectionCode, SeriesBatch, SeriesKind

T0 = datetime(2026, 11, 1, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)


@pytest.fixture(scope="module")
def vm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_victoria_metrics(tmp_path_factory.mktemp("vm")) as url:
        yield url


@pytest.fixture
def answering() -> Iterator[tuple[str, list[int]]]:
    """A server answering each POST with the next status of the list it yields (and
    ``Retry-After: 7``), the last one for ever after; its URL."""
    statuses: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            code = statuses.pop(0) if len(statuses) > 1 else statuses[0]
            self.send_response(code)
            self.send_header("Retry-After", "7")
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"nope")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # Polled every 50 ms: shutdown() waits for the next poll (0.5 s by default).
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/api/v1/write", statuses
    server.shutdown()
    server.server_close()


def test_a_large_write_is_split_and_arrives_whole(vm: str) -> None:
    writer = RemoteWriter(f"{vm}/api/v1/write", max_samples_per_request=7)
    stamps = [T0 + timedelta(seconds=i) for i in range(10)]
    table = SeriesTable(
        ("block_gauge", "block_total"), ({"a": "1"}, {}), (SeriesKind.GAUGE, SeriesKind.COUNTER)
    )
    block = SampleColumns(
        table,
        np.array([0, 1, 0, 1], dtype=np.intp),
        np.array(
            [T0_MS * 1000, T0_MS * 1000, (T0_MS + 1000) * 1000, (T0_MS + 1000) * 1000],
            dtype=np.int64,
        ),
        np.array([1.0, 10.0, 2.0, float("nan")]),
    )
    result = writer.write(
        41,
        [SeriesBatch("split_gauge", {"gpu": "0"}, stamps, [float(i) for i in range(10)]), block],
    )
    writer.close()
    assert result.samples_written == 13
    assert [(r.code, r.samples) for r in result.rejected] == [(RejectionCode.NAN_VALUE, 1)]
    assert exported(vm, 41) == {
        ("split_gauge", frozenset({("gpu", "0")})): [
            (T0_MS + 1000 * i, float(i)) for i in range(10)
        ],
        ("block_gauge", frozenset({("a", "1")})): [(T0_MS, 1.0), (T0_MS + 1000, 2.0)],
        ("block_total", frozenset()): [(T0_MS, 10.0)],
    }


def test_a_4xx_is_a_rejection_not_retried(answering: tuple[str, list[int]]) -> None:
    url, statuses = answering
    statuses.append(400)
    writer = RemoteWriter(url)
    result = writer.write(1, [SeriesBatch("g", {}, [T0], [1.0])])
    assert result.samples_written == 0
    [rejection] = result.rejected
    assert rejection.code == RejectionCode.REMOTE_REJECTED
    assert rejection.samples == 1
    assert "400" in rejection.reason


@pytest.mark.parametrize("status", [503, 500, 429])
def test_5xx_and_429_are_temporary(answering: tuple[str, list[int]], status: int) -> None:
    url, statuses = answering
    statuses.append(status)
    with pytest.raises(RemoteWriteUnavailable) as raised:
        RemoteWriter(url).write(1, [SeriesBatch("g", {}, [T0], [1.0])])
    assert raised.value.retry_after_s == 7.0


def test_an_unreachable_tsdb_makes_the_sink_unavailable(tmp_path: Path) -> None:
    sink = RemoteWriteSink(RemoteWriter(f"http://127.0.0.1:{free_port()}/api/v1/write"))
    with pytest.raises(SinkUnavailable):
        sink.write(1, [SeriesBatch("g", {}, [T0], [1.0])])
