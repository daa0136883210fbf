"""ScrapeSource on dcgm-exporter / node-exporter pages: parsed from the recorded files and
served by a live local HTTP endpoint."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from collector.points import Point
from collector.sources.scrape import ACCEPT, ScrapeError, ScrapeSource, parse_exposition
from tuneloop.storage.timeseries.types import SeriesKind

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
FIXTURES = Path(__file__).parent / "fixtures"
DCGM_PAGE = (FIXTURES / "dcgm-exporter-metrics.txt").read_text()
NODE_PAGE = (FIXTURES / "node-exporter-metrics.txt").read_text()
DCGM_SAMPLES = 210  # sample lines in the recorded page
GPU7 = "GPU-6f1a3d98-b4e2-47c0-95a6-c83b0e2d7f49"


def find(points: list[Point], metric: str, **labels: str) -> list[Point]:
    return [
        p
        for p in points
        if p.metric == metric and all(p.labels.get(k) == v for k, v in labels.items())
    ]


def test_recorded_dcgm_exporter_page_is_ingested_whole() -> None:
    result = parse_exposition(DCGM_PAGE, NOW)
    points = result.points
    assert len(points) == DCGM_SAMPLES
    assert result.dropped_lines == result.dropped_samples == 0

    # Names as emitted: the parser's "_total" renaming of counters is undone.
    energy = find(points, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu="0")
    assert [(p.value, p.kind) for p in energy] == [(9312884417.0, SeriesKind.COUNTER)]
    assert not any(p.metric.endswith("_total") for p in points)
    assert {p.kind for p in find(points, "DCGM_FI_DEV_GPU_UTIL")} == {SeriesKind.GAUGE}
    power = find(points, "DCGM_FI_DEV_POWER_USAGE", gpu="2")[0]
    assert power.value == pytest.approx(694.508)  # "694.508000"
    assert list(power.labels) == [
        "gpu",
        "UUID",
        "pci_bus_id",
        "device",
        "modelName",
        "Hostname",
        "DCGM_FI_DRIVER_VERSION",
        "pod",
        "namespace",
        "container",
    ]
    assert power.labels["pod"] == "llm-pretrain-worker-0"
    assert all(p.ts == NOW for p in points)


def test_mig_xid_and_nvlink_lines_keep_their_labels() -> None:
    points = parse_exposition(DCGM_PAGE, NOW).points

    mig = find(points, "DCGM_FI_DEV_FB_USED", UUID=GPU7)
    assert {(p.labels["GPU_I_PROFILE"], p.labels["GPU_I_ID"], p.value) for p in mig} == {
        ("4g.40gb", "1", 36021.0),
        ("3g.40gb", "2", 0.0),
    }
    assert find(points, "DCGM_FI_DEV_GPU_UTIL", UUID=GPU7) == []  # blank per MIG instance
    assert find(mig, "DCGM_FI_DEV_FB_USED", GPU_I_ID="1")[0].labels["namespace"] == "inference"

    xid = find(points, "DCGM_FI_DEV_XID_ERRORS", gpu="2")[0]
    assert (xid.value, xid.labels["err_code"], xid.labels["err_msg"]) == (
        13.0,
        "13",
        "Graphics Engine Exception",
    )
    assert find(points, "DCGM_FI_DEV_XID_ERRORS", err_code="94")[0].labels["gpu"] == "5"

    links = find(points, "DCGM_FI_PROF_NVLINK_TX_BYTES")
    assert len(links) == 2
    assert {"gpu_uuid", "model_name", "nvlink"} <= set(links[0].labels)
    assert "UUID" not in links[0].labels


def test_node_exporter_families() -> None:
    points = parse_exposition(NODE_PAGE, NOW).points
    quantile = find(points, "go_gc_duration_seconds", quantile="0.5")[0]
    assert (quantile.value, quantile.kind) == (4.1213e-05, SeriesKind.GAUGE)
    assert find(points, "go_gc_duration_seconds_count")[0].kind is SeriesKind.COUNTER
    assert find(points, "go_gc_duration_seconds_sum")[0].kind is SeriesKind.COUNTER
    cpu = find(points, "node_cpu_seconds_total", cpu="1", mode="user")[0]
    assert (cpu.value, cpu.kind) == (99102.35, SeriesKind.COUNTER)
    assert find(points, "node_boot_time_seconds")[0].value == 1.731912345e09
    assert find(points, "node_load1")[0].kind is SeriesKind.GAUGE
    assert len(find(points, "promhttp_metric_handler_requests_total")) == 3


def test_a_malformed_line_costs_only_itself() -> None:
    lines = DCGM_PAGE.splitlines()
    lines.insert(40, 'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="broken} 54')  # unterminated quote
    lines.insert(90, "this is not exposition format")
    result = parse_exposition("\n".join(lines), NOW)

    assert result.dropped_lines == 2
    assert len(result.points) == DCGM_SAMPLES
    # Types survive the line-by-line pass: from the # TYPE lines.
    energy = find(result.points, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu="3")[0]
    assert energy.kind is SeriesKind.COUNTER
    assert find(result.points, "DCGM_FI_DEV_SM_CLOCK")[0].kind is SeriesKind.GAUGE


def test_histograms_timestamps_untyped_and_non_finite_values() -> None:
    text = (
        "# TYPE request_seconds histogram\n"
        'request_seconds_bucket{le="0.1"} 3\n'
        'request_seconds_bucket{le="+Inf"} 5\n'
        "request_seconds_sum 0.71\n"
        "request_seconds_count 5\n"
        "untyped_events_total 7\n"
        "stamped_gauge 1.5 1700000000000\n"
        "broken_gauge NaN\n"
    )
    result = parse_exposition(text, NOW)
    points = result.points
    buckets = find(points, "request_seconds_bucket")
    assert [(p.labels["le"], p.value, p.kind) for p in buckets] == [
        ("0.1", 3.0, SeriesKind.COUNTER),
        ("+Inf", 5.0, SeriesKind.COUNTER),
    ]
    assert find(points, "request_seconds_sum")[0].kind is SeriesKind.COUNTER
    assert find(points, "untyped_events_total")[0].kind is SeriesKind.COUNTER
    assert find(points, "stamped_gauge")[0].ts == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    assert find(points, "broken_gauge") == []
    assert result.dropped_samples == 1


def test_openmetrics_counters_keep_their_total_suffix() -> None:
    text = "# TYPE jobs counter\njobs_total 3.0\njobs_created 1.7e9\n# TYPE temp gauge\ntemp 41\n"
    points = parse_exposition(text, NOW, openmetrics=True).points  # no "# EOF": tolerated
    assert [(p.metric, p.kind) for p in points] == [
        ("jobs_total", SeriesKind.COUNTER),
        ("jobs_created", SeriesKind.COUNTER),
        ("temp", SeriesKind.GAUGE),
    ]


# -- live endpoint ---------------------------------------------------------------------------


class _Exporter(BaseHTTPRequestHandler):
    body = DCGM_PAGE.encode()
    content_type = "text/plain; version=0.0.4; charset=utf-8"
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def exporter_url() -> Iterator[str]:
    yield from _serve(_Exporter)


def test_live_endpoint_is_scraped(exporter_url: str) -> None:
    source = ScrapeSource(exporter_url, timeout_s=2)
    source.start()
    try:
        points = source.collect(NOW)
    finally:
        source.shutdown()
    assert len(points) == DCGM_SAMPLES
    port = exporter_url.split(":")[2].split("/")[0]
    assert {p.labels["instance"] for p in points} == {f"127.0.0.1:{port}"}
    assert source.name == f"scrape:{exporter_url}"


def test_accept_header_and_injected_client(exporter_url: str) -> None:
    seen: list[str] = []

    def record(request: httpx.Request) -> None:
        seen.append(request.headers["accept"])

    with httpx.Client(event_hooks={"request": [record]}) as client:
        points = ScrapeSource(exporter_url, client=client, relabel_instance=False).collect(NOW)
    assert seen == [ACCEPT]
    assert "instance" not in points[0].labels


def test_exporter_down_raises() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    source = ScrapeSource(f"http://127.0.0.1:{port}/metrics", timeout_s=1)
    with pytest.raises(ScrapeError, match="failed"):
        source.collect(NOW)
    source.shutdown()


def test_http_error_status_raises() -> None:
    class Failing(_Exporter):
        status = 503
        body = b"collector not ready\n"

    for url in _serve(Failing):
        with pytest.raises(ScrapeError, match="503"):
            ScrapeSource(url, timeout_s=2).collect(NOW)


def test_openmetrics_response_is_parsed_as_such() -> None:
    class OpenMetrics(_Exporter):
        content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8"
        body = b'# TYPE up gauge\nup{instance="x"} 1\n# TYPE jobs counter\njobs_total 2\n# EOF\n'

    for url in _serve(OpenMetrics):
        points = ScrapeSource(url, timeout_s=2).collect(NOW)
    assert [(p.metric, p.kind) for p in points] == [
        ("up", SeriesKind.GAUGE),
        ("jobs_total", SeriesKind.COUNTER),
    ]
    # The exporter's own instance label is kept aside, as Prometheus does.
    assert points[0].labels["exported_instance"] == "x"


def test_invalid_url_is_rejected_at_construction() -> None:
    with pytest.raises(ValueError, match="http"):
        ScrapeSource("gpu-node-1:9400/metrics")


def test_restart_after_shutdown_as_the_runner_does(exporter_url: str) -> None:
    source = ScrapeSource(exporter_url, timeout_s=2)
    source.start()
    first = source.collect(NOW)
    source.shutdown()
    source.start()
    assert source.collect(NOW) == first
    source.shutdown()
