"""``promtool check metrics`` over ``/metrics`` and a project's exposition: histograms and
summaries are typed as such, every family has HELP, and real dcgm-exporter captures come out
with no problem the exporter's own page does not have."""

from __future__ import annotations

import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from collector.points import to_batches
from collector.sources.scrape import parse_exposition
from tests.api.conftest import Minter, bearer
from tests.helpers import promtool
from tuneloop.runtime import Runtime
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter
from tuneloop.storage.types import utcnow

FIXTURES = Path(__file__).resolve().parents[1] / "collector/fixtures"
CAPTURES = sorted(FIXTURES.glob("dcgm-exporter-*.txt"))


def check_metrics(text: str) -> tuple[int, set[str]]:
    """promtool's exit status and its problems (``name text`` lines)."""
    run = subprocess.run(
        [promtool(), "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    return run.returncode, {line for line in run.stderr.splitlines() if line.strip()}


def histograms_and_summaries() -> list[SeriesBatch]:
    """An OTLP histogram and summary as the receiver stores them (classic series)."""
    now = utcnow()
    stamps = [now - timedelta(seconds=30)]
    job = {"job": "serve", "instance": "pod-1"}

    def batch(name: str, labels: dict[str, str], value: float) -> SeriesBatch:
        kind = SeriesKind.GAUGE if "quantile" in labels else SeriesKind.COUNTER
        return SeriesBatch(name, {**job, **labels}, stamps, [value], kind)

    latency = "http_server_request_duration_seconds"
    return [
        *(
            batch(f"{latency}_bucket", {"le": le}, count)
            for le, count in (("0.1", 3), ("1.0", 7), ("+Inf", 9))
        ),
        batch(f"{latency}_sum", {}, 4.5),
        batch(f"{latency}_count", {}, 9),
        batch("rpc_duration_seconds", {"quantile": "0.5"}, 0.02),
        batch("rpc_duration_seconds", {"quantile": "0.99"}, 0.3),
        batch("rpc_duration_seconds_sum", {}, 12.0),
        batch("rpc_duration_seconds_count", {}, 400),
        SeriesBatch("train_tokens_total", job, stamps, [4096.0], SeriesKind.COUNTER),
        SeriesBatch("tuneloop_step_duration_seconds", job, stamps, [0.5]),
    ]


def test_histograms_and_summaries_are_families_of_their_type(
    client: TestClient, runtime: Runtime, mint: Minter
) -> None:
    project = mint.project("vision")
    assert not SampleWriter(runtime.engine).write(project, histograms_and_summaries()).rejected
    text = client.get("/api/v1/projects/vision/metrics", headers=bearer(mint.token("vision"))).text
    assert "# TYPE http_server_request_duration_seconds histogram" in text
    assert "# TYPE rpc_duration_seconds summary" in text
    assert "# TYPE train_tokens_total counter" in text
    assert "_bucket counter" not in text and "_count counter" not in text
    families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP")]
    assert helps == families and len(families) == 4
    assert check_metrics(text) == (0, set())


def test_only_real_buckets_and_quantiles_make_a_family(
    client: TestClient, runtime: Runtime, mint: Minter
) -> None:
    """A ``_bucket`` without numeric ``le`` or a ``quantile`` that is not a number is a series
    of its own kind, not a histogram or summary Prometheus would refuse to parse."""
    now = [utcnow() - timedelta(seconds=30)]
    project = mint.project("vision")
    batches = [
        SeriesBatch("queue_bucket", {"queue": "a"}, now, [3.0]),
        SeriesBatch("queue_bucket_sum", {}, now, [3.0], SeriesKind.COUNTER),
        SeriesBatch("latency_seconds", {"quantile": "p99"}, now, [0.3]),
        SeriesBatch("latency_seconds_count", {}, now, [4.0], SeriesKind.COUNTER),
    ]
    assert not SampleWriter(runtime.engine).write(project, batches).rejected
    text = client.get("/api/v1/projects/vision/metrics", headers=bearer(mint.token("vision"))).text
    types = {line.split()[2]: line.split()[3] for line in text.splitlines() if "# TYPE" in line}
    assert types == {
        "queue_bucket": "gauge",
        "queue_bucket_sum": "counter",
        "latency_seconds": "gauge",
        "latency_seconds_count": "counter",
    }
    # promtool parses it (1 would be a parse error) and only lints the names it was given.
    status, problems = check_metrics(text)
    assert status == 3 and all(p.split()[0] in types for p in problems), problems


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.stem)
def test_dcgm_captures_come_out_as_clean_as_the_exporter_wrote_them(
    client: TestClient, runtime: Runtime, mint: Minter, capture: Path
) -> None:
    page = capture.read_text()
    points = parse_exposition(page, utcnow() - timedelta(seconds=10)).points
    project = mint.project("fleet")
    assert not SampleWriter(runtime.engine).write(project, to_batches(points)).rejected
    text = client.get("/api/v1/projects/fleet/metrics", headers=bearer(mint.token("fleet"))).text
    status, problems = check_metrics(text)
    _, exporters_own = check_metrics(page)
    # dcgm-exporter's camelCase label names and counters without _total are its vocabulary,
    # which dashboards and rules are written against: kept, never renamed.
    assert status in (0, 3) and problems <= exporters_own, problems - exporters_own
    assert "DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB)." in text.replace("# HELP ", "")


def test_the_apis_own_metrics_pass_promtool(client: TestClient, mint: Minter) -> None:
    mint.project("vision")
    client.get("/api/v1/projects/vision/metrics", headers=bearer(mint.token("vision")))
    response = client.get("/metrics")
    assert response.status_code == 200
    assert check_metrics(response.text) == (0, set())
