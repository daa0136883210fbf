"""A tuneloop rule pack written as Prometheus alerting rules, so one source serves both.

``alerts/pack/gpu-fleet.yaml`` is the source; ``alerts/prometheus/gpu-fleet.rules.yml`` is this
module's output, committed, and a test fails when the two differ. Regenerate it with::

    python -m alerts.prometheus_export alerts/pack/gpu-fleet.yaml \\
        > alerts/prometheus/gpu-fleet.rules.yml

Each rule kind becomes the PromQL that computes what tuneloop's evaluator computes:

- ``threshold``: ``<agg>_over_time(m{match}[window]) op threshold``, with ``by`` inside
  ``<combine> by (...) (...)``; ``histogram_quantile`` reads ``m_bucket`` through ``rate`` and,
  with ``by``, ``sum by (<by>, le)`` first;
- ``rate``: ``rate(m{match}[window])``, combined per ``by`` group (``sum`` by default);
- ``absent``: with ``by``, the groups seen within ``lookback`` ``unless`` those seen within
  ``window``; without, ``absent_over_time``;
- ``regression``: the window's aggregate divided by the same aggregate over ``baseline``
  ``offset window``;
- ``unless``: ``... unless on (<matching>) <agg>_over_time(other[window]) [op threshold]``.

Labels are ``severity`` and the rule's own; annotations are copied as written (tuneloop's
templates are the subset of Prometheus' that renders the same in both), ``runbook_url`` built
from ``--runbook-base-url`` or the pack's ``runbook_base_url`` (alerts.runbooks).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from alerts.rules import (
    RuleDefinition,
    RuleError,
    RuleFile,
    RuleKind,
    UnlessSpec,
    parse_rule_file,
)

_OVER_TIME = {
    "last": "last_over_time",
    "avg": "avg_over_time",
    "min": "min_over_time",
    "max": "max_over_time",
    "sum": "sum_over_time",
    "count": "count_over_time",
}


def header(source: str) -> str:
    return (
        f"# Generated from {source}, tuneloop's rule pack, by\n"
        f"#   python -m alerts.prometheus_export {source}\n"
        "# Edit the source and regenerate: tests/alerts/test_pack.py fails when this file differs\n"
        "# from what the source generates, and runs promtool's unit tests (*.test.yml) on it.\n"
        "# Alertmanager should carry the pack's inhibit rule (alertmanager-inhibit.yml; a\n"
        "# complete configuration with it: alertmanager.yml).\n"
    )


def export(pack: RuleFile, *, source: str, group: str) -> str:
    """The Prometheus rule file of ``pack``, as text."""
    rules = [_rule(rule) for rule in pack.rules if rule.enabled]
    document = {"groups": [{"name": group, "rules": rules}]}
    body = yaml.safe_dump(document, sort_keys=False, width=10_000, allow_unicode=True)
    return header(source) + body


def _rule(rule: RuleDefinition) -> dict[str, Any]:
    out: dict[str, Any] = {"alert": rule.name, "expr": promql(rule)}
    if rule.for_s:
        out["for"] = rule.for_
    out["labels"] = {"severity": rule.severity.value, **rule.labels}
    out["annotations"] = dict(rule.annotations)
    return out


def promql(rule: RuleDefinition) -> str:
    """The PromQL expression of ``rule`` (a ``promql`` rule's own)."""
    if rule.expr is not None:
        return rule.expr
    query = rule.query
    assert query is not None
    selector = _selector(query.metric, query.match)
    by = query.by
    if rule.kind is RuleKind.ABSENT:
        if not by:
            return f"absent_over_time({selector}[{query.window}])"
        seen = query.lookback if query.lookback_s >= query.window_s else query.window
        grouping = ", ".join(by)
        return (
            f"max by ({grouping}) (max_over_time({selector}[{seen}]))"
            f" unless max by ({grouping}) (max_over_time({selector}[{query.window}]))"
        )
    if rule.kind is RuleKind.RATE:
        value = _grouped(f"rate({selector}[{query.window}])", by, rule.combine)
    elif rule.kind is RuleKind.REGRESSION:
        recent = _over_time(query.aggregation, query.q, f"{selector}[{query.window}]")
        before = _over_time(
            query.aggregation, query.q, f"{selector}[{query.baseline}] offset {query.window}"
        )
        value = f"{_grouped(recent, by, rule.combine)} / {_grouped(before, by, rule.combine)}"
    elif query.aggregation == "histogram_quantile":
        buckets = f"rate({_selector(query.metric + '_bucket', query.match)}[{query.window}])"
        if by:
            buckets = f"sum by ({', '.join([*by, 'le'])}) ({buckets})"
        value = f"histogram_quantile({_number(query.q)}, {buckets})"
    else:
        series = _over_time(query.aggregation, query.q, f"{selector}[{query.window}]")
        value = _grouped(series, by, rule.combine)
    assert rule.op is not None and rule.threshold is not None
    expr = f"{value} {rule.op} {_number(rule.threshold)}"
    if query.unless is not None:
        expr += " " + _unless(query.unless, query.window)
    return expr


def _unless(unless: UnlessSpec, window: str) -> str:
    other = _over_time(
        unless.aggregation, None, f"{_selector(unless.metric, unless.match)}[{window}]"
    )
    if unless.op is not None and unless.threshold is not None:
        other += f" {unless.op} {_number(unless.threshold)}"
    return f"unless on ({', '.join(unless.matching)}) {other}"


def _selector(metric: str, match: Sequence[str]) -> str:
    return f"{metric}{{{', '.join(match)}}}" if match else metric


def _over_time(aggregation: str, q: float | None, matrix: str) -> str:
    if aggregation == "quantile":
        return f"quantile_over_time({_number(q)}, {matrix})"
    return f"{_OVER_TIME[aggregation]}({matrix})"


def _grouped(expr: str, by: Sequence[str] | None, combine: str) -> str:
    return f"{combine} by ({', '.join(by)}) ({expr})" if by else expr


def _number(value: float | None) -> str:
    assert value is not None
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m alerts.prometheus_export",
        description="Write a tuneloop rule pack as a Prometheus rule file on stdout.",
    )
    parser.add_argument("pack", type=Path, help="the tuneloop rule pack (YAML)")
    parser.add_argument("--group", help="rule group name (default: tuneloop-<pack name>)")
    parser.add_argument(
        "--runbook-base-url",
        help="where docs/runbooks.md is published: each rule's runbook_url becomes "
        "<URL>#<rule name in lower case> (default: the pack's runbook_base_url)",
    )
    args = parser.parse_args(argv)
    path: Path = args.pack
    try:
        pack = parse_rule_file(
            path.read_text(), source=str(path), runbook_base_url=args.runbook_base_url
        )
    except RuleError as exc:
        parser.error(str(exc))
    group = args.group or f"tuneloop-{path.stem}"
    sys.stdout.write(export(pack, source=path.as_posix(), group=group))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
