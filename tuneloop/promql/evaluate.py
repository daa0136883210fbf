"""Evaluation of a parsed PromQL expression at every step of a query at once.

Before anything is read, every selector's read (its series in the window the steps, offset,
``@`` and lookback or range need) is counted against ``max_samples``; only then are samples
loaded, one read per selector. Semantics as Prometheus': a 5-minute lookback for instant
selectors, range windows ``(t - range, t]``, the metric name dropped where Prometheus drops it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import promql_parser as ast

from tuneloop.promql import binary, functions
from tuneloop.promql.aggregations import aggregate
from tuneloop.promql.parse import matchers, millis
from tuneloop.promql.range_functions import KEEPS_NAME, RANGE_FUNCTIONS
from tuneloop.promql.values import (
    LOOKBACK_MS,
    METRIC_NAME,
    ExecutionError,
    FloatArray,
    PromQLError,
    QueryTimeout,
    RangeVector,
    SampleSource,
    Scalar,
    Series,
    String,
    TimeArray,
    Value,
    Vector,
    merge_same_labels,
    without_name,
)
from tuneloop.storage.timeseries.raw import RawSeries
from tuneloop.storage.timeseries.types import Matcher, MatchOp

ReadKey = tuple[tuple[Matcher, ...], int, int]
DEFAULT_SUBQUERY_STEP_MS = 60_000

_CARDS = (
    (ast.VectorMatchCardinality.OneToOne, "one"),
    (ast.VectorMatchCardinality.ManyToOne, "left"),
    (ast.VectorMatchCardinality.OneToMany, "right"),
    (ast.VectorMatchCardinality.ManyToMany, "many"),
)
"""Pairs, not a dict: the parser's enum members compare equal but cannot be hashed."""


@dataclass
class Evaluator:
    """Evaluates expressions at ``times_ms`` (the steps) over ``source``."""

    source: SampleSource
    times_ms: TimeArray
    max_samples: int
    deadline: float
    """``time.monotonic()`` past which evaluation stops with :class:`QueryTimeout`."""
    end_ms: int
    """The query's end, which ``@ end()`` names (the last step may fall before it)."""
    _reads: dict[ReadKey, list[RawSeries]] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return len(self.times_ms)

    # ------------------------------------------------------------------ planning and reads

    def check_samples(self, expr: ast.Expr) -> None:
        """Refuse, before reading, an expression that would load more than ``max_samples``."""
        planned = set(self._planned(expr))
        total = 0
        for selector, start_ms, end_ms in planned:
            left = self.max_samples - total
            total += self.source.count(selector, start_ms, end_ms, left)
            if total > self.max_samples:
                raise ExecutionError(
                    "query processing would load too many samples into memory in query "
                    f"execution: more than {self.max_samples} "
                    "(TUNELOOP_PROMQL_MAX_SAMPLES); narrow the selectors or the range"
                )

    def _planned(self, node: Any) -> Iterator[ReadKey]:
        """The read of every selector of the expression: its series over the window its steps
        look at (its range, or the lookback of an instant selector)."""
        if isinstance(node, ast.MatrixSelector):
            yield self._read_key(node.vector_selector, millis(node.range))
        elif isinstance(node, ast.VectorSelector):
            yield self._read_key(node, LOOKBACK_MS)
        elif isinstance(node, ast.SubqueryExpr):
            yield from self._subquery(node)._planned(node.expr)
        else:
            for child in _children(node):
                yield from self._planned(child)

    def _subquery(self, node: ast.SubqueryExpr) -> Evaluator:
        """The evaluator of a subquery's inner expression: at multiples of its step (default
        one minute, Prometheus' default evaluation interval), from the first at or after the
        earliest window's start to the last step's end, as Prometheus aligns them."""
        step = millis(node.step) or DEFAULT_SUBQUERY_STEP_MS
        ends = self._ends(node)
        first = (int(ends.min()) - millis(node.range)) // step * step
        if first < int(ends.min()) - millis(node.range):
            first += step
        times = np.arange(first, int(ends.max()) + 1, step, dtype=np.int64)
        return Evaluator(
            self.source, times, self.max_samples, self.deadline, self.end_ms, self._reads
        )

    def _subquery_series(self, node: ast.SubqueryExpr) -> list[RawSeries]:
        """A subquery's result: each series' values at the inner steps, as raw samples."""
        inner = self._subquery(node)
        value = inner.eval(node.expr)
        if not isinstance(value, list):
            raise PromQLError("a subquery needs an instant vector inside")
        times = inner.times_ms
        return [
            RawSeries(s.labels, times[s.present], s.values[s.present])
            for s in value
            if s.present.any()
        ]

    def _ends(self, node: ast.VectorSelector | ast.SubqueryExpr) -> TimeArray:
        """Where each step looks from: its time (or the ``@`` time), less the offset."""
        at = node.at
        if at is None:
            ends = self.times_ms
        elif at.type == ast.AtModifierType.Start:
            ends = np.full(self.steps, self.times_ms[0])
        elif at.type == ast.AtModifierType.End:
            ends = np.full(self.steps, self.end_ms, dtype=np.int64)
        else:
            assert at.at is not None
            ends = np.full(self.steps, round(at.at.timestamp() * 1000), dtype=np.int64)
        return ends - millis(node.offset)

    def _read_key(self, selector: ast.VectorSelector, window_ms: int) -> ReadKey:
        ends = self._ends(selector)
        return matchers(selector), int(ends.min()) - window_ms, int(ends.max())

    def _read(self, key: ReadKey) -> list[RawSeries]:
        if key not in self._reads:
            self._check_deadline()
            found = self.source.read(*key)
            # Each series becomes a value per step: bounded like the samples read, so that a
            # fine step over many series cannot fill memory.
            if len(found) * self.steps > self.max_samples:
                raise ExecutionError(
                    "query processing would load too many samples into memory in query "
                    f"execution: {len(found)} series x {self.steps} steps is more than "
                    f"{self.max_samples} (TUNELOOP_PROMQL_MAX_SAMPLES); use a larger step"
                )
            self._reads[key] = found
        return self._reads[key]

    def _check_deadline(self) -> None:
        if time.monotonic() > self.deadline:
            raise QueryTimeout("query timed out in expression evaluation")

    # ------------------------------------------------------------------ expressions

    def eval(self, node: ast.Expr) -> Value:
        self._check_deadline()
        if isinstance(node, ast.NumberLiteral):
            return Scalar(np.full(self.steps, float(node.val)))
        if isinstance(node, ast.StringLiteral):
            return String(node.val)
        if isinstance(node, ast.ParenExpr):
            return self.eval(node.expr)
        if isinstance(node, ast.VectorSelector):
            return self._selector(node)
        if isinstance(node, ast.MatrixSelector):
            selector, range_ms = node.vector_selector, millis(node.range)
            return RangeVector(self._read(self._read_key(selector, range_ms)))
        if isinstance(node, ast.SubqueryExpr):
            ends = self._ends(node)
            window = (int(ends.max()) - millis(node.range), int(ends.max()))
            return RangeVector([_window(raw, *window) for raw in self._subquery_series(node)])
        if isinstance(node, ast.UnaryExpr):
            return self._negate(self.eval(node.expr))
        if isinstance(node, ast.BinaryExpr):
            return self._binary(node)
        if isinstance(node, ast.AggregateExpr):
            return self._aggregate(node)
        if isinstance(node, ast.Call):
            return self._call(node)
        raise PromQLError(f"unsupported expression: {node}")

    def _selector(self, selector: ast.VectorSelector) -> Vector:
        ends = self._ends(selector)
        out: Vector = []
        for raw in self._read(self._read_key(selector, LOOKBACK_MS)):
            index = np.searchsorted(raw.times_ms, ends, side="right") - 1
            safe = np.maximum(index, 0)
            present = (index >= 0) & (raw.times_ms[safe] > ends - LOOKBACK_MS)
            out.append(Series(raw.labels, raw.values[safe], present))
        return out

    def _sample_times(self, selector: ast.VectorSelector) -> Vector:
        """timestamp(selector): the time of the sample each step found, not the step's."""
        ends = self._ends(selector)
        out: Vector = []
        for raw in self._read(self._read_key(selector, LOOKBACK_MS)):
            index = np.searchsorted(raw.times_ms, ends, side="right") - 1
            safe = np.maximum(index, 0)
            present = (index >= 0) & (raw.times_ms[safe] > ends - LOOKBACK_MS)
            seconds = raw.times_ms[safe] / 1000.0
            out.append(Series(without_name(raw.labels), seconds, present))
        return merge_same_labels(out)

    def _negate(self, value: Value) -> Value:
        if isinstance(value, Scalar):
            return Scalar(-value.values)
        if isinstance(value, list):
            return merge_same_labels(
                [Series(without_name(s.labels), -s.values, s.present) for s in value]
            )
        raise PromQLError("unary minus needs a scalar or an instant vector")

    def _binary(self, node: ast.BinaryExpr) -> Value:
        op = str(node.op)
        left, right = self.eval(node.lhs), self.eval(node.rhs)
        modifier = node.modifier
        return_bool = bool(modifier and modifier.return_bool)
        if isinstance(left, Scalar) and isinstance(right, Scalar):
            return binary.scalars(op, left, right, return_bool)
        if isinstance(left, list) and isinstance(right, Scalar):
            return binary.vector_scalar(op, left, right, scalar_left=False, return_bool=return_bool)
        if isinstance(left, Scalar) and isinstance(right, list):
            return binary.vector_scalar(op, right, left, scalar_left=True, return_bool=return_bool)
        if isinstance(left, list) and isinstance(right, list):
            return binary.vectors(op, left, right, _matching(modifier, op, return_bool))
        raise PromQLError(f"operator {op} needs scalars or instant vectors on both sides")

    def _aggregate(self, node: ast.AggregateExpr) -> Vector:
        op = str(node.op)
        vector = self._vector(node.expr, op)
        param: FloatArray | None = None
        if node.param is not None:
            param = self._scalar(node.param, op).values
        modifier = node.modifier
        if modifier is None:
            grouping: tuple[bool, Sequence[str]] = (False, ())
        else:
            grouping = (modifier.type == ast.AggModifierType.Without, list(modifier.labels))
        return aggregate(op, vector, grouping, param)

    def _vector(self, node: ast.Expr, where: str) -> Vector:
        value = self.eval(node)
        if not isinstance(value, list):
            raise PromQLError(f"expected an instant vector in {where}()")
        return value

    def _scalar(self, node: ast.Expr, where: str) -> Scalar:
        value = self.eval(node)
        if not isinstance(value, Scalar):
            raise PromQLError(f"expected a scalar in {where}()")
        return value

    def _call(self, node: ast.Call) -> Value:
        name: str = node.func.name
        args: list[Any] = list(node.args)
        if name in RANGE_FUNCTIONS:
            return self._range_function(name, args)
        if name == "time":
            return functions.time_(self.times_ms)
        if name == "timestamp":
            inner = _unwrap(args[0])
            if isinstance(inner, ast.VectorSelector):
                return self._sample_times(inner)
            return functions.timestamp(self._vector(inner, name), self.times_ms / 1000.0)
        if name == "vector":
            return functions.vector(self._scalar(args[0], name))
        if name == "absent":
            return functions.absent(
                self._vector(args[0], name), _absent_labels(args[0]), self.steps
            )
        if name == "histogram_quantile":
            q = self._scalar(args[0], name).values
            return functions.histogram_quantile(q, self._vector(args[1], name))
        if name == "label_replace":
            strings = [functions.string_arg(self.eval(arg), name) for arg in args[1:]]
            return functions.label_replace(self._vector(args[0], name), *strings)
        if name == "label_join":
            strings = [functions.string_arg(self.eval(arg), name) for arg in args[1:]]
            return functions.label_join(
                self._vector(args[0], name), strings[0], strings[1], strings[2:]
            )
        vector = self._vector(args[0], name)
        scalars = [self._scalar(arg, name).values for arg in args[1:]]
        if name in functions.MATH:
            return functions.MATH[name](vector)
        if name == "round":
            return functions.round_(vector, scalars[0] if scalars else np.ones(self.steps))
        if name in ("clamp", "clamp_min", "clamp_max"):
            return getattr(functions, name)(vector, *scalars)  # type: ignore[no-any-return]
        if name == "scalar":
            return functions.scalar(vector, self.steps)
        if name in ("sort", "sort_desc"):
            return functions.sort(vector, descending=name == "sort_desc")
        raise PromQLError(f"function {name}() is not supported by tuneloop's PromQL engine")

    def _range_function(self, name: str, args: list[Any]) -> Vector:
        parameter = 0.0
        if name == "quantile_over_time":
            # One φ for the whole query: a φ that changes from step to step is not supported.
            parameter = float(self._scalar(args[0], name).values[0])
            args = args[1:]
        matrix = args[0]
        if isinstance(matrix, ast.SubqueryExpr):
            range_ms, ends = millis(matrix.range), self._ends(matrix)
            found = self._subquery_series(matrix)
        elif isinstance(matrix, ast.MatrixSelector):
            selector, range_ms = matrix.vector_selector, millis(matrix.range)
            ends = self._ends(selector)
            found = self._read(self._read_key(selector, range_ms))
        else:
            raise PromQLError(f"expected a range vector in {name}()")
        function = RANGE_FUNCTIONS[name]
        out: Vector = []
        for raw in found:
            self._check_deadline()
            values, present = function(raw, ends, range_ms, parameter)
            labels = raw.labels if name in KEEPS_NAME else without_name(raw.labels)
            out.append(Series(labels, values, present))
        return merge_same_labels(out)


def _children(node: Any) -> list[Any]:
    """The operands of an expression node (parameters of aggregations included)."""
    if isinstance(node, ast.BinaryExpr):
        return [node.lhs, node.rhs]
    if isinstance(node, ast.AggregateExpr):
        return [node.expr] if node.param is None else [node.param, node.expr]
    if isinstance(node, ast.Call):
        return list(node.args)
    if isinstance(node, (ast.ParenExpr, ast.UnaryExpr)):
        return [node.expr]
    return []


def _window(raw: RawSeries, start_ms: int, end_ms: int) -> RawSeries:
    """The samples of ``raw`` in ``(start_ms, end_ms]``."""
    keep = (raw.times_ms > start_ms) & (raw.times_ms <= end_ms)
    return RawSeries(raw.labels, raw.times_ms[keep], raw.values[keep])


def _unwrap(node: ast.Expr) -> ast.Expr:
    while isinstance(node, ast.ParenExpr):
        node = node.expr
    return node


def _absent_labels(node: ast.Expr) -> dict[str, str]:
    """absent()'s labels: those of the selector's equality matchers (not the name)."""
    inner = _unwrap(node)
    if not isinstance(inner, ast.VectorSelector):
        return {}
    labels: dict[str, str] = {}
    for matcher in matchers(inner):
        if matcher.op is MatchOp.EQ and matcher.name != METRIC_NAME:
            labels.setdefault(matcher.name, matcher.value)
    return labels


def _matching(modifier: ast.BinModifier | None, op: str, return_bool: bool) -> binary.Matching:
    if modifier is None:
        card = "many" if op in binary.SET_OPERATORS else "one"
        return binary.Matching(card=card, return_bool=return_bool)
    matching = modifier.matching
    return binary.Matching(
        on=matching is not None and matching.type == ast.LabelModifierType.Include,
        labels=list(matching.labels) if matching is not None else [],
        card=next(ours for theirs, ours in _CARDS if modifier.card == theirs),
        include=list(modifier.group_labels or []),
        return_bool=return_bool,
    )
