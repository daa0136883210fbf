"""Every panel of the Fleet (Prometheus) dashboard, run by a real Prometheus that scrapes the
real dcgm-exporter captures (and a node-exporter page), shows exactly the hosts, GPUs and MIG
instances the captures hold; its variables list them, and narrowing them narrows the panels."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from dashboards.grafana_sql import GrafanaQuery, Variable
from tests.peers import prom_api, running_prometheus
from tuneloop.storage.types import utcnow

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests/collector/fixtures"
CAPTURES = sorted(FIXTURES.glob("dcgm-exporter-*.txt"))
NODE = FIXTURES / "node-exporter-metrics.txt"
BOARD = json.loads((ROOT / "dashboards/fleet-prometheus.json").read_text())
Series = tuple[str, str, str, str]
"""(Hostname, gpu, GPU_I_ID, device) of one answer; '' where the label is absent."""


def key(labels: dict[str, str]) -> Series:
    return tuple(labels.get(n, "") for n in ("Hostname", "gpu", "GPU_I_ID", "device"))  # type: ignore[return-value]


_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? \S+")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def held(pages: list[Path], metric: str) -> list[dict[str, str]]:
    """The label sets of ``metric`` in the exporter pages, as a scraping Prometheus reads them
    (names and labels as written: the collector's parser may normalize them)."""
    found = []
    for page in pages:
        for line in page.read_text().splitlines():
            match = _SAMPLE.match(line)
            if match is not None and not line.startswith("#") and match.group(1) == metric:
                found.append(dict(_LABEL.findall(match.group(2) or "")))
    return found


@contextmanager
def serving(page: Path) -> Iterator[str]:
    """An exporter on a loopback port answering every GET with ``page``; its host:port."""
    body = page.read_bytes()

    class Exporter(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A Prometheus scraping each capture as a ``dcgm`` target and the node page as ``node``;
    its URL and the instance of each page."""
    with ExitStack() as stack:
        instances = {page.stem: stack.enter_context(serving(page)) for page in [*CAPTURES, NODE]}
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {
                    "job_name": "node" if stem.startswith("node") else "dcgm",
                    "static_configs": [{"targets": [instance]}],
                }
                for stem, instance in instances.items()
            ],
        }
        # One scrape config per job name: merge the dcgm targets into one.
        dcgm = [c for c in config["scrape_configs"] if c["job_name"] == "dcgm"]
        merged = {
            "job_name": "dcgm",
            "static_configs": [s for c in dcgm for s in c["static_configs"]],
        }
        config["scrape_configs"] = [merged, *(c for c in config["scrape_configs"] if c not in dcgm)]
        url = stack.enter_context(running_prometheus(config, tmp_path_factory.mktemp("prom")))
        deadline = time.monotonic() + 60
        # Two scrapes of every target, so rates have two samples.
        while (
            len(prom_api(url, "/api/v1/query", {"query": "count_over_time(up[1m]) >= 3"})["result"])
            < 4
        ):
            assert time.monotonic() < deadline, "prometheus never scraped the pages twice"
            time.sleep(0.3)
        yield url, instances


def variable_values(url: str, query: str, chosen: dict[str, Variable]) -> list[str]:
    """A ``label_values(selector, label)`` variable as Grafana asks Prometheus for it."""
    grafana = GrafanaQuery(utcnow() - timedelta(hours=1), utcnow(), chosen)
    selector, label = (
        grafana.expand_promql(query).removeprefix("label_values(")[:-1].rsplit(", ", 1)
    )
    values: list[str] = prom_api(url, f"/api/v1/label/{label}/values", {"match[]": selector})
    return values


def panel_answers(url: str, chosen: dict[str, Variable]) -> dict[tuple[str, str], set[Series]]:
    grafana = GrafanaQuery(utcnow() - timedelta(hours=1), utcnow(), chosen)
    answers = {}
    for panel in BOARD["panels"]:
        for target in panel["targets"]:
            expr = grafana.expand_promql(target["expr"])
            result = prom_api(url, "/api/v1/query", {"query": expr})["result"]
            answers[(panel["title"], target["refId"])] = {key(item["metric"]) for item in result}
    return answers


def expected(target: dict[str, Any], pages: list[Path], hostname: str | None = None) -> set[Series]:
    """What a target must show: every series of its metric in the pages (one, unlabelled,
    for a sum or mean; MIG instances only for the MIG table)."""
    metric = re.search(r"([A-Za-z_:][A-Za-z0-9_:]*)\{", target["expr"]).group(1)  # type: ignore[union-attr]
    found = {key(labels) for labels in held(pages, metric)}
    if hostname is not None:
        found = {s for s in found if s[0] == hostname}
    if 'GPU_I_PROFILE!=""' in target["expr"]:
        found = {s for s in found if s[2]}
    if target["expr"].startswith(("sum(", "avg(")):
        found = {("", "", "", "")} if found else set()
    return found


def test_every_panel_shows_the_captured_gpus_with_every_variable_at_all(
    prometheus: tuple[str, dict[str, str]],
) -> None:
    url, instances = prometheus
    everything = {
        v["name"]: Variable(v["allValue"])
        for v in BOARD["templating"]["list"]
        if v["type"] == "query"
    }
    answers = panel_answers(url, everything)
    for panel in BOARD["panels"]:
        for target in panel["targets"]:
            want = expected(target, [*CAPTURES, NODE])
            assert answers[(panel["title"], target["refId"])] == want, (
                panel["title"],
                target["expr"],
            )
    mig = answers[("MIG instances", "A")]
    assert {(host, gpu, instance) for host, gpu, instance, _ in mig} >= {
        ("msxf-hpc-64-35-ai", "0", "3"),
        ("msxf-hpc-64-35-ai", "0", "5"),
        ("msxf-hpc-64-35-ai", "0", "6"),
    }
    assert answers[("GPU utilization", "A")], "the k8s capture reports utilization"
    assert answers[("Network I/O per host and interface", "A")], "node-exporter's interfaces"

    # The variables list what the pages hold.
    def values(name: str, chosen: dict[str, Variable]) -> list[str]:
        query = next(v for v in BOARD["templating"]["list"] if v["name"] == name)["query"]
        return variable_values(url, query["query"], chosen)

    assert sorted(values("job", everything)) == ["dcgm", "node"]
    assert sorted(values("instance", everything)) == sorted(instances.values())
    hosts = {labels.get("Hostname") for labels in held(CAPTURES, "DCGM_FI_DEV_FB_USED")}
    assert set(values("Hostname", everything)) == hosts - {None}


def test_narrowing_the_variables_narrows_every_panel(
    prometheus: tuple[str, dict[str, str]],
) -> None:
    url, instances = prometheus
    mig = "dcgm-exporter-mig-a800"
    chosen = {
        "job": Variable(["dcgm"], multi=True, include_all=True),
        "instance": Variable([instances[mig]], multi=True, include_all=True),
        "Hostname": Variable(["msxf-hpc-64-35-ai"], multi=True, include_all=True),
        "gpu": Variable([".*"]),
    }
    answers = panel_answers(url, chosen)
    for panel in BOARD["panels"]:
        for target in panel["targets"]:
            want = expected(target, [FIXTURES / f"{mig}.txt"], "msxf-hpc-64-35-ai")
            assert answers[(panel["title"], target["refId"])] == want, (
                panel["title"],
                target["expr"],
            )
    assert {s[1] for s in answers[("Framebuffer memory used", "A")]} == {str(g) for g in range(8)}
