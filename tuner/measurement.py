"""Turning a window of step samples into a trial value, or into a reason not to trust one.

A trial runs a configuration; its agent reports one sample per step (or per interval) of the
measured quantity (samples/s, step seconds, requests/s). :func:`judge_window` is called when the
measurement window should be over and answers with a :class:`TrialVerdict`:

- ``wait``: the window (warm-up + measurement + extensions) is not over yet;
- ``accept(value, stderr)``: enough fresh samples with low enough relative noise;
- ``extend(reason)``: stale data (no sample for ``max_age_s``), too few samples, or noise too
  high; the caller lengthens the window by ``window_s`` and asks again with ``extensions + 1``;
- ``fail(reason)``: it would be extended more than ``max_extensions`` times.

Noise: step samples are autocorrelated (data-loader hiccups, thermal and clock changes, other
jobs), so the plain standard error of the mean understates the uncertainty. We use
non-overlapping batch means with ``floor(sqrt(n))`` samples per batch (the usual consistent
choice, Flegal & Jones 2010), and report the larger of that and the plain SEM: with few batches
the batch-means estimate is itself noisy and can come out small by luck.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

import numpy as np

VerdictAction: TypeAlias = Literal["accept", "wait", "extend", "fail"]


class MeasurementError(ValueError):
    """A measurement policy is invalid."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One measurement: ``t`` in seconds on the same clock as ``now`` (epoch seconds)."""

    t: float
    value: float


@dataclass(frozen=True, slots=True)
class MeasurementPolicy:
    """How long to measure and when to trust the result."""

    warmup_s: float = 60.0
    """Samples earlier than ``window_start + warmup_s`` are discarded (compilation, caches,
    the allocator settling after a config change)."""
    warmup_samples: int = 0
    """Further samples to discard after the warm-up time (e.g. the first steps after a
    checkpoint restore)."""
    window_s: float = 120.0
    """Measurement time after the warm-up; each extension adds this much again."""
    min_samples: int = 20
    max_rel_stderr: float = 0.02
    """Largest accepted standard error relative to the mean (2%)."""
    max_age_s: float = 60.0
    """Data is stale when the newest sample is older than this at judging time."""
    max_extensions: int = 3

    def __post_init__(self) -> None:
        for name in ("warmup_s", "window_s", "max_age_s", "max_rel_stderr"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise MeasurementError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.window_s <= 0 or self.max_age_s <= 0 or self.max_rel_stderr <= 0:
            raise MeasurementError("window_s, max_age_s and max_rel_stderr must be > 0")
        if self.min_samples < 4:
            raise MeasurementError(
                f"min_samples must be >= 4 (two batches of two), got {self.min_samples}"
            )
        if self.warmup_samples < 0 or self.max_extensions < 0:
            raise MeasurementError("warmup_samples and max_extensions must be >= 0")

    def window_end(self, window_start: float, extensions: int) -> float:
        return window_start + self.warmup_s + self.window_s * (1 + extensions)


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


@dataclass(frozen=True, slots=True)
class TrialVerdict:
    action: VerdictAction
    value: float | None = None
    stderr: float | None = None
    reason: str = ""
    stats: WindowStats | None = None

    @classmethod
    def accept(cls, value: float, stderr: float, stats: WindowStats | None = None) -> TrialVerdict:
        if not (math.isfinite(value) and math.isfinite(stderr)):
            raise MeasurementError(f"an accepted value must be finite, got {value}, {stderr}")
        return cls("accept", float(value), float(stderr), "", stats)

    @classmethod
    def wait(cls, reason: str, stats: WindowStats | None = None) -> TrialVerdict:
        return cls("wait", None, None, reason, stats)

    @classmethod
    def extend(cls, reason: str, stats: WindowStats | None = None) -> TrialVerdict:
        return cls("extend", None, None, reason, stats)

    @classmethod
    def fail(cls, reason: str, stats: WindowStats | None = None) -> TrialVerdict:
        return cls("fail", None, None, reason, stats)


def judge_window(
    samples: Sequence[Sample],
    *,
    window_start: float,
    now: float,
    extensions: int = 0,
    policy: MeasurementPolicy | None = None,
) -> TrialVerdict:
    """The verdict on a trial's samples at time ``now``.

    ``window_start``: when the configuration took effect; ``extensions``: how many times this
    trial was already extended. Samples may arrive in any order; earlier windows' samples keep
    counting after an extension (that is what lowers the noise).
    """
    policy = policy or MeasurementPolicy()
    if extensions < 0:
        raise MeasurementError(f"extensions must be >= 0, got {extensions}")
    end = policy.window_end(window_start, extensions)
    if now < end:
        return TrialVerdict.wait(f"window ends in {end - now:.0f} s")

    warm = window_start + policy.warmup_s
    kept = sorted((s for s in samples if s.t >= warm), key=lambda s: s.t)
    finite = [s for s in kept if math.isfinite(s.value)]
    dropped = len(kept) - len(finite)
    finite = finite[policy.warmup_samples :]
    last_t = finite[-1].t if finite else None
    stats = window_stats([s.value for s in finite], dropped, last_t)

    reason = _extend_reason(stats, now, policy)
    if reason is None:
        return TrialVerdict.accept(stats.mean, stats.stderr, stats)
    if extensions >= policy.max_extensions:
        return TrialVerdict.fail(f"gave up after {extensions} extensions: {reason}", stats)
    return TrialVerdict.extend(reason, stats)


def _extend_reason(stats: WindowStats, now: float, policy: MeasurementPolicy) -> str | None:
    if stats.last_t is None:
        extra = f" ({stats.dropped} non-finite dropped)" if stats.dropped else ""
        return f"stale: no samples after warm-up{extra}"
    age = now - stats.last_t
    if age > policy.max_age_s:
        return f"stale: newest sample is {age:.0f} s old (max {policy.max_age_s:.0f} s)"
    if stats.n < policy.min_samples:
        return f"too few samples: {stats.n} < {policy.min_samples}"
    if stats.rel_stderr > policy.max_rel_stderr:
        return (
            f"noise too high: relative stderr {stats.rel_stderr:.1%} > {policy.max_rel_stderr:.1%}"
        )
    return None
