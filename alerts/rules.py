"""Alert rule definitions: their shape, parsing and validation (pure: no I/O).

A rule is a query on the store (metric, label matchers, aggregation over a window, optional
grouping by labels), a comparison, a ``for`` duration, labels, annotation templates and a
severity. Four kinds:

``threshold``
    the metric aggregated over ``window`` per series (``last``, ``avg``, ``min``, ``max``,
    ``sum``, ``count``, ``quantile`` with ``q``, or ``histogram_quantile`` over
    ``<metric>_bucket`` with ``q``), compared with ``threshold``;
``rate``
    per-second rate of a counter over ``window``, compared with ``threshold``;
``absent``
    no sample for ``window`` from a series (or, with ``by``, a group of series) that reported
    within ``lookback``; with neither ``by`` nor any series it fires once, like PromQL's
    ``absent()``;
``regression``
    the metric aggregated over the recent ``window`` divided by the same aggregation over the
    ``baseline`` before it, per series or group: a job against its own recent past; compared
    with ``threshold`` (``> 1.2`` is "20% worse than its baseline").

With ``by``, per-series values are combined per group (``combine``: ``max`` by default,
``sum`` for ``rate``, ``avg`` for ``regression``) and the alert carries only the ``by`` labels;
``histogram_quantile`` with ``by`` adds the buckets of each group up first, as PromQL's
``histogram_quantile(q, sum by (job, le) (rate(x_bucket[w])))``.

``promql``
    ``expr``, a PromQL expression (alerts.promql_rule): each series it gives at evaluation
    time is an alert, as in a Prometheus alerting rule; it takes no ``query``, ``op`` or
    ``threshold`` (the condition is in the expression).

``unless`` (PromQL's ``unless on (...)``) drops the alerts whose ``matching`` labels equal
those of a series of another metric in the same window: with ``op`` and ``threshold``, one
whose aggregated value passes the comparison; without, any that reported.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from alerts import runbooks
from alerts.promql_rule import check_expr
from alerts.templates import TemplateError, check_template
from tuneloop.errors import InvalidInput
from tuneloop.storage.timeseries.matchers import parse_matcher
from tuneloop.storage.timeseries.times import parse_duration
from tuneloop.storage.timeseries.types import Matcher, SeriesKind
from tuneloop.strict import refuse_unknown_keys

ALERTNAME = "alertname"
SEVERITY = "severity"
RULE_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}")
LABEL_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")
METRIC_NAME_RE = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]{0,199}")
RESERVED_LABELS = frozenset({ALERTNAME, SEVERITY})


class RuleKind(StrEnum):
    THRESHOLD = "threshold"
    RATE = "rate"
    ABSENT = "absent"
    REGRESSION = "regression"
    PROMQL = "promql"


class Severity(StrEnum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"


Comparison = Literal[">", ">=", "<", "<=", "==", "!="]
TimeAggregation = Literal[
    "last", "avg", "min", "max", "sum", "count", "quantile", "histogram_quantile"
]
Combine = Literal["max", "min", "avg", "sum", "count"]

_COMPARE: dict[str, Callable[[float, float], bool]] = {
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


class RuleError(InvalidInput):
    """A rule that cannot be created; ``str()`` is one line with the reason."""


def duration_s(text: str | float | int, *, allow_zero: bool = False) -> int:
    """Seconds from ``30s``/``5m``/``1h`` or a number; ``0`` only where ``allow_zero``."""
    spelled = str(text).strip()
    if allow_zero and spelled in ("0", "0s", "0m", "0h"):
        return 0
    return parse_duration(spelled)


class UnlessSpec(BaseModel):
    """Another metric that, present (and passing ``op threshold``) in the rule's window on
    the same ``matching`` labels, silences the rule's alert. (Not ``on``: YAML reads that key
    as ``true``.)"""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: str
    matching: list[str]
    match: list[str] = Field(default_factory=list)
    aggregation: Literal["last", "avg", "min", "max"] = "last"
    op: Comparison | None = None
    threshold: float | None = None

    @field_validator("metric")
    @classmethod
    def _metric(cls, value: str) -> str:
        if not METRIC_NAME_RE.fullmatch(value):
            raise ValueError(f"invalid metric name {value!r}")
        return value

    @field_validator("matching")
    @classmethod
    def _matching(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("unless needs matching: the labels to match on")
        for name in value:
            if not LABEL_NAME_RE.fullmatch(name):
                raise ValueError(f"invalid label name {name!r} in matching")
        return value

    @field_validator("match")
    @classmethod
    def _match(cls, value: list[str]) -> list[str]:
        for text in value:
            parse_matcher(text)
        return value

    @model_validator(mode="after")
    def _shape(self) -> UnlessSpec:
        if (self.op is None) != (self.threshold is None):
            raise ValueError("unless takes op and threshold together, or neither")
        return self

    @property
    def matchers(self) -> list[Matcher]:
        return [parse_matcher(text) for text in self.match]

    def passes(self, value: float) -> bool:
        if self.op is None or self.threshold is None:
            return True
        return _COMPARE[self.op](value, self.threshold)


class QuerySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: str
    match: list[str] = Field(default_factory=list, description='PromQL matchers: gpu!=""')
    window: str = "5m"
    aggregation: TimeAggregation = "last"
    q: float | None = None
    by: list[str] | None = None
    combine: Combine | None = None
    baseline: str = "1h"
    """``regression``: how far before the recent window the baseline reaches."""
    lookback: str = "1h"
    """``absent``: a series that reported within this long counts as expected."""
    unless: UnlessSpec | None = None

    @field_validator("metric")
    @classmethod
    def _metric(cls, value: str) -> str:
        if not METRIC_NAME_RE.fullmatch(value):
            raise ValueError(f"invalid metric name {value!r}")
        return value

    @field_validator("match")
    @classmethod
    def _match(cls, value: list[str]) -> list[str]:
        for text in value:
            parse_matcher(text)
        return value

    @field_validator("window", "baseline", "lookback")
    @classmethod
    def _duration(cls, value: str) -> str:
        duration_s(value)
        return str(value)

    @field_validator("by")
    @classmethod
    def _by(cls, value: list[str] | None) -> list[str] | None:
        for name in value or []:
            if not LABEL_NAME_RE.fullmatch(name):
                raise ValueError(f"invalid label name {name!r} in by")
        return value

    @property
    def matchers(self) -> list[Matcher]:
        return [parse_matcher(text) for text in self.match]

    @property
    def window_s(self) -> int:
        return duration_s(self.window)

    @property
    def baseline_s(self) -> int:
        return duration_s(self.baseline)

    @property
    def lookback_s(self) -> int:
        return duration_s(self.lookback)


class RuleDefinition(BaseModel):
    """One rule as written in YAML or sent to the API."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str
    kind: RuleKind
    query: QuerySpec | None = None
    expr: str | None = None
    op: Comparison | None = None
    threshold: float | None = None
    for_: Annotated[str, Field(alias="for")] = "0s"
    severity: Severity = Severity.WARNING
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    enabled: bool = True

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not RULE_NAME_RE.fullmatch(value):
            raise ValueError(
                f"invalid rule name {value!r}: letters, digits and '_', not starting with a digit"
            )
        return value

    @field_validator("expr")
    @classmethod
    def _expr(cls, value: str | None) -> str | None:
        return None if value is None else check_expr(value)

    @field_validator("for_")
    @classmethod
    def _for(cls, value: str) -> str:
        duration_s(value, allow_zero=True)
        return str(value)

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not LABEL_NAME_RE.fullmatch(name):
                raise ValueError(f"invalid label name {name!r}")
            if name in RESERVED_LABELS:
                raise ValueError(f"label {name!r} is set from the rule itself")
            check_template(text)
        return value

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not LABEL_NAME_RE.fullmatch(name):
                raise ValueError(f"invalid annotation name {name!r}")
            try:
                check_template(text)
            except TemplateError as exc:
                raise ValueError(f"annotation {name!r}: {exc}") from None
        return value

    @model_validator(mode="after")
    def _shape(self) -> RuleDefinition:
        if self.kind is RuleKind.PROMQL:
            if self.expr is None or self.query is not None:
                raise ValueError("a promql rule needs expr and takes no query")
            if self.op is not None or self.threshold is not None:
                raise ValueError("a promql rule takes no op or threshold: compare in expr")
            return self
        query = self.query
        if query is None or self.expr is not None:
            raise ValueError(f"a {self.kind.value} rule needs query and takes no expr")
        compares = self.kind is not RuleKind.ABSENT
        if compares and (self.op is None or self.threshold is None):
            raise ValueError(f"a {self.kind.value} rule needs op and threshold")
        if not compares and (self.op is not None or self.threshold is not None):
            raise ValueError("an absent rule takes no op or threshold")
        quantile = query.aggregation in ("quantile", "histogram_quantile")
        if quantile and (query.q is None or not 0.0 <= query.q <= 1.0):
            raise ValueError(f"aggregation {query.aggregation} needs q between 0 and 1")
        if not quantile and query.q is not None:
            raise ValueError(f"q is only meaningful for a quantile, not {query.aggregation}")
        if self.kind in (RuleKind.RATE, RuleKind.ABSENT) and query.aggregation != "last":
            raise ValueError(f"a {self.kind.value} rule takes no aggregation")
        if self.kind is RuleKind.REGRESSION and query.aggregation == "histogram_quantile":
            raise ValueError("a regression rule compares stored samples, not histograms")
        if query.unless is not None and self.kind in (RuleKind.ABSENT, RuleKind.REGRESSION):
            raise ValueError(f"a {self.kind.value} rule takes no unless")
        if query.combine is not None and query.by is None:
            raise ValueError("combine needs by: the labels whose groups it combines")
        return self

    @property
    def for_s(self) -> int:
        return duration_s(self.for_, allow_zero=True)

    def spec(self) -> dict[str, Any]:
        """What the store keeps in ``alert_rules.spec``."""
        if self.query is None:
            return {"expr": self.expr}
        return {
            "query": self.query.model_dump(exclude_defaults=True),
            "op": self.op,
            "threshold": self.threshold,
        }

    def compare(self, value: float) -> bool:
        assert self.op is not None and self.threshold is not None
        return _COMPARE[self.op](value, self.threshold)

    @property
    def combine(self) -> Combine:
        if self.query is not None and self.query.combine is not None:
            return self.query.combine
        if self.kind is RuleKind.RATE:
            return "sum"
        return "avg" if self.kind is RuleKind.REGRESSION else "max"


def from_stored(
    *,
    name: str,
    kind: str,
    spec: Mapping[str, Any],
    for_s: float,
    severity: str,
    labels: Mapping[str, Any],
    annotations: Mapping[str, Any],
    enabled: bool = True,
) -> RuleDefinition:
    """The definition of a stored rule (the inverse of :meth:`RuleDefinition.spec`)."""
    return RuleDefinition.model_validate(
        {
            "name": name,
            "kind": kind,
            "query": spec.get("query"),
            "expr": spec.get("expr"),
            "op": spec.get("op"),
            "threshold": spec.get("threshold"),
            "for": f"{int(for_s)}s",
            "severity": severity,
            "labels": dict(labels),
            "annotations": dict(annotations),
            "enabled": enabled,
        }
    )


# --------------------------------------------------------------------------- metrics


@dataclass(frozen=True, slots=True)
class MetricInfo:
    name: str
    kind: SeriesKind


MetricLookup = Callable[[str], MetricInfo | None]
"""Finds a metric by name (in the store or among what the collectors write)."""


def check_metrics(rule: RuleDefinition, lookup: MetricLookup) -> None:
    """Raise :class:`RuleError` if the rule's metric is unknown or of the wrong kind (a
    PromQL rule's selectors may name series still to come, as in Prometheus)."""
    if rule.query is None:
        return
    metric = rule.query.metric
    read = metric + "_bucket" if rule.query.aggregation == "histogram_quantile" else metric
    info = lookup(read)
    if info is None:
        raise RuleError(
            f"rule {rule.name}: unknown metric {read!r}: no series of that name in this project "
            "and not a metric tuneloop's collectors write"
        )
    if rule.kind is RuleKind.RATE and info.kind is not SeriesKind.COUNTER:
        raise RuleError(f"rule {rule.name}: rate needs a counter, and {read!r} is a gauge")
    unless = rule.query.unless
    if unless is not None and lookup(unless.metric) is None:
        raise RuleError(f"rule {rule.name}: unknown metric {unless.metric!r} in unless")


# --------------------------------------------------------------------------- parsing


def parse_rule(data: Any) -> RuleDefinition:
    """One rule from its JSON/YAML form; :class:`RuleError` with one line if it is invalid."""
    try:
        return RuleDefinition.model_validate(data)
    except ValidationError as exc:
        raise RuleError(_one_line(exc, data)) from None


def _one_line(exc: ValidationError, data: Any) -> str:
    name = data.get("name") if isinstance(data, Mapping) else None
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        problems.append(f"{where}: {message}" if where else message)
    prefix = f"rule {name}: " if isinstance(name, str) else "rule: "
    return prefix + "; ".join(problems)


@dataclass(frozen=True, slots=True)
class InhibitDefinition:
    """Alertmanager's inhibit rule: a firing alert matching ``source`` mutes the alerts
    matching ``target`` that have the same values of the ``equal`` labels."""

    source: tuple[str, ...]
    target: tuple[str, ...]
    equal: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RuleFile:
    rules: list[RuleDefinition]
    inhibit_rules: list[InhibitDefinition]
    runbook_base_url: str = ""
    """Where the pack's runbooks are published (alerts.runbooks); empty: no links added."""


def parse_inhibit(data: Any) -> InhibitDefinition:
    if not isinstance(data, Mapping):
        raise RuleError("an inhibit rule is a mapping with source, target and equal")
    refuse_unknown_keys(data, ("source", "target", "equal"), error=RuleError, where="inhibit rule")
    source, target, equal = (list(data.get(key) or []) for key in ("source", "target", "equal"))
    if not source or not target:
        raise RuleError("inhibit rule: source and target need at least one matcher each")
    try:
        for text in [*source, *target]:
            parse_matcher(str(text))
    except ValueError as exc:
        raise RuleError(f"inhibit rule: {exc}") from None
    for name in equal:
        if not LABEL_NAME_RE.fullmatch(str(name)):
            raise RuleError(f"inhibit rule: invalid label name {name!r} in equal")
    return InhibitDefinition(
        tuple(map(str, source)), tuple(map(str, target)), tuple(map(str, equal))
    )


def parse_rule_file(
    text: str, *, source: str = "<string>", runbook_base_url: str | None = None
) -> RuleFile:
    """A YAML file of ``rules:`` (and optional ``inhibit_rules:`` and ``runbook_base_url:``).
    Every problem is reported at once, one per line, so a file is fixed in one pass. Rules
    without a ``runbook_url`` get one from ``runbook_base_url`` when given (not empty), else
    from the file's own."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RuleError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(data, Mapping) or not isinstance(data.get("rules"), list):
        raise RuleError(f"{source}: expected a mapping with a list under 'rules'")
    rules: list[RuleDefinition] = []
    inhibits: list[InhibitDefinition] = []
    problems: list[str] = []
    for item in data["rules"]:
        try:
            rules.append(parse_rule(item))
        except RuleError as exc:
            problems.append(str(exc))
    for item in data.get("inhibit_rules") or []:
        try:
            inhibits.append(parse_inhibit(item))
        except RuleError as exc:
            problems.append(str(exc))
    base_url = runbook_base_url or data.get("runbook_base_url") or ""
    if (problem := runbooks.check_base_url(base_url)) is not None:
        problems.append(problem)
    names = [rule.name for rule in rules]
    problems.extend(
        f"rule {name}: defined more than once"
        for name in sorted(set(names))
        if names.count(name) > 1
    )
    if problems:
        raise RuleError(f"{source}: " + "\n".join(problems))
    return RuleFile(runbooks.with_runbook_links(rules, base_url), inhibits, base_url)
