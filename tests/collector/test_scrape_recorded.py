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


HOSTNAME_MIG_XID = (FIXTURES / "dcgm-exporter-hostname-mig-xid.txt").read_text()


def test_vocabulary_capture_mig_instances_xid_counters_and_no_sentinel() -> None:
    result = parse_exposition(HOSTNAME_MIG_XID, NOW)
    assert result.dropped_lines == 0
    # The MIG instances' "not supported" memory temperatures are no readings.
    assert result.dropped_samples == 2
    memory = [p for p in result.points if p.metric == "DCGM_FI_DEV_MEMORY_TEMP"]
    assert sorted(p.value for p in memory) == [30.0, 55.0, 71.0]
    assert all(p.labels["Hostname"] == "gpu-node-42" for p in result.points)
    # Empty pod, namespace and container labels (an idle GPU) are no labels.
    idle = next(p for p in result.points if p.metric == "DCGM_FI_DEV_GPU_UTIL" and p.value == 0)
    assert "pod" not in idle.labels and "namespace" not in idle.labels
    assert all("" not in p.labels.values() for p in result.points)
    (counted,) = [p for p in result.points if p.metric == "DCGM_EXP_XID_ERRORS_COUNT"]
    assert (counted.labels["xid"], counted.labels["gpu"], counted.value) == ("48", "1", 2.0)
    assert counted.kind is SeriesKind.COUNTER
    slices = {
        (p.labels["GPU_I_PROFILE"], p.labels["GPU_I_ID"])
        for p in result.points
        if p.metric == "DCGM_FI_PROF_GR_ENGINE_ACTIVE" and "GPU_I_ID" in p.labels
    }
    assert slices == {("3g.40gb", "1"), ("1g.10gb", "9")}


def test_the_newer_hostname_and_empty_labels_on_the_real_captures() -> None:
    newer = parse_exposition((FIXTURES / "dcgm-exporter-metrics.txt").read_text(), NOW)
    assert {p.labels.get("Hostname") for p in newer.points} == {"gpu-node-17"}
    assert not any("hostname" in p.labels for p in newer.points)
    # The Kubernetes capture's pod_uid="" is dropped, as Prometheus drops it.
    assert not any("pod_uid" in p.labels for p in parse_exposition(K8S, NOW).points)


def test_a_sentinel_is_dropped_only_from_dcgm_families() -> None:
    text = (
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",hostname="n1"} 9223372036854775794\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="1",hostname="n1"} 2147483632\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="2",hostname="n1"} 140737488355328.000000\n'
        'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",hostname="n1"} 2147483700\n'
        'node_network_receive_bytes_total{device="eth0",hostname="n1"} 9223372036854775794\n'
    )
    result = parse_exposition(text, NOW)
    assert result.dropped_samples == 3
    kept = {(p.metric, p.value): dict(p.labels) for p in result.points}
    assert kept == {
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 2147483700.0): {"gpu": "0", "Hostname": "n1"},
        # Not dcgm-exporter's: its names and values are its own.
        ("node_network_receive_bytes_total", 9223372036854775794.0): {
            "device": "eth0",
            "hostname": "n1",
        },
    }
