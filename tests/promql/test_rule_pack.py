"""The shipped Prometheus rule pack (alerts/prometheus/gpu-fleet.rules.yml, generated from
tuneloop's own pack) runs unchanged on tuneloop's PromQL API: every rule's expression, and
the same expression without its threshold (so the values themselves are compared, not only
which series pass), answers over the recorded-shape data (tests/promql/data.py) what a real
Prometheus answers over the same samples."""

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


def _without_threshold(expr: str) -> str:
    """The left side of the rule's top-level comparison (the rule's value), if it has one."""
    parsed = promql_parser.parse(expr)
    if isinstance(parsed, promql_parser.BinaryExpr) and str(parsed.op) in COMPARISONS:
        return str(parsed.lhs.prettify())
    return expr


def test_the_pack_has_rules() -> None:
    assert len(RULES) >= 10


@pytest.mark.parametrize(("alert", "expr"), RULES, ids=[alert for alert, _ in RULES])
def test_each_rule_answers_as_prometheus_does(
    alert: str, expr: str, tuneloop_api: Tuneloop, prometheus_url: str
) -> None:
    for query in dict.fromkeys((expr, _without_threshold(expr))):
        params = {
            "query": query,
            "start": str(T0_S + 900),
            "end": str(T0_S + 3300),
            "step": "60",
        }
        theirs = prom_api(prometheus_url, "/api/v1/query_range", params)
        _compare(_ours(tuneloop_api, "/api/v1/query_range", params), theirs, False, query)


@pytest.mark.parametrize(("alert", "expr"), RULES, ids=[alert for alert, _ in RULES])
def test_each_rule_answers_as_prometheus_does_with_series_in_a_tsdb(
    alert: str, expr: str, tsdb_api: Tuneloop, prometheus_url: str
) -> None:
    test_each_rule_answers_as_prometheus_does(alert, expr, tsdb_api, prometheus_url)
