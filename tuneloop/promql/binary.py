"""Binary operators: arithmetic (``+ - * / % ^``), comparisons (``== != > < >= <=``, with or
without ``bool``) and set operators (``and or unless``) between vectors and scalars, with
Prometheus' vector matching (``on``/``ignoring``, ``group_left``/``group_right``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from tuneloop.promql.values import (
    METRIC_NAME,
    BoolArray,
    ExecutionError,
    FloatArray,
    Scalar,
    Series,
    Vector,
    merge_same_labels,
    without_name,
)

Operator = Callable[[FloatArray, FloatArray], FloatArray]


def _mod(a: FloatArray, b: FloatArray) -> FloatArray:
    return np.fmod(a, b)  # Go's math.Mod: the sign of the dividend


ARITHMETIC: Final[dict[str, Operator]] = {
    "+": np.add,
    "-": np.subtract,
    "*": np.multiply,
    "/": np.divide,
    "%": _mod,
    "^": np.power,
}
COMPARISON: Final[dict[str, Callable[[FloatArray, FloatArray], BoolArray]]] = {
    "==": np.equal,
    "!=": np.not_equal,
    ">": np.greater,
    "<": np.less,
    ">=": np.greater_equal,
    "<=": np.less_equal,
}
SET_OPERATORS: Final = frozenset({"and", "or", "unless"})


@dataclass(frozen=True, slots=True)
class Matching:
    """How two vectors' series pair up: ``on`` (only ``labels``) or ``ignoring`` them;
    ``card`` is ``one``, ``left`` (group_left), ``right`` (group_right) or ``many``."""

    on: bool = False
    labels: Sequence[str] = ()
    card: str = "one"
    include: Sequence[str] = ()
    return_bool: bool = False


def _apply(op: str, left: FloatArray, right: FloatArray) -> tuple[FloatArray, BoolArray]:
    """Values and which steps keep a result (comparisons filter); left's value for those."""
    with np.errstate(all="ignore"):
        if op in ARITHMETIC:
            values = ARITHMETIC[op](left, right)
            return values, np.ones(values.shape, bool)
        return left, COMPARISON[op](left, right)


def scalars(op: str, left: Scalar, right: Scalar, return_bool: bool) -> Scalar:
    values, keep = _apply(op, left.values, right.values)
    if op in COMPARISON:
        values = keep.astype(np.float64)
    return Scalar(values)


def vector_scalar(
    op: str, vector: Vector, scalar: Scalar, *, scalar_left: bool, return_bool: bool
) -> Vector:
    out: Vector = []
    for series in vector:
        if scalar_left:
            values, keep = _apply(op, scalar.values, series.values)
        else:
            values, keep = _apply(op, series.values, scalar.values)
        labels = series.labels
        if op in COMPARISON:
            values = series.values  # the vector's value, whichever side it is on
            if return_bool:
                values, keep = keep.astype(np.float64), np.ones(len(keep), bool)
        if op in ARITHMETIC or return_bool:
            labels = without_name(labels)
        out.append(Series(labels, values, series.present & keep))
    return merge_same_labels(out) if op in ARITHMETIC or return_bool else out


def _signature(labels: dict[str, str], matching: Matching) -> tuple[tuple[str, str], ...]:
    if matching.on:
        return tuple(sorted((k, labels[k]) for k in matching.labels if k in labels))
    ignored = {*matching.labels, METRIC_NAME}
    return tuple(sorted((k, v) for k, v in labels.items() if k not in ignored))


def _by_signature(vector: Vector, matching: Matching) -> dict[object, list[Series]]:
    found: dict[object, list[Series]] = {}
    for series in vector:
        found.setdefault(_signature(series.labels, matching), []).append(series)
    return found


def _one_side(members: list[Series], side: str) -> Series:
    """The series of a match group on the "one" side, step by step; two with a value at one
    step is Prometheus' error."""
    if len(members) == 1:
        return members[0]
    present = np.vstack([s.present for s in members])
    if np.any(present.sum(axis=0) > 1):
        raise ExecutionError(
            f"found duplicate series for the match group on the {side} hand-side of the "
            "operation; many-to-many matching not allowed: matching labels must be unique "
            "on one side"
        )
    values = np.vstack([s.values for s in members])
    chosen = np.argmax(present, axis=0)
    columns = np.arange(present.shape[1])
    return Series(members[0].labels, values[chosen, columns], np.asarray(present.any(axis=0)))


def vectors(op: str, left: Vector, right: Vector, matching: Matching) -> Vector:
    if op in SET_OPERATORS:
        return _set_operation(op, left, right, matching)
    many, one = (right, left) if matching.card == "right" else (left, right)
    one_side = {
        sig: _one_side(members, "right" if matching.card != "right" else "left")
        for sig, members in _by_signature(one, matching).items()
    }
    out: Vector = []
    for series in many:
        sig = _signature(series.labels, matching)
        other = one_side.get(sig)
        if other is None:
            continue
        lv, rv = (
            (other.values, series.values)
            if matching.card == "right"
            else (
                series.values,
                other.values,
            )
        )
        values, keep = _apply(op, lv, rv)
        present = series.present & other.present
        if matching.return_bool:
            values, keep = keep.astype(np.float64), np.ones(len(keep), bool)
        out.append(Series(_result_labels(series, other, op, matching), values, present & keep))
    if matching.card == "one":
        _check_one_to_one(many, matching)
    return merge_same_labels(out)


def _check_one_to_one(many: Vector, matching: Matching) -> None:
    for members in _by_signature(many, matching).values():
        if len(members) > 1 and np.any(np.vstack([s.present for s in members]).sum(axis=0) > 1):
            raise ExecutionError(
                "multiple matches for labels: many-to-one matching must be explicit "
                "(group_left/group_right)"
            )


def _result_labels(many: Series, one: Series, op: str, matching: Matching) -> dict[str, str]:
    labels = dict(many.labels)
    if op in ARITHMETIC or matching.return_bool:
        labels.pop(METRIC_NAME, None)
    if matching.card == "one":
        if matching.on:
            labels = {k: v for k, v in labels.items() if k in matching.labels}
        else:
            labels = {k: v for k, v in labels.items() if k not in matching.labels}
    for name in matching.include:
        value = one.labels.get(name, "")
        if value:
            labels[name] = value
        else:
            labels.pop(name, None)
    return labels


def _set_operation(op: str, left: Vector, right: Vector, matching: Matching) -> Vector:
    steps = len(left[0].values) if left else len(right[0].values) if right else 0
    right_present: dict[object, BoolArray] = {}
    for series in right:
        sig = _signature(series.labels, matching)
        right_present[sig] = right_present.get(sig, np.zeros(steps, bool)) | series.present
    none = np.zeros(steps, bool)
    if op == "and":
        return [
            Series(
                s.labels,
                s.values,
                s.present & right_present.get(_signature(s.labels, matching), none),
            )
            for s in left
        ]
    if op == "unless":
        return [
            Series(
                s.labels,
                s.values,
                s.present & ~right_present.get(_signature(s.labels, matching), none),
            )
            for s in left
        ]
    left_present: dict[object, BoolArray] = {}
    for series in left:
        sig = _signature(series.labels, matching)
        left_present[sig] = left_present.get(sig, np.zeros(steps, bool)) | series.present
    extra = [
        Series(
            s.labels, s.values, s.present & ~left_present.get(_signature(s.labels, matching), none)
        )
        for s in right
    ]
    return [*left, *extra]
