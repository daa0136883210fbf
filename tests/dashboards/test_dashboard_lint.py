"""The rules grafana/dashboard-linter applies, over every generated dashboard: a templated
data source used by every panel, job and instance variables used by every PromQL query, a
title, description and known unit on every panel, ``$__rate_interval`` in rates and counters
only ever read through ``rate``/``irate``/``increase``; and every dashboard loads into the
Grafana SDK's models unchanged."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import promql_parser
import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model

from collector.sources.dcgm_fields import load_counters
from dashboards import generate

ROOT = Path(__file__).resolve().parents[2]
BOARDS = {path.stem: json.loads(path.read_text()) for path in (ROOT / "dashboards").glob("*.json")}
Board = dict[str, Any]

# Grafana's unit ids (packages/grafana-data valueFormats) a panel of this project may use.
UNITS = {
    "none", "short", "percent", "percentunit", "bytes", "decbytes", "mbytes", "decmbytes",
    "Bps", "binBps", "watt", "kwatt", "kwatth", "joule", "celsius", "hertz", "s", "ms",
    "ops", "reqps", "bool",
}  # fmt: skip
RATE_INTERVAL = timedelta(seconds=4242)
"""What ``$__rate_interval`` stands for while a query is parsed: a range nobody writes."""
COUNTERS = {f.name for f in load_counters() if f.prom_type.value == "counter"}
CUMULATIVE_TOTALS = {"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"}
"""Counters shown as they are: the rows remapped so far is the figure to watch, not a rate."""


def datasource_variables(board: Board) -> list[dict[str, Any]]:
    return [v for v in board["templating"]["list"] if v["type"] == "datasource"]


def is_prometheus(board: Board) -> bool:
    return any(v["query"] == "prometheus" for v in datasource_variables(board))


def variable(board: Board, name: str) -> dict[str, Any] | None:
    return next((v for v in board["templating"]["list"] if v["name"] == name), None)


def substitute(board: Board, expr: str) -> str:
    """``expr`` with every variable replaced by a value, as the linter parses it."""
    expr = expr.replace("$__rate_interval", f"{int(RATE_INTERVAL.total_seconds())}s")
    expr = re.sub(r"\$__\w+", "5m", expr)
    names = sorted((v["name"] for v in board["templating"]["list"]), key=len, reverse=True)
    for name in names:
        expr = expr.replace(f"${{{name}}}", "value").replace(f"${name}", "value")
    return expr


def walk(node: Any, parents: tuple[Any, ...] = ()) -> Iterator[tuple[Any, tuple[Any, ...]]]:
    """Every node of a parsed PromQL expression with its ancestors, nearest last."""
    yield node, parents
    below = (*parents, node)
    children: list[Any] = []
    if isinstance(node, promql_parser.BinaryExpr):
        children = [node.lhs, node.rhs]
    elif isinstance(node, promql_parser.AggregateExpr):
        children = [node.expr] + ([node.param] if node.param is not None else [])
    elif isinstance(node, promql_parser.Call):
        children = list(node.args)
    elif isinstance(node, promql_parser.MatrixSelector):
        children = [node.vector_selector]
    elif isinstance(
        node, (promql_parser.ParenExpr, promql_parser.UnaryExpr, promql_parser.SubqueryExpr)
    ):
        children = [node.expr]
    for child in children:
        yield from walk(child, below)


def targets(board: Board) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in board["panels"]:
        for target in panel["targets"]:
            yield panel, target


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_template_datasource_rule(name: str) -> None:
    (source,) = datasource_variables(BOARDS[name])
    assert source["name"] == "datasource" and source["label"] == "Data source"
    (wanted,) = BOARDS[name]["__inputs"]
    assert wanted["type"] == "datasource" and wanted["pluginId"] == source["query"]
    assert source["current"]["value"] == f"${{{wanted['name']}}}"


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_panel_datasource_rule(name: str) -> None:
    text = json.dumps(BOARDS[name])
    assert "tuneloop-postgres" not in text and "tuneloop-prometheus" not in text
    for panel, target in targets(BOARDS[name]):
        assert panel["datasource"]["uid"] in ("$datasource", "${datasource}"), panel["title"]
        assert target["datasource"]["uid"] in ("$datasource", "${datasource}"), panel["title"]
    for item in BOARDS[name]["templating"]["list"]:
        if item["type"] == "query":
            assert item["datasource"]["uid"] == "${datasource}", item["name"]


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_panel_title_description_and_units_rules(name: str) -> None:
    for panel in BOARDS[name]["panels"]:
        assert panel["title"].strip() and panel["description"].strip(), panel["title"]
        assert panel["fieldConfig"]["defaults"]["unit"] in UNITS, panel["title"]


def test_framebuffer_panels_are_in_mebibytes() -> None:
    for name, board in BOARDS.items():
        for panel, target in targets(board):
            if "DCGM_FI_DEV_FB_" in target.get("expr", target.get("rawSql", "")):
                assert panel["fieldConfig"]["defaults"]["unit"] == "mbytes", (name, panel["title"])


PROMETHEUS_BOARDS = sorted(name for name, board in BOARDS.items() if is_prometheus(board))


def test_the_prometheus_board_is_linted() -> None:
    assert PROMETHEUS_BOARDS == ["fleet-prometheus"]


@pytest.mark.parametrize("name", PROMETHEUS_BOARDS)
@pytest.mark.parametrize("label", ["job", "instance"])
def test_template_job_and_instance_rules(name: str, label: str) -> None:
    found = variable(BOARDS[name], label)
    assert found is not None, f"no {label} variable"
    assert found["type"] == "query" and found["datasource"]["uid"] == "${datasource}"
    assert found["label"] == label.title() and found["multi"] and found["allValue"] == ".+"


@pytest.mark.parametrize("name", PROMETHEUS_BOARDS)
def test_template_label_promql_rule(name: str) -> None:
    board = BOARDS[name]
    for item in board["templating"]["list"]:
        if item["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", item["query"]["query"])
        assert match is not None, item["name"]
        promql_parser.parse(substitute(board, match.group(1)))
        assert match.group(2) == item["name"], item["name"]


@pytest.mark.parametrize("name", PROMETHEUS_BOARDS)
def test_target_rules(name: str) -> None:
    """target-promql, target-job, target-instance, target-rate-interval and
    target-counter-agg: every query parses; every selector matches ``job=~"$job"`` and
    ``instance=~"$instance"``; a range under ``rate``/``irate`` is ``$__rate_interval``; a
    counter (``_total``, or typed counter by dcgm-exporter) is read through a rate."""
    board = BOARDS[name]
    for panel, target in targets(board):
        where = f"{panel['title']}: {target['expr']}"
        selectors = re.findall(r"\{[^}]*\}", target["expr"])
        assert selectors, where
        for selector in selectors:
            assert 'job=~"$job"' in selector and 'instance=~"$instance"' in selector, where
        expr = promql_parser.parse(substitute(board, target["expr"]))
        for node, parents in walk(expr):
            if isinstance(node, promql_parser.MatrixSelector) and parents:
                call = parents[-1]
                if isinstance(call, promql_parser.Call) and call.func.name in ("rate", "irate"):
                    assert node.range == RATE_INTERVAL, where
            if isinstance(node, promql_parser.VectorSelector):
                counter = node.name.endswith("_total") or node.name in COUNTERS
                if not counter or node.name in CUMULATIVE_TOTALS:
                    continue
                assert len(parents) >= 2, where
                assert isinstance(parents[-1], promql_parser.MatrixSelector), where
                assert isinstance(parents[-2], promql_parser.Call), where
                assert parents[-2].func.name in ("rate", "irate", "increase"), where


@pytest.mark.parametrize("name", sorted(set(BOARDS) - set(PROMETHEUS_BOARDS)))
def test_sql_panels_rate_their_counters(name: str) -> None:
    """target-counter-agg on the PostgreSQL boards: a counter read from ``tuneloop_series`` is
    shown as a per-second rate between consecutive buckets (``counter_rate_sql``)."""
    for panel, target in targets(BOARDS[name]):
        for metric in re.findall(r"tuneloop_series\([^,]+, '(\w+)'", target["rawSql"]):
            counter = metric.endswith("_total") or metric in COUNTERS
            if counter and metric not in CUMULATIVE_TOTALS:
                assert "lag(total) OVER w" in target["rawSql"], (panel["title"], metric)


def test_the_rules_catch_what_they_are_for() -> None:
    """The rules above fail on the mistakes they exist for."""
    board = BOARDS["fleet-prometheus"]
    raw = promql_parser.parse(substitute(board, 'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{job=~"$job"}'))
    ((node, parents),) = [
        (n, p) for n, p in walk(raw) if isinstance(n, promql_parser.VectorSelector)
    ]
    assert node.name in COUNTERS and not parents
    fixed = promql_parser.parse(substitute(board, "rate(x_total[5m])"))
    (matrix,) = [n for n, _ in walk(fixed) if isinstance(n, promql_parser.MatrixSelector)]
    assert matrix.range != RATE_INTERVAL


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_dashboards_load_into_the_sdk_models_unchanged(name: str) -> None:
    board = BOARDS[name]
    exported = copy.deepcopy({k: v for k, v in board.items() if not k.startswith("__")})
    loaded = json.loads(json.dumps(model.Dashboard.from_json(exported), cls=JSONEncoder))
    # The SDK's annotation target models only Grafana's built-in query, not an SQL one.
    for item in exported["annotations"]["list"]:
        assert "rawSql" in item.pop("target")
    for item in loaded["annotations"]["list"]:
        item.pop("target")
    assert loaded == exported
    assert board == generate.BOARDS[name]().to_json()
