"""Means with confidence intervals, and whether one set of run times is shorter than another
by more than their noise (Welch's t interval of the difference of means)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as scipy_stats

LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    """A mean and its two-sided 95% t confidence interval (``low == high == mean`` from one
    value; NaN from none)."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def fmt(self, unit: str, digits: int) -> str:
        if self.n == 0:
            return "n/a"
        return f"{self.mean:.{digits}f} +- {self.half_width:.{digits}f}{' ' + unit if unit else ''}"


def mean_interval(values: Sequence[float]) -> Interval:
    n = len(values)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = statistics.fmean(values)
    if n == 1:
        return Interval(mean, mean, mean, 1)
    half = _t(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


@dataclass(frozen=True)
class Difference:
    """``other - this``: positive when ``this`` is shorter."""

    difference: float
    low: float
    high: float

    @property
    def significant(self) -> bool:
        """The interval excludes zero."""
        return self.low > 0 or self.high < 0


def welch_faster(this: Sequence[float], other: Sequence[float]) -> Difference:
    """The 95% Welch interval of ``mean(other) - mean(this)``."""
    if len(this) < 2 or len(other) < 2:
        raise ValueError("need at least two runs on each side")
    va, vb = statistics.variance(this) / len(this), statistics.variance(other) / len(other)
    difference = statistics.fmean(other) - statistics.fmean(this)
    se = math.sqrt(va + vb)
    if se == 0:
        return Difference(difference, difference, difference)
    dof = (va + vb) ** 2 / (va**2 / (len(this) - 1) + vb**2 / (len(other) - 1))
    half = _t(dof) * se
    return Difference(difference, difference - half, difference + half)


def _t(dof: float) -> float:
    return float(scipy_stats.t.ppf(0.5 + LEVEL / 2, dof))
