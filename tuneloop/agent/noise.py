"""The gradient noise scale estimate, for goodput (McCandlish et al. 2018, "An Empirical Model
of Large-Batch Training", appendix A). Pure arithmetic: the framework integration feeds it.

Data-parallel training sees the gradient at two batch sizes for free: each rank's local
gradient (``B_small`` samples) before the all-reduce and the averaged one (``B_big``) after.
From their squared norms,

    |G|^2 ~= (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(S) ~= (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)

are unbiased, and ``B_simple = tr(S) / |G|^2``. Both are noisy step to step, so they are
averaged first (exponentially, as the paper recommends: means before the ratio).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class GradientNoiseScale:
    """Running estimate of ``B_simple``; ``smoothing`` is the weight of history per update."""

    smoothing: float = 0.95
    _grad_sq: float = 0.0
    _trace: float = 0.0
    _weight: float = 0.0
    updates: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {self.smoothing}")

    def update(self, sq_small: float, sq_big: float, b_small: float, b_big: float) -> None:
        """One update's squared norms: ``sq_small`` the mean over ranks of the local
        gradient's, ``sq_big`` the averaged gradient's."""
        if not b_big > b_small > 0:
            raise ValueError(f"need b_big > b_small > 0, got {b_big} and {b_small}")
        if not (math.isfinite(sq_small) and math.isfinite(sq_big)):
            return  # a diverged or skipped step tells nothing about the noise
        grad_sq = (b_big * sq_big - b_small * sq_small) / (b_big - b_small)
        trace = (sq_small - sq_big) / (1.0 / b_small - 1.0 / b_big)
        keep = self.smoothing
        self._grad_sq = keep * self._grad_sq + (1 - keep) * grad_sq
        self._trace = keep * self._trace + (1 - keep) * trace
        self._weight = keep * self._weight + (1 - keep)
        self.updates += 1

    @property
    def value(self) -> float | None:
        """``B_simple`` in samples, or ``None`` before it can be estimated (no update yet, or
        a gradient too small to measure against its noise)."""
        if self._weight == 0.0:
            return None
        grad_sq = self._grad_sq / self._weight
        trace = self._trace / self._weight
        if grad_sq <= 0 or trace < 0:
            return None
        return trace / grad_sq
