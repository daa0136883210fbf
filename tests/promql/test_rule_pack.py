"""The shipped Prometheus rule pack (alerts/prometheus/gpu-fleet.rules.yml, generated from
tuneloop's own pack) runs unchanged on tuneloop's PromQL API: every rule's expression, and
the same expression without its threshold (so the values themselves are compared, not only
which series pass), answers over the recorded-shape data (tests/promql/data.py, with the
incidents of tests/promql/incidents.py) what a real Prometheus answers over the same samples.
Every rule has a value in the compared window (no rule passes on nothing against nothing), and
most fire."""

from __future__ import annotations

from pathlib import Path

import promql_parser
import pytest
import yaml

from tests.peers import prom_api
from tests.promql.conftest import Tuneloop
from tests.promql.data import T0_S
from tests.promql.test_compare import _compare, _ours

PACK = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "alerts/prometheus/gpu-fleet.rules.yml").read_text()
)
RULES = [(rule["alert"], rule["expr"]) for group in PACK["groups"] for rule in group["rules"]]


COMPARISONS = {"<", ">", "<=", ">=", "==", "!="}
SET_OPERATORS = {"and", "unless"}
WINDOW = {"start": str(T0_S + 900), "end": str(T0_S + 3300), "step": "60"}


def _without_threshold(expr: str) -> str:
    """The rule's value: the left side of its top-level comparison; for a rule that filters
    its left side with ``unless`` or ``and``, that side's value, filtered alike."""
    value = _value(promql_parser.parse(expr))
    return expr if value is None else value


def _value(node: promql_parser.Expr) -> str | None:
    if not isinstance(node, promql_parser.BinaryExpr):
        return None
    op = str(node.op)
    if op in COMPARISONS and not (node.modifier and node.modifier.return_bool):
        return str(node.lhs.prettify())
    if op in SET_OPERATORS and (left := _value(node.lhs)) is not None:
        matching = f" {node.modifier}" if str(node.modifier or "") else ""
        return f"({left}) {op}{matching} ({node.rhs.prettify()})"
    return None


def test_the_pack_has_rules() -> None:
    assert len(RULES) >= 10


def test_a_rule_filtered_by_unless_keeps_its_filter_without_its_threshold() -> None:
    expr = next(expr for alert, expr in RULES if alert == "GpuFramebufferFullWhileIdle")
    value = _without_threshold(expr)
    assert "1024" not in value and "> 10" in value and "unless on (Hostname, gpu)" in value
    assert _without_threshold("a > bool 1") == "a > bool 1"
    assert _without_threshold("up unless down") == "up unless down"


@pytest.mark.parametrize(("alert", "expr"), RULES, ids=[alert for alert, _ in RULES])
def test_each_rule_answers_as_prometheus_does(
    alert: str, expr: str, tuneloop_api: Tuneloop, prometheus_url: str
) -> None:
    for query in dict.fromkeys((expr, _without_threshold(expr))):
        params = {"query": query, **WINDOW}
        theirs = prom_api(prometheus_url, "/api/v1/query_range", params)
        _compare(_ours(tuneloop_api, "/api/v1/query_range", params), theirs, False, query)
    # The value is there, so the comparison above is not of nothing with nothing.
    assert theirs["result"], f"{alert}: Prometheus has no value for {query}"


def _gpu(gpu: str, **labels: str) -> dict[str, str]:
    return {"Hostname": "gpu-node-21", "gpu": gpu, **labels}


# Who each rule fires for: the incidents tests/promql/incidents.py is shaped after.
INCIDENTS = {
    "GpuIdleWhileJobRuns": _gpu("2"),
    "GpuMigSliceIdleWhileJobRuns": _gpu("3", GPU_I_ID="1"),
    "GpuXidErrors": _gpu("1", xid="48"),
    "GpuXidError": _gpu("1", err_code="48"),
    "GpuHealthNotPassing": _gpu("1", health_watch="MEM"),
    "GpuTemperatureHigh": _gpu("1"),
    "GpuThermalThrottling": _gpu("1"),
    "GpuPowerThrottling": _gpu("0"),
    "GpuEccDoubleBitErrors": _gpu("1"),
    "GpuUncorrectableRowsRemapped": _gpu("1"),
    "GpuFramebufferFullWhileIdle": _gpu("2"),
    "NvlinkCrcErrors": _gpu("0"),
    "NvlinkRecoveryErrors": _gpu("0"),
    "StepTimeRegression": {"job": "llm-sft"},
    "InferenceP99SloBreach": {"job": "inference/vllm"},
    "DataLoaderStall": {"job": "llm-sft"},
    "JobInputBound": {"job": "llm-sft"},
    "JobStraggler": {"job": "llm-pretrain-b", "rank": "1", "gpu": "1"},
    "GpuNodeDown": {"Hostname": "gpu-node-22"},
    "JobSilent": {"job": "llm-sft"},
}


def test_most_rules_fire_each_for_its_incident(tuneloop_api: Tuneloop, prometheus_url: str) -> None:
    firing: dict[str, list[dict[str, str]]] = {}
    for alert, expr in RULES:
        params = {"query": expr, **WINDOW}
        ours = _ours(tuneloop_api, "/api/v1/query_range", params)["result"]
        theirs = prom_api(prometheus_url, "/api/v1/query_range", params)["result"]
        assert bool(ours) == bool(theirs), alert
        if ours:
            firing[alert] = [series["metric"] for series in ours]
    assert len(firing) >= 10, sorted({alert for alert, _ in RULES} - firing.keys())
    for alert, labels in INCIDENTS.items():
        fired = firing.get(alert, [])
        assert any(labels.items() <= metric.items() for metric in fired), (alert, fired)
    assert all(s["job"] != "inference/embedder" for s in firing["InferenceP99SloBreach"])


@pytest.mark.parametrize(("alert", "expr"), RULES, ids=[alert for alert, _ in RULES])
def test_each_rule_answers_as_prometheus_does_with_series_in_a_tsdb(
    alert: str, expr: str, tsdb_api: Tuneloop, prometheus_url: str
) -> None:
    test_each_rule_answers_as_prometheus_does(alert, expr, tsdb_api, prometheus_url)


def test_most_rules_fire_each_for_its_incident_with_series_in_a_tsdb(
    tsdb_api: Tuneloop, prometheus_url: str
) -> None:
    test_most_rules_fire_each_for_its_incident(tsdb_api, prometheus_url)
