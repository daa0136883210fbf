"""The mean of a window of samples and its autocorrelation-robust standard error.

Shared by the tuner, which judges a trial on it (:mod:`tuner.measurement`), and the job
actuator, which verifies a released change on it (:mod:`actuators.job`): one estimate, so a
trial and a verification of the same config agree. Pure (numpy only), so it sits in the core,
below both components.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class WindowStats:
    """Summary of the samples that count (after warm-up, finite)."""

    n: int
    mean: float
    stderr: float
    rel_stderr: float
    batch_len: int
    n_batches: int
    dropped: int
    """Non-finite samples ignored (a NaN never reaches a trial value)."""
    last_t: float | None


def window_stats(
    values: Sequence[float], dropped: int = 0, last_t: float | None = None
) -> WindowStats:
    """Mean and autocorrelation-robust standard error of ``values`` (oldest first).

    Batch length ``floor(sqrt(n))``; the oldest ``n mod batch_len`` samples are left out of the
    batches (they are the closest to the warm-up). ``stderr`` is
    ``max(batch-means SE, plain SEM)``; ``rel_stderr`` is ``stderr / |mean|`` (0 when the
    stderr is 0, infinite when only the mean is 0).
    """
    data = np.asarray(values, dtype=float)
    n = int(data.size)
    if n == 0:
        return WindowStats(0, math.nan, math.inf, math.inf, 0, 0, dropped, last_t)
    mean = float(data.mean())
    if n < 4:
        return WindowStats(n, mean, math.inf, math.inf, 0, 0, dropped, last_t)
    batch_len = math.isqrt(n)
    n_batches = n // batch_len
    used = data[n - n_batches * batch_len :]
    batch_means = used.reshape(n_batches, batch_len).mean(axis=1)
    bm_se = float(batch_means.std(ddof=1)) / math.sqrt(n_batches)
    sem = float(data.std(ddof=1)) / math.sqrt(n)
    stderr = max(bm_se, sem)
    if stderr == 0:
        rel = 0.0
    elif mean == 0:
        rel = math.inf
    else:
        rel = stderr / abs(mean)
    return WindowStats(n, mean, stderr, rel, batch_len, n_batches, dropped, last_t)
