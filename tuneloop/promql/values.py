"""What PromQL expressions evaluate to, over every step of a query at once.

An instant vector is a list of :class:`Series`, each with a value per step and a mask of the
steps where it has one (a series may come and go within a range); a scalar has a value at
every step. An instant query is a range query of one step. Range vectors exist only as the
argument of a function (or as the whole of an instant query), as raw samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

import numpy as np
import numpy.typing as npt

from tuneloop.errors import InvalidInput, TemporaryError
from tuneloop.storage.timeseries.raw import RawSeries
from tuneloop.storage.timeseries.types import Matcher

FloatArray: TypeAlias = npt.NDArray[np.float64]
BoolArray: TypeAlias = npt.NDArray[np.bool_]
TimeArray: TypeAlias = npt.NDArray[np.int64]

METRIC_NAME = "__name__"
LOOKBACK_MS = 5 * 60 * 1000
"""How far back an instant vector selector looks for a sample, as Prometheus' default."""


class PromQLError(InvalidInput):
    """A query Prometheus would refuse; ``error_type`` is its ``errorType``."""

    error_type = "bad_data"


class ExecutionError(PromQLError):
    """A valid query that cannot be answered (too many samples, conflicting series)."""

    error_type = "execution"


class QueryTimeout(TemporaryError):
    """The evaluation ran past its time limit."""

    error_type = "timeout"


@dataclass(slots=True)
class Series:
    labels: dict[str, str]
    values: FloatArray
    present: BoolArray


@dataclass(slots=True)
class Scalar:
    values: FloatArray


@dataclass(slots=True)
class String:
    value: str


@dataclass(slots=True)
class RangeVector:
    """Raw samples of a range selector: the result of an instant query like ``x[5m]``."""

    series: list[RawSeries]


Vector: TypeAlias = list[Series]
Value: TypeAlias = Vector | Scalar | String | RangeVector


class SampleSource(Protocol):
    """Where the engine reads samples: one project's store, bounded in time."""

    def count(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, limit: int) -> int:
        """Samples in ``(start_ms, end_ms]`` of the selected series, counted to ``limit + 1``."""
        ...

    def read(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[RawSeries]:
        """The selected series with their samples in ``(start_ms, end_ms]``."""
        ...


def without_name(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k != METRIC_NAME}


def label_key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def merge_same_labels(series: Vector) -> Vector:
    """Series that ended up with one label set (a name dropped, labels rewritten) as one, as
    Prometheus' output does; two with a value at the same step is Prometheus' error."""
    groups: dict[tuple[tuple[str, str], ...], Series] = {}
    for one in series:
        key = label_key(one.labels)
        seen = groups.get(key)
        if seen is None:
            groups[key] = Series(one.labels, one.values.copy(), one.present.copy())
            continue
        if np.any(seen.present & one.present):
            raise ExecutionError("vector cannot contain metrics with the same labelset")
        seen.values = np.where(one.present, one.values, seen.values)
        seen.present = seen.present | one.present
    return list(groups.values())
