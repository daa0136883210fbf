"""A TSDB whose writes and reads live at different URLs (a VictoriaMetrics cluster's vminsert and
vmselect, Mimir's distributor and querier): ``TUNELOOP_TSDB_WRITE_URL`` and
``TUNELOOP_TSDB_HEADERS``, on two real VictoriaMetrics, one written and one read; the tenant
header on a fake Mimir (a recording HTTP server), named as such below."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.peers import flush_victoria_metrics, running_victoria_metrics
from tuneloop.settings import SettingsError, load_settings
from tuneloop.storage.timeseries.backends import open_remote_backend
from tuneloop.storage.timeseries.types import SeriesBatch
from tuneloop.storage.types import utcnow


def test_writes_go_to_the_write_url_and_reads_to_the_url(
    victoria_metrics_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = random.randrange(10**9)
    now = utcnow().replace(microsecond=0)
    times = [now - timedelta(seconds=s) for s in (30, 20, 10)]
    with running_victoria_metrics(tmp_path / "insert") as insert_url:
        # vmselect's and vminsert's shapes, on single nodes (which take the /prometheus prefix).
        monkeypatch.setenv("TUNELOOP_TSDB_URL", f"{insert_url}/prometheus")
        monkeypatch.setenv("TUNELOOP_TSDB_WRITE_URL", f"{insert_url}/api/v1/write")
        written = open_remote_backend(load_settings())
        assert written is not None
        try:
            result = written.write(
                project, [SeriesBatch("tl_gpu_util", {"gpu": "0"}, times, [1.0, 2.0, 3.0])]
            )
            assert not result.rejected
            flush_victoria_metrics(insert_url)
            assert [s.labels for s in written.find_series(project, "tl_gpu_util")] == [{"gpu": "0"}]
        finally:
            written.close()
        # Reads at another TSDB than the writes: nothing written there.
        monkeypatch.setenv("TUNELOOP_TSDB_URL", victoria_metrics_url)
        elsewhere = open_remote_backend(load_settings())
        assert elsewhere is not None
        try:
            assert elsewhere.find_series(project, "tl_gpu_util") == []
        finally:
            elsewhere.close()


class _FakeMimir(BaseHTTPRequestHandler):
    """A fake standing in for Mimir, which cannot run here: it answers every request as an
    empty success and records only the path and the tenant header, which is all the test
    checks. What a real TSDB does with the writes and reads is tested on VictoriaMetrics above."""

    def do_POST(self) -> None:
        self.server.seen.append((self.path, self.headers.get("X-Scope-OrgID")))  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        body = b'{"status":"success","data":[]}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeMimir)
    server.seen = []  # type: ignore[attr-defined]
    # Polled every 50 ms: shutdown() waits for the next poll (0.5 s by default).
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_headers_go_with_every_read_and_write(
    recorder: ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Mimir's shape: writes to the distributor's /api/v1/push, reads from /prometheus.
    base = f"http://127.0.0.1:{recorder.server_address[1]}"
    monkeypatch.setenv("TUNELOOP_TSDB_URL", f"{base}/prometheus")
    monkeypatch.setenv("TUNELOOP_TSDB_WRITE_URL", f"{base}/api/v1/push")
    monkeypatch.setenv("TUNELOOP_TSDB_HEADERS", '{"X-Scope-OrgID": "gpu-fleet"}')
    backend = open_remote_backend(load_settings())
    assert backend is not None
    try:
        now = utcnow()
        backend.write(1, [SeriesBatch("tl_gpu_util", {"gpu": "0"}, [now], [1.0])])
        backend.find_series(1, "tl_gpu_util")
    finally:
        backend.close()
    seen = recorder.seen  # type: ignore[attr-defined]
    assert ("/api/v1/push", "gpu-fleet") in seen
    assert ("/prometheus/api/v1/series", "gpu-fleet") in seen


def test_a_write_url_must_be_a_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNELOOP_TSDB_WRITE_URL", "vminsert:8480/insert/0/prometheus")
    with pytest.raises(SettingsError, match="TUNELOOP_TSDB_WRITE_URL"):
        load_settings()
