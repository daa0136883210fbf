"""The scrape source on real dcgm-exporter captures (see fixtures/README.md for provenance)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from collector.sources.scrape import ScrapeSource, parse_exposition
from tuneloop.storage.timeseries.types import SeriesKind

FIXTURES = Path(__file__).parent / "fixtures"
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
K8S = (FIXTURES / "dcgm-exporter-k8s-rtx4000ada.txt").read_text()
MIG = (FIXTURES / "dcgm-exporter-mig-a800.txt").read_text()


def test_kubernetes_capture_keeps_every_sample_and_pod_attribution() -> None:
    result = parse_exposition(K8S, NOW)
    assert result.dropped_lines == 0
    assert len(result.points) == 25
    by_metric = {p.metric: p for p in result.points}
    power = by_metric["DCGM_FI_DEV_POWER_USAGE"]
    assert power.value == pytest.approx(40.979)
    assert power.labels["pod"] == "cuda-75454ffb9f-8ljq7"
    assert power.labels["namespace"] == "default"
    assert power.labels["container"] == "cuda"
    assert power.labels["Hostname"] == "lke529760-766837-0a634ab30000"
    assert power.labels["DCGM_FI_DRIVER_VERSION"] == "580.95.05"
    xid = by_metric["DCGM_FI_DEV_XID_ERRORS"]
    assert (xid.labels["err_code"], xid.labels["err_msg"]) == ("0", "No Error")
    # Declared counters keep their exact names (no added _total) and are stored as counters.
    energy = by_metric["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    assert energy.kind is SeriesKind.COUNTER
    assert energy.value == 455497156
    assert by_metric["DCGM_FI_DEV_GPU_TEMP"].kind is SeriesKind.GAUGE


def test_mig_capture_keeps_instances_apart() -> None:
    result = parse_exposition(MIG, NOW)
    assert result.dropped_lines == 0
    fb_free = [p for p in result.points if p.metric == "DCGM_FI_DEV_FB_FREE"]
    instances = {p.labels.get("GPU_I_ID") for p in fb_free if p.labels["gpu"] == "0"}
    assert instances == {"3", "5", "6"}
    assert {p.labels["GPU_I_PROFILE"] for p in fb_free if "GPU_I_ID" in p.labels} == {"2g.20gb"}
    assert sum(p.value for p in fb_free) == 3 * 19957 + 7 * 81226
    # Ten label sets per MIG-aware family, seven whole GPUs for the remapped-rows counter.
    assert len(result.points) == 3 * 10 + 7


class _Capture(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = K8S.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def capture_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()


def test_live_endpoint_serving_the_capture(capture_url: str) -> None:
    source = ScrapeSource(capture_url, timeout_s=2)
    source.start()
    try:
        points = source.collect(NOW)
    finally:
        source.shutdown()
    assert len(points) == 25
    assert all(p.labels["pod"] == "cuda-75454ffb9f-8ljq7" for p in points)
