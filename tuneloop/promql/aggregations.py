"""Aggregation operators (``sum by (Hostname) (...)``, ``topk(3, ...)``) over every step at
once: series are grouped by their labels ``by`` (or ``without``) the modifier's, and each
group reduced per step over the series that have a value at that step."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Final

import numpy as np

from tuneloop.promql.range_functions import quantile
from tuneloop.promql.values import (
    METRIC_NAME,
    BoolArray,
    FloatArray,
    PromQLError,
    Series,
    Vector,
    label_key,
)

Grouping = tuple[bool, Sequence[str]]
"""(``without``?, labels); ``(False, ())`` aggregates everything into one series."""


def group_labels(labels: dict[str, str], grouping: Grouping) -> dict[str, str]:
    without, names = grouping
    if without:
        dropped = {*names, METRIC_NAME}
        return {k: v for k, v in labels.items() if k not in dropped}
    return {k: labels[k] for k in names if k in labels}


def _groups(vector: Vector, grouping: Grouping) -> list[tuple[dict[str, str], list[Series]]]:
    groups: dict[tuple[tuple[str, str], ...], tuple[dict[str, str], list[Series]]] = {}
    for series in vector:
        labels = group_labels(series.labels, grouping)
        groups.setdefault(label_key(labels), (labels, []))[1].append(series)
    return list(groups.values())


def _stacked(members: list[Series]) -> tuple[FloatArray, BoolArray]:
    values = np.vstack([s.values for s in members])
    present = np.vstack([s.present for s in members])
    return np.where(present, values, np.nan), present


Reducer = Callable[[FloatArray, BoolArray, FloatArray], FloatArray]
"""(values with NaN where absent, presence, parameter per step) to a value per step."""


def _sum(values: FloatArray, present: BoolArray, _: FloatArray) -> FloatArray:
    return np.where(present, values, 0.0).sum(axis=0)  # type: ignore[no-any-return]


def _count(values: FloatArray, present: BoolArray, _: FloatArray) -> FloatArray:
    return present.sum(axis=0).astype(np.float64)  # type: ignore[no-any-return]


def _avg(values: FloatArray, present: BoolArray, p: FloatArray) -> FloatArray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return _sum(values, present, p) / _count(values, present, p)


def _stdvar(values: FloatArray, present: BoolArray, p: FloatArray) -> FloatArray:
    mean = _avg(values, present, p)
    deviations = np.where(present, values - mean, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (deviations**2).sum(axis=0) / _count(values, present, p)  # type: ignore[no-any-return]


def _stddev(values: FloatArray, present: BoolArray, p: FloatArray) -> FloatArray:
    return np.sqrt(_stdvar(values, present, p))


def _min(values: FloatArray, present: BoolArray, _: FloatArray) -> FloatArray:
    return np.fmin.reduce(values, axis=0)  # type: ignore[no-any-return]


def _max(values: FloatArray, present: BoolArray, _: FloatArray) -> FloatArray:
    return np.fmax.reduce(values, axis=0)  # type: ignore[no-any-return]


def _group(values: FloatArray, present: BoolArray, _: FloatArray) -> FloatArray:
    return np.ones(values.shape[1])


def _quantile(values: FloatArray, present: BoolArray, q: FloatArray) -> FloatArray:
    out = np.full(values.shape[1], math.nan)
    for step in range(values.shape[1]):
        column = values[present[:, step], step]
        if len(column):
            out[step] = quantile(float(q[step]), column)
    return out


REDUCERS: Final[dict[str, Reducer]] = {
    "sum": _sum,
    "avg": _avg,
    "count": _count,
    "min": _min,
    "max": _max,
    "stddev": _stddev,
    "stdvar": _stdvar,
    "group": _group,
    "quantile": _quantile,
}
SELECTORS: Final = frozenset({"topk", "bottomk"})
AGGREGATIONS: Final = REDUCERS.keys() | SELECTORS


def aggregate(op: str, vector: Vector, grouping: Grouping, param: FloatArray | None) -> Vector:
    """``op`` of ``vector`` per group; ``param`` is quantile's φ or topk's k per step."""
    if op in SELECTORS:
        assert param is not None
        return _select(op == "topk", vector, grouping, param)
    reduce = REDUCERS[op]
    steps = len(vector[0].values) if vector else 0
    parameter = param if param is not None else np.zeros(steps)
    out: Vector = []
    for labels, members in _groups(vector, grouping):
        values, present = _stacked(members)
        any_present: BoolArray = np.asarray(present.any(axis=0))
        out.append(Series(labels, reduce(values, present, parameter), any_present))
    return out


def _select(largest: bool, vector: Vector, grouping: Grouping, k: FloatArray) -> Vector:
    """topk/bottomk: per step and group, the ``k`` series with the largest (smallest)
    values, with all their labels; NaN ranks last either way."""
    if np.any(np.isnan(k)):
        raise PromQLError("Parameter value is NaN")
    out: dict[int, Series] = {}
    for _labels, members in _groups(vector, grouping):
        values, present = _stacked(members)
        ranked = np.where(np.isnan(values), -np.inf if largest else np.inf, values)
        ranked = np.where(present, ranked, np.nan)
        for step in range(values.shape[1]):
            count = int(min(max(k[step], 0), len(members)))
            candidates = np.flatnonzero(present[:, step])
            if count <= 0 or not len(candidates):
                continue
            order = np.argsort(ranked[candidates, step], kind="stable")
            chosen = order[::-1][:count] if largest else order[:count]
            for index in candidates[chosen].tolist():
                member = members[index]
                picked = out.setdefault(
                    id(member),
                    Series(member.labels, member.values, np.zeros(len(member.values), bool)),
                )
                picked.present[step] = True
    return list(out.values())
