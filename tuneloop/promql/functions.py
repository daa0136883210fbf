"""Functions of instant vectors and scalars (``abs``, ``clamp``, ``histogram_quantile``,
``label_replace``, ...), each applied at every step at once."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Final

import numpy as np

from tuneloop.promql.values import (
    METRIC_NAME,
    FloatArray,
    PromQLError,
    Scalar,
    Series,
    String,
    TimeArray,
    Value,
    Vector,
    label_key,
    merge_same_labels,
    without_name,
)
from tuneloop.regex import InvalidRegex, RegexMatch, compile_anchored

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _math(operation: Callable[[FloatArray], FloatArray]) -> Callable[[Vector], Vector]:
    def apply(vector: Vector) -> Vector:
        with np.errstate(all="ignore"):
            return merge_same_labels(
                [Series(without_name(s.labels), operation(s.values), s.present) for s in vector]
            )

    return apply


MATH: Final[dict[str, Callable[[Vector], Vector]]] = {
    "abs": _math(np.abs),
    "ceil": _math(np.ceil),
    "floor": _math(np.floor),
    "exp": _math(np.exp),
    "ln": _math(np.log),
    "log2": _math(np.log2),
    "log10": _math(np.log10),
    "sqrt": _math(np.sqrt),
    "sgn": _math(np.sign),
}


def round_(vector: Vector, to_nearest: FloatArray) -> Vector:
    inverse = 1.0 / to_nearest
    return _math(lambda v: np.floor(v * inverse + 0.5) / inverse)(vector)


def clamp(vector: Vector, low: FloatArray, high: FloatArray) -> Vector:
    # Go's math.Max/Min: NaN in, NaN out. Steps where max < min give nothing.
    valid = ~(high < low)
    out = _math(lambda v: np.fmin(np.fmax(v, low), high))(vector)
    for series, original in zip(out, vector, strict=False):
        series.values = np.where(np.isnan(original.values), np.nan, series.values)
        series.present = series.present & valid
    return out


def clamp_min(vector: Vector, low: FloatArray) -> Vector:
    return clamp(vector, low, np.full(len(low), math.inf))


def clamp_max(vector: Vector, high: FloatArray) -> Vector:
    return clamp(vector, np.full(len(high), -math.inf), high)


def scalar(vector: Vector, steps: int) -> Scalar:
    """The value of the only series with one at a step; NaN where there are none or more."""
    counts = np.zeros(steps, np.int64)
    values = np.full(steps, math.nan)
    for series in vector:
        counts += series.present
        values = np.where(series.present, series.values, values)
    return Scalar(np.where(counts == 1, values, math.nan))


def vector(value: Scalar) -> Vector:
    return [Series({}, value.values, np.ones(len(value.values), bool))]


def timestamp(vector: Vector, times_s: FloatArray) -> Vector:
    return merge_same_labels(
        [Series(without_name(s.labels), times_s.copy(), s.present) for s in vector]
    )


def absent(vector: Vector, labels: dict[str, str], steps: int) -> Vector:
    anything = np.zeros(steps, bool)
    for series in vector:
        anything |= series.present
    return [Series(labels, np.ones(steps), ~anything)]


def histogram_quantile(q: FloatArray, vector: Vector) -> Vector:
    """Prometheus' bucketQuantile per step over the ``le`` buckets of each group of series
    (their labels but ``le`` and the name): buckets sorted, equal bounds merged, counts made
    monotonic, then linear interpolation within the bucket the rank falls in."""
    groups: dict[object, tuple[dict[str, str], list[tuple[float, Series]]]] = {}
    for series in vector:
        bound = _upper_bound(series.labels.get("le"))
        if bound is None:
            continue
        labels = {k: v for k, v in series.labels.items() if k not in ("le", METRIC_NAME)}
        groups.setdefault(label_key(labels), (labels, []))[1].append((bound, series))
    out: Vector = []
    for labels, buckets in groups.values():
        buckets.sort(key=lambda pair: pair[0])
        bounds = np.array([bound for bound, _ in buckets])
        counts = np.vstack([s.values for _, s in buckets])
        present = np.vstack([s.present for _, s in buckets])
        steps = counts.shape[1]
        values = np.full(steps, math.nan)
        for step in range(steps):
            here = present[:, step]
            if here.any():
                values[step] = _bucket_quantile(float(q[step]), bounds[here], counts[here, step])
        out.append(Series(labels, values, np.asarray(present.any(axis=0))))
    return out


def _upper_bound(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _bucket_quantile(q: float, bounds: FloatArray, counts: FloatArray) -> float:
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    if not math.isinf(bounds[-1]) or bounds[-1] < 0:
        return math.nan
    merged_bounds: list[float] = []
    merged_counts: list[float] = []
    for bound, count in zip(bounds.tolist(), counts.tolist(), strict=True):
        if merged_bounds and merged_bounds[-1] == bound:
            merged_counts[-1] += count
        else:
            merged_bounds.append(bound)
            merged_counts.append(count)
    for i in range(1, len(merged_counts)):
        merged_counts[i] = max(merged_counts[i], merged_counts[i - 1])
    if len(merged_bounds) < 2:
        return math.nan
    observations = merged_counts[-1]
    if observations == 0 or math.isnan(observations):
        return math.nan
    rank = q * observations
    b = next(
        (i for i in range(len(merged_counts) - 1) if merged_counts[i] >= rank),
        len(merged_counts) - 1,
    )
    if b == len(merged_counts) - 1:
        return merged_bounds[-2]
    if b == 0 and merged_bounds[0] <= 0:
        return merged_bounds[0]
    start, end, count = 0.0, merged_bounds[b], merged_counts[b]
    if b > 0:
        start = merged_bounds[b - 1]
        count -= merged_counts[b - 1]
        rank -= merged_counts[b - 1]
    return start + (end - start) * (rank / count)


def label_replace(
    vector: Vector, destination: str, replacement: str, source: str, pattern: str
) -> Vector:
    """Where ``pattern`` (RE2, anchored) matches the value of ``source``, set ``destination``
    to ``replacement`` with ``$1``/``${name}`` expanded; an empty result removes it."""
    try:
        regex = compile_anchored(pattern)
    except (InvalidRegex, ValueError) as exc:
        raise PromQLError(f"invalid regular expression in label_replace(): {exc}") from None
    if not _LABEL_NAME.fullmatch(destination):
        raise PromQLError(f"invalid destination label name in label_replace(): {destination}")
    out: Vector = []
    for series in vector:
        found = regex.fullmatch(series.labels.get(source, ""))
        labels = series.labels
        if found is not None:
            labels = dict(labels)
            value = _expand(found, replacement)
            if value:
                labels[destination] = value
            else:
                labels.pop(destination, None)
        out.append(Series(labels, series.values, series.present))
    return merge_same_labels(out)


_GROUP_REF = re.compile(r"\$(?:\{(\w+)\}|(\w+)|\$)")


def _expand(found: RegexMatch, template: str) -> str:
    """Go's Regexp.Expand: ``$1``, ``${1}``, ``$name``, ``${name}``; ``$$`` is a dollar; an
    unknown group is empty."""

    def group(ref: re.Match[str]) -> str:
        name = ref.group(1) or ref.group(2)
        if name is None:
            return "$"
        try:
            return found.group(int(name) if name.isdigit() else name) or ""
        except (IndexError, KeyError, ValueError, TypeError):
            return ""

    return _GROUP_REF.sub(group, template)


def label_join(vector: Vector, destination: str, separator: str, sources: list[str]) -> Vector:
    if not _LABEL_NAME.fullmatch(destination):
        raise PromQLError(f"invalid destination label name in label_join(): {destination}")
    out: Vector = []
    for series in vector:
        labels = dict(series.labels)
        value = separator.join(series.labels.get(name, "") for name in sources)
        if value:
            labels[destination] = value
        else:
            labels.pop(destination, None)
        out.append(Series(labels, series.values, series.present))
    return merge_same_labels(out)


def sort(vector: Vector, descending: bool) -> Vector:
    """Ordered by the value at the (one) step of an instant query; NaN last."""

    def key(series: Series) -> float:
        value = float(series.values[0])
        if math.isnan(value):
            return math.inf
        return -value if descending else value

    return sorted(vector, key=key)


def time_(times_ms: TimeArray) -> Scalar:
    return Scalar(times_ms / 1000.0)


def string_arg(value: Value, function: str) -> str:
    if not isinstance(value, String):
        raise PromQLError(f"expected a string argument in {function}()")
    return value.value
