"""``/api/v1/projects/{p}/metrics``: the text format on both backends, and a real Prometheus
scraping it (the Debian package's binary, installed by ``.ci/ensure-tools``)."""

from __future__ import annotations

import json
import re
import time
import urllib.parse
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from collector.pipeline import Pipeline
from collector.sinks.store import StoreSink
from dashboards.grafana_sql import GrafanaQuery, Variable
from tests.api.conftest import Minter, bearer
from tests.helpers import api_server
from tests.peers import running_prometheus
from tuneloop.accounts import get_project_by_name
from tuneloop.runtime import Runtime
from tuneloop.storage import session_scope
from tuneloop.storage.timeseries import query
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter
from tuneloop.storage.types import utcnow

ROOT = Path(__file__).resolve().parents[2]
SCRAPE_JOB = "tuneloop-scrape"
HOSTILE = "quote \" backslash \\ newline \n and '; DROP TABLE series; --"


def fleet(now: datetime) -> list[SeriesBatch]:
    """Job- and fleet-level series, each with older samples and a newest one."""
    stamps = [now - timedelta(seconds=s) for s in (90, 60, 30)]
    gpu = {"gpu": "0", "UUID": "GPU-1", "Hostname": "gpu-node-1", "modelName": "H100"}
    return [
        SeriesBatch("DCGM_FI_DEV_GPU_UTIL", gpu, stamps, [10.0, 20.0, 87.0]),
        SeriesBatch("DCGM_FI_DEV_GPU_UTIL", {**gpu, "gpu": "1"}, stamps, [1.0, 2.0, 3.5]),
        SeriesBatch(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            gpu,
            stamps,
            [1e9, 1.5e9, 2.25e9],
            SeriesKind.COUNTER,
        ),
        SeriesBatch(
            "tuneloop_step_duration_seconds", {"job": "llama", "rank": "0"}, stamps, [1, 2, 0.5]
        ),
        SeriesBatch(
            "train_tokens_total", {"job": "llama"}, stamps, [1, 2, 4096], SeriesKind.COUNTER
        ),
        SeriesBatch("tuneloop_odd", {"Hostname": HOSTILE}, stamps, [1.0, 2.0, float("inf")]),
        # Names only a relabel rule could make; sanitized as the OTLP receiver does.
        SeriesBatch("gpu.memory-used", {"k8s.pod.name": "p-1", "__meta": "m"}, stamps, [1, 2, 3]),
        # Too old for the default max_age of 5 minutes.
        SeriesBatch("stale_metric", {}, [now - timedelta(hours=1)], [1.0]),
    ]


def expected_samples(
    now: datetime,
) -> dict[tuple[str, frozenset[tuple[str, str]]], tuple[float, int]]:
    """What the view must show: (name, labels) -> (value, timestamp in ms)."""
    millis = int((now - timedelta(seconds=30)).timestamp() * 1000)
    gpu = {"gpu": "0", "UUID": "GPU-1", "Hostname": "gpu-node-1", "modelName": "H100"}

    def key(name: str, labels: dict[str, str]) -> tuple[str, frozenset[tuple[str, str]]]:
        return name, frozenset(labels.items())

    return {
        key("DCGM_FI_DEV_GPU_UTIL", gpu): (87.0, millis),
        key("DCGM_FI_DEV_GPU_UTIL", {**gpu, "gpu": "1"}): (3.5, millis),
        key("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu): (2.25e9, millis),
        key("tuneloop_step_duration_seconds", {"job": "llama", "rank": "0"}): (0.5, millis),
        key("train_tokens_total", {"job": "llama"}): (4096.0, millis),
        key("tuneloop_odd", {"Hostname": HOSTILE}): (float("inf"), millis),
        key("gpu_memory_used", {"k8s_pod_name": "p-1", "key__meta": "m"}): (3.0, millis),
    }


def write_fleet(runtime: Runtime, mint: Minter, now: datetime) -> str:
    """Project ``vision`` with the fleet, project ``other`` with a copy; a ``vision`` token."""
    writer = SampleWriter(runtime.engine)
    for name in ("vision", "other"):
        project_id = mint.project(name)
        result = writer.write(project_id, fleet(now))
        assert not result.rejected, result.rejected
    return mint.token("vision", "agent")


_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+) (\d+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], tuple[float, int]]:
    """Samples of a text exposition, as Prometheus' parser reads them (names as written)."""
    found = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = _SAMPLE.fullmatch(line)
        assert match is not None, line
        name, body, value, millis = match.groups()
        labels = {
            key: re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m.group(0)], raw)
            for key, raw in _LABEL.findall(body or "")
        }
        key = (name, frozenset(labels.items()))
        assert key not in found, f"duplicate series {key}"
        found[key] = (float(value), int(millis))
    return found


def test_view_shows_the_latest_value_of_each_fresh_series(
    client: TestClient, runtime: Runtime, mint: Minter
) -> None:
    now = utcnow().replace(microsecond=0)
    token = write_fleet(runtime, mint, now)
    response = client.get("/api/v1/projects/vision/metrics", headers=bearer(token))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert parse(response.text) == expected_samples(now)
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in response.text
    assert "# TYPE DCGM_FI_DEV_GPU_UTIL gauge" in response.text

    narrowed = client.get(
        "/api/v1/projects/vision/metrics",
        params={"metric": "DCGM_FI_DEV_GPU_UTIL", "match": 'gpu="1"', "max_age": "1m"},
        headers=bearer(token),
    )
    assert list(parse(narrowed.text).values()) == [(3.5, int((now.timestamp() - 30) * 1000))]
    stale = client.get(
        "/api/v1/projects/vision/metrics", params={"max_age": "2h"}, headers=bearer(token)
    )
    assert ("stale_metric", frozenset()) in parse(stale.text)


def test_view_is_project_scoped_and_checks_its_parameters(client: TestClient, mint: Minter) -> None:
    mint.project("vision")
    mint.project("other")
    token = bearer(mint.token("vision"))
    assert client.get("/api/v1/projects/other/metrics", headers=token).status_code == 404
    assert client.get("/api/v1/projects/vision/metrics").status_code == 401
    empty = client.get("/api/v1/projects/vision/metrics", headers=token)
    assert empty.status_code == 200 and empty.text == ""
    for params in ({"max_age": "soon"}, {"match": "gpu=0"}, {"match": 'gpu=~"("'}):
        response = client.get("/api/v1/projects/vision/metrics", params=params, headers=token)
        assert response.status_code == 422, params


# --------------------------------------------------------------------------- real Prometheus


def prom_query(url: str, promql: str) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(f"{url}/api/v1/query?{params}", timeout=5) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def scraped_series(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], tuple[float, int]]:
    """Every series Prometheus got from the view (not its own scrape_* and up series)."""
    found = {}
    # A range selector returns the samples with their own timestamps.
    for item in prom_query(url, '{job=~".+", __name__!~"up|scrape_.+"}[5m]'):
        labels = dict(item["metric"])
        name = labels.pop("__name__")
        timestamp, value = item["values"][-1]
        found[(name, frozenset(labels.items()))] = (float(value), round(timestamp * 1000))
    return found


def prometheus_dashboard_answers(
    url: str, target: str, now: datetime
) -> dict[str, list[tuple[str, str, float]]]:
    """Every query of the Prometheus Fleet dashboard, expanded as Grafana's Prometheus data
    source expands it, run by Prometheus: (Hostname, gpu, value) per panel."""
    board = json.loads((ROOT / "dashboards/fleet-prometheus.json").read_text())
    variables = {
        "job": Variable([SCRAPE_JOB], multi=True, include_all=True),
        "instance": Variable([target, "no.such:1"], multi=True, include_all=True),
        "Hostname": Variable(["gpu-node-1", "no.such|host"], multi=True, include_all=True),
        "gpu": Variable(["0", "1"], multi=True, include_all=True),
    }
    grafana = GrafanaQuery(now - timedelta(hours=1), now, variables, max_data_points=200)
    answers: dict[str, list[tuple[str, str, float]]] = {}
    for panel in board["panels"]:
        for target in panel["targets"]:
            expr = grafana.expand_promql(target["expr"])
            assert "$" not in expr, expr
            answers.setdefault(panel["title"], []).extend(
                (
                    item["metric"].get("Hostname", ""),
                    item["metric"].get("gpu", ""),
                    float(item["value"][1]),
                )
                for item in prom_query(url, expr)
            )
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":  # label_values(...): Grafana asks the series API
            text = grafana.expand_promql(variable["query"]["query"])
            assert text.startswith("label_values(")
    return answers


def with_target_labels(
    labels: frozenset[tuple[str, str]], target: str
) -> frozenset[tuple[str, str]]:
    """``honor_labels``: a series' own job and instance win; the target's fill the gaps."""
    names = {name for name, _ in labels}
    added = {("job", SCRAPE_JOB)} if "job" not in names else set()
    if "instance" not in names:
        added.add(("instance", target))
    return labels | added


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_real_prometheus_scrapes_what_the_store_holds(
    runtime: Runtime, mint: Minter, tmp_path: Path
) -> None:
    now = utcnow().replace(microsecond=0)
    token = write_fleet(runtime, mint, now)
    (tmp_path / "token").write_text(token)
    pipeline = Pipeline(StoreSink(SampleWriter(runtime.engine)))
    with api_server(runtime, pipeline) as (api_url, _, _):
        target = api_url.removeprefix("http://")
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {
                    "job_name": SCRAPE_JOB,
                    "honor_labels": True,
                    "metrics_path": "/api/v1/projects/vision/metrics",
                    "authorization": {"credentials_file": str(tmp_path / "token")},
                    "static_configs": [{"targets": [target]}],
                }
            ],
        }
        with running_prometheus(config, tmp_path) as prometheus_url:
            deadline = time.monotonic() + 30
            while not prom_query(prometheus_url, f'up{{job="{SCRAPE_JOB}"}} == 1'):
                assert time.monotonic() < deadline, "prometheus never scraped the view"
                time.sleep(0.2)
            (up,) = prom_query(prometheus_url, f'scrape_samples_scraped{{job="{SCRAPE_JOB}"}}')
            scraped = scraped_series(prometheus_url)
            panels = prometheus_dashboard_answers(prometheus_url, target, now)

    expected = {
        (name, with_target_labels(labels, target)): value
        for (name, labels), value in expected_samples(now).items()
    }
    assert float(up["value"][1]) == len(expected)
    assert scraped == expected
    # The Prometheus flavour of the Fleet dashboard reads the scraped dcgm-exporter names.
    assert sorted(panels["GPU utilization"]) == [
        ("gpu-node-1", "0", 87.0),
        ("gpu-node-1", "1", 3.5),
    ]
    # ... and the same values the store answers through its own query layer.
    with session_scope(runtime.sessions) as session:
        vision = get_project_by_name(session, "vision")
        assert vision is not None
        stored = query.latest(
            session.connection(), vision.id, None, since=now - timedelta(minutes=5)
        )
    assert sorted(
        (s.series.metric, s.value) for s in stored if "." not in s.series.metric
    ) == sorted(
        (name, value) for (name, _), (value, _) in scraped.items() if name != "gpu_memory_used"
    )
