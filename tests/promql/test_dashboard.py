"""The Prometheus Fleet dashboard (dashboards/fleet-prometheus.json) with tuneloop as its
data source: every panel query, expanded as Grafana's Prometheus data source expands it, gets
from tuneloop's /api/v1/query_range what a real Prometheus answers over the same samples
(series shaped after the recorded dcgm-exporter and node-exporter scrapes,
tests/promql/data.py); and the variables' label_values() look-ups list the same values."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dashboards.grafana_sql import GrafanaQuery, Variable
from tests.peers import prom_api
from tests.promql.conftest import Tuneloop
from tests.promql.data import MIG_HOST, T0_S
from tests.promql.test_compare import _compare, _ours

BOARD = json.loads(
    (Path(__file__).resolve().parents[2] / "dashboards/fleet-prometheus.json").read_text()
)
TARGETS = [
    (panel["title"], target["expr"]) for panel in BOARD["panels"] for target in panel["targets"]
]
JOBS = Variable(["dcgm-exporter", "node-exporter"], multi=True, include_all=True)
SELECTIONS = {
    "one host, two GPUs": {
        "job": JOBS,
        "instance": Variable(["gpu-node-17:9400", "gpu-node-17:9100"], multi=True),
        "Hostname": Variable(["gpu-node-17"], multi=True, include_all=True),
        "gpu": Variable(["0", "3"], multi=True, include_all=True),
    },
    "every host and GPU": {
        "job": JOBS,
        "instance": Variable(
            [f"gpu-node-{n}:{port}" for n in (17, 18) for port in (9400, 9100)]
            + [f"{MIG_HOST}:9400"],
            multi=True,
        ),
        "Hostname": Variable(
            ["gpu-node-17", "gpu-node-18", MIG_HOST], multi=True, include_all=True
        ),
        "gpu": Variable([str(gpu) for gpu in range(8)], multi=True, include_all=True),
    },
}
START = datetime.fromtimestamp(T0_S + 600, tz=UTC)
END = datetime.fromtimestamp(T0_S + 3300, tz=UTC)


@pytest.mark.parametrize("selection", SELECTIONS)
@pytest.mark.parametrize(("title", "expr"), TARGETS, ids=[title for title, _ in TARGETS])
def test_each_panel_answers_as_prometheus_does(
    title: str, expr: str, selection: str, tuneloop_api: Tuneloop, prometheus_url: str
) -> None:
    grafana = GrafanaQuery(START, END, SELECTIONS[selection], max_data_points=200)
    query = grafana.expand_promql(expr)
    assert "$" not in query, query
    params = {
        "query": query,
        "start": str(T0_S + 600),
        "end": str(T0_S + 3300),
        "step": str(grafana.interval // 1000),
    }
    theirs = prom_api(prometheus_url, "/api/v1/query_range", params)
    if selection == "every host and GPU":
        assert theirs["result"], f"{title}: Prometheus has nothing for {query}"
    _compare(_ours(tuneloop_api, "/api/v1/query_range", params), theirs, False, query)


@pytest.mark.parametrize("selection", SELECTIONS)
@pytest.mark.parametrize(("title", "expr"), TARGETS, ids=[title for title, _ in TARGETS])
def test_each_panel_answers_as_prometheus_does_with_series_in_a_tsdb(
    title: str, expr: str, selection: str, tsdb_api: Tuneloop, prometheus_url: str
) -> None:
    test_each_panel_answers_as_prometheus_does(title, expr, selection, tsdb_api, prometheus_url)


def _label_values(answer: Any, label: str) -> list[str]:
    return sorted({series[label] for series in answer if label in series})


def test_the_variables_list_what_prometheus_lists(
    tuneloop_api: Tuneloop, prometheus_url: str
) -> None:
    # label_values(metric{...}, label): Grafana asks for the series and reads the label off.
    span = {"start": str(T0_S), "end": str(T0_S + 3600)}
    for selector, label in (
        ('{__name__=~"DCGM_FI_DEV_FB_USED|node_network_receive_bytes_total"}', "job"),
        ('{__name__=~"DCGM_FI_DEV_FB_USED|node_network_receive_bytes_total"}', "instance"),
        ('DCGM_FI_DEV_FB_USED{job=~"dcgm-exporter"}', "Hostname"),
        ('DCGM_FI_DEV_FB_USED{Hostname=~"gpu-node-18"}', "gpu"),
    ):
        params = {"match[]": selector, **span}
        theirs = prom_api(prometheus_url, "/api/v1/series", params)
        ours = _ours(tuneloop_api, "/api/v1/series", params)
        assert _label_values(ours, label) == _label_values(theirs, label)
        values = _ours(tuneloop_api, f"/api/v1/label/{label}/values", params)
        assert values == prom_api(prometheus_url, f"/api/v1/label/{label}/values", params)


def test_the_variables_list_what_prometheus_lists_with_series_in_a_tsdb(
    tsdb_api: Tuneloop, prometheus_url: str
) -> None:
    test_the_variables_list_what_prometheus_lists(tsdb_api, prometheus_url)
