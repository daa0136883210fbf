"""Alert rules written in PromQL (kind ``promql``): checked when created with the engine's own
message, evaluated by the engine over the store (SQLite and PostgreSQL; a TSDB in
tests/timeseries_contract/test_alert_rules.py), each series of the result an alert."""

from __future__ import annotations

import re
from typing import Any

import pytest

from alerts.prometheus_export import promql
from alerts.rules import RuleError, parse_rule, parse_rule_file
from tests.alerts.conftest import Alerting

TEMP = "DCGM_FI_DEV_GPU_TEMP"
HOT: dict[str, Any] = {
    "name": "GpuHot",
    "kind": "promql",
    "expr": f"max by (gpu, hostname) (max_over_time({TEMP}[1m])) > 85",
    "for": "1m",
    "labels": {"team": "infra"},
    "annotations": {"summary": "GPU {{ $labels.gpu }} on {{ $labels.hostname }} at {{ $value }}C"},
}


def test_a_promql_rule_goes_pending_firing_resolved(alerting: Alerting) -> None:
    alerting.rule(**HOT)
    alerting.receiver()
    gpu0, gpu1 = {"gpu": "0", "hostname": "n1"}, {"gpu": "1", "hostname": "n1"}
    alerting.write(TEMP, gpu0, [(0, 90.0), (30, 91.0), (60, 92.0), (90, 50.0), (120, 50.0)])
    alerting.write(TEMP, gpu1, [(0, 60.0), (30, 60.0), (60, 60.0), (90, 60.0), (120, 60.0)])
    alerting.evaluate(0)
    assert alerting.states() == {"GpuHot/gpu=0/hostname=n1/team=infra": "pending"}
    alerting.evaluate(60)
    assert alerting.states() == {"GpuHot/gpu=0/hostname=n1/team=infra": "firing"}
    fired = alerting.instance("GpuHot/gpu=0/hostname=n1/team=infra")
    assert fired.annotations == {"summary": "GPU 0 on n1 at 92C"}
    assert fired.labels["severity"] == "warning"
    # The window of max_over_time still holds 92 at 110 s; past it, nothing is over 85.
    alerting.evaluate(110)
    assert alerting.states() == {"GpuHot/gpu=0/hostname=n1/team=infra": "firing"}
    alerting.evaluate(160)
    assert alerting.states() == {"GpuHot/gpu=0/hostname=n1/team=infra": "resolved"}
    alerting.evaluate(170)
    assert [event for _, event, _ in alerting.notifications()] == ["firing", "resolved"]


def test_a_scalar_expression_is_one_alert_without_labels(alerting: Alerting) -> None:
    alerting.rule(name="TooFew", kind="promql", expr=f"count({TEMP}) < 2")
    alerting.write(TEMP, {"gpu": "0"}, [(0, 50.0)])
    alerting.evaluate(10)
    assert alerting.states() == {"TooFew": "firing"}


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        (f"max({TEMP}", "parse error"),
        (f"predict_linear({TEMP}[5m], 60)", "predict_linear() is not supported"),
        (f"{TEMP}[5m]", "must give an instant vector or a scalar"),
        ("", "no expression found"),
    ],
)
def test_a_bad_expression_is_refused_with_the_engines_message(expr: str, message: str) -> None:
    with pytest.raises(RuleError, match=f"rule Bad: expr: .*{re.escape(message)}"):
        parse_rule({"name": "Bad", "kind": "promql", "expr": expr})


def test_a_promql_rule_takes_no_query_or_comparison() -> None:
    for extra in (
        {"query": {"metric": TEMP}},
        {"op": ">", "threshold": 1},
    ):
        with pytest.raises(RuleError, match="promql rule"):
            parse_rule({**HOT, **extra})
    with pytest.raises(RuleError, match="needs expr"):
        parse_rule({"name": "Empty", "kind": "promql"})
    with pytest.raises(RuleError, match="takes no expr"):
        parse_rule({"name": "T", "kind": "threshold", "op": ">", "threshold": 1,
                    "query": {"metric": TEMP}, "expr": TEMP})  # fmt: skip


def test_rule_files_and_the_prometheus_export_keep_the_expression() -> None:
    text = f"rules:\n  - name: GpuHot\n    kind: promql\n    expr: '{HOT['expr']}'\n"
    (rule,) = parse_rule_file(text).rules
    assert promql(rule) == HOT["expr"]
