"""Rule definitions and templates: parsing and validation, no store."""

from __future__ import annotations

import math

import pytest

from alerts.rules import MetricInfo, RuleError, RuleKind, check_metrics, parse_rule, parse_rule_file
from alerts.templates import TemplateError, check_template, humanize, render
from tuneloop.storage.timeseries.types import SeriesKind

HOT = {
    "name": "GpuHot",
    "kind": "threshold",
    "query": {"metric": "DCGM_FI_DEV_GPU_TEMP", "match": ['gpu!=""'], "aggregation": "max"},
    "op": ">",
    "threshold": 85,
    "for": "5m",
    "severity": "critical",
    "labels": {"team": "infra"},
    "annotations": {"summary": "GPU {{ $labels.gpu }} at {{ $value }}C"},
}


def test_a_valid_rule_parses_with_its_durations() -> None:
    rule = parse_rule(HOT)
    assert rule.kind is RuleKind.THRESHOLD
    assert rule.for_s == 300 and rule.query.window_s == 300
    assert rule.compare(86) and not rule.compare(85)
    assert rule.combine == "max"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"query": {"metric": "x", "match": ["gpu=="]}}, "quoted string"),
        ({"query": {"metric": "x", "match": ['gpu=~"("']}}, "invalid regular expression"),
        ({"query": {"metric": "bad-name"}}, "invalid metric name"),
        ({"query": {"metric": "x", "window": "5 minutes"}}, "duration"),
        ({"query": {"metric": "x", "aggregation": "median"}}, "aggregation"),
        ({"query": {"metric": "x", "aggregation": "quantile"}}, "needs q"),
        ({"op": None}, "needs op and threshold"),
        ({"for": "-1m"}, "duration"),
        ({"annotations": {"summary": "{{ $labels.gpu "}}, "unclosed action"),
        ({"annotations": {"summary": "{{ $valu }}"}}, "unknown expression"),
        ({"annotations": {"summary": "{{ $value | shout }}"}}, "unknown function"),
        ({"labels": {"alertname": "x"}}, "set from the rule"),
        ({"severity": "page"}, "severity"),
        ({"name": "1bad"}, "invalid rule name"),
    ],
)
def test_an_invalid_rule_is_refused_with_the_reason(change: dict[str, object], reason: str) -> None:
    with pytest.raises(RuleError, match=reason):
        parse_rule({**HOT, **change})


def test_unknown_metric_and_rate_of_a_gauge_are_refused() -> None:
    known = {"DCGM_FI_DEV_GPU_TEMP": SeriesKind.GAUGE}

    def lookup(name: str) -> MetricInfo | None:
        return MetricInfo(name, known[name]) if name in known else None

    check_metrics(parse_rule(HOT), lookup)
    with pytest.raises(RuleError, match="unknown metric 'nope'"):
        check_metrics(parse_rule({**HOT, "query": {"metric": "nope"}}), lookup)
    rate = {**HOT, "kind": "rate", "query": {"metric": "DCGM_FI_DEV_GPU_TEMP"}}
    with pytest.raises(RuleError, match="rate needs a counter"):
        check_metrics(parse_rule(rate), lookup)


def test_absent_rules_take_no_comparison() -> None:
    absent = {"name": "Silent", "kind": "absent", "query": {"metric": "up", "by": ["job"]}}
    assert parse_rule(absent).kind is RuleKind.ABSENT
    with pytest.raises(RuleError, match="no op or threshold"):
        parse_rule({**absent, "op": ">", "threshold": 1})


def test_templates_render_like_prometheus() -> None:
    labels = {"gpu": "3", "hostname": "n1"}
    assert render("GPU {{ $labels.gpu }} on {{$labels.hostname}}", labels, 1.0) == "GPU 3 on n1"
    assert render("{{ $value }}", labels, 91.0) == "91"
    assert render('{{ $value | printf "%.1f" }}', labels, 0.256) == "0.3"
    assert render("{{ $value | humanizePercentage }}", labels, 0.5) == "50%"
    assert render("{{ $value | humanizeDuration }}", labels, 3725.0) == "1h 2m 5s"
    assert render('{{ $labels["gpu"] }} {{ .Labels.missing }}', labels, None) == "3 "
    assert humanize(2_500_000) == "2.5M" and humanize(0.002) == "2m"
    assert render("{{ $value }}", labels, math.nan) == "NaN"
    for broken in ("{{ $value", "x }}", '{{ $value | printf "%d %d" }}'):
        with pytest.raises(TemplateError):
            check_template(broken)


def test_rule_files_report_every_problem_at_once() -> None:
    text = """
rules:
  - {name: A, kind: threshold, query: {metric: x}, op: ">", threshold: 1}
  - {name: B, kind: threshold, query: {metric: x}}
  - {name: A, kind: absent, query: {metric: x}}
inhibit_rules:
  - {source: ['alertname="NodeDown"'], target: ['gpu=~".+"'], equal: [hostname]}
  - {source: [], target: ['gpu=~".+"']}
"""
    with pytest.raises(RuleError) as raised:
        parse_rule_file(text, source="pack.yaml")
    message = str(raised.value)
    assert message.startswith("pack.yaml: ")
    assert "rule B: " in message and "needs op and threshold" in message
    assert "rule A: defined more than once" in message
    assert "inhibit rule: source and target" in message


@pytest.mark.parametrize(
    ("unless", "message"),
    [
        ({"metric": "DCGM_EXP_XID_ERRORS_COUNT"}, "matching"),
        ({"metric": "x", "matching": []}, "unless needs matching"),
        ({"metric": "x", "matching": ["gpu"], "op": ">"}, "op and threshold together"),
        ({"metric": "x", "matching": ["1gpu"]}, "invalid label name"),
        ({"metric": "x", "matching": ["gpu"], "aggregation": "quantile"}, "aggregation"),
    ],
)
def test_unless_is_checked(unless: dict[str, object], message: str) -> None:
    rule = {
        "name": "R",
        "kind": "threshold",
        "query": {"metric": "DCGM_FI_DEV_XID_ERRORS", "unless": unless},
        "op": ">",
        "threshold": 0,
    }
    with pytest.raises(RuleError, match=message):
        parse_rule(rule)


def test_an_absent_rule_takes_no_unless() -> None:
    rule = {
        "name": "R",
        "kind": "absent",
        "query": {"metric": "m", "unless": {"metric": "x", "matching": ["gpu"]}},
    }
    with pytest.raises(RuleError, match="takes no unless"):
        parse_rule(rule)
