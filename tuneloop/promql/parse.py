"""PromQL text to the AST of ``promql_parser`` (the Rust parser of the Prometheus project's
grammar), checked against what this engine evaluates: anything else is refused up front,
naming the function or feature, before any sample is read."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

import promql_parser as ast

from tuneloop.promql.aggregations import AGGREGATIONS
from tuneloop.promql.range_functions import RANGE_FUNCTIONS
from tuneloop.promql.values import METRIC_NAME, PromQLError
from tuneloop.storage.timeseries.types import Matcher, MatchOp

MAX_QUERY_LENGTH: Final = 64 * 1024
NOT_INSTANT: Final = "the expression must give an instant vector or a scalar"

INSTANT_FUNCTIONS: Final = frozenset(
    {
        "abs", "ceil", "floor", "round", "exp", "ln", "log2", "log10", "sqrt", "sgn",
        "clamp", "clamp_min", "clamp_max", "scalar", "vector", "time", "timestamp",
        "label_replace", "label_join", "absent", "sort", "sort_desc", "histogram_quantile",
    }
)  # fmt: skip
SUPPORTED_FUNCTIONS: Final = INSTANT_FUNCTIONS | RANGE_FUNCTIONS.keys()

_OPS: Final = (
    (ast.MatchOp.Equal, MatchOp.EQ),
    (ast.MatchOp.NotEqual, MatchOp.NE),
    (ast.MatchOp.Re, MatchOp.RE),
    (ast.MatchOp.NotRe, MatchOp.NRE),
)
"""Pairs, not a dict: the parser's enum members compare equal but cannot be hashed."""


def _op(op: ast.MatchOp) -> MatchOp:
    return next(ours for theirs, ours in _OPS if op == theirs)


def parse(text: str) -> ast.Expr:
    """The AST of ``text``; :class:`PromQLError` (bad_data) for a syntax error or anything
    outside the supported subset."""
    if len(text) > MAX_QUERY_LENGTH:
        raise PromQLError(f"the query is longer than {MAX_QUERY_LENGTH} characters")
    if not text.strip():
        raise PromQLError("parse error: no expression found in input")
    try:
        expr = ast.parse(text)
    except (ValueError, RuntimeError) as exc:
        raise PromQLError(f"parse error: {exc}") from None
    ast.walk(expr, _check_supported)
    return expr


def parse_instant(text: str) -> ast.Expr:
    """As :func:`parse`, for what is evaluated at one time into alerts or signals: refused
    unless it gives an instant vector or a scalar (a range vector or a string is no value to
    compare or scale on)."""
    expr = parse(text)
    inner = expr
    while isinstance(inner, ast.ParenExpr):
        inner = inner.expr
    if isinstance(inner, (ast.MatrixSelector, ast.SubqueryExpr, ast.StringLiteral)):
        raise PromQLError(NOT_INSTANT)
    return expr


def _check_supported(node: ast.Expr) -> bool:
    if isinstance(node, ast.Call) and node.func.name not in SUPPORTED_FUNCTIONS:
        raise PromQLError(
            f"function {node.func.name}() is not supported by tuneloop's PromQL engine; "
            f"supported: {', '.join(sorted(SUPPORTED_FUNCTIONS))}"
        )
    if isinstance(node, ast.AggregateExpr) and str(node.op) not in AGGREGATIONS:
        raise PromQLError(
            f"aggregation {node.op}() is not supported by tuneloop's PromQL engine; "
            f"supported: {', '.join(sorted(AGGREGATIONS))}"
        )
    if isinstance(node, ast.BinaryExpr) and str(node.op) == "atan2":
        raise PromQLError("the atan2 operator is not supported by tuneloop's PromQL engine")
    if isinstance(node, ast.VectorSelector) and node.matchers.or_matchers:
        raise PromQLError("'or' inside a selector's braces is not supported")
    return True


def matchers(selector: ast.VectorSelector) -> tuple[Matcher, ...]:
    """The selector's matchers in the store's terms, its metric name as ``__name__``."""
    found = [Matcher(m.name, _op(m.op), m.value) for m in selector.matchers.matchers]
    if selector.name is not None:
        found.insert(0, Matcher(METRIC_NAME, MatchOp.EQ, selector.name))
    return tuple(found)


def millis(delta: timedelta | None) -> int:
    return 0 if delta is None else delta // timedelta(milliseconds=1)
