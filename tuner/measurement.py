"""Turning a window of step samples into a trial value and its standard error.

A trial runs a configuration; its agent reports one point per step of the measured quantity
(samples/s, step seconds), and :func:`tuner.readings.window_samples` turns them into one sample
per one-second bucket (per step when steps are slower than that). :func:`judge_window` is
called when the measurement window should be over and answers with a :class:`TrialVerdict`:

- ``wait``: the window (warm-up + measurement + extensions) is not over yet;
- ``accept(value, stderr)``: enough fresh samples. The window ends early when the relative
  standard error is at most ``max_rel_stderr`` (the *target*); a window still noisier than that
  when the trial's time budget (``budget_s``) is spent is accepted too, with its measured
  stderr and ``noisy`` set: noise is information the strategies weigh, not a failure;
- ``extend(reason)``: stale data (no sample for ``max_age_s``), too few samples, or noise above
  the target, and the budget allows another window: the caller lengthens the window by
  ``window_s`` (the last extension is cut short at the budget) and asks again with
  ``extensions + 1``;
- ``fail(reason)``: at the budget nothing usable was measured: no sample after the warm-up,
  stale data (the job stopped reporting) or fewer than ``min_samples`` samples.

Noise: step samples are autocorrelated (data-loader hiccups, thermal and clock changes, other
jobs), so the plain standard error of the mean understates the uncertainty. We use
non-overlapping batch means with ``floor(sqrt(n))`` samples per batch (the usual consistent
choice, Flegal & Jones 2010), and report the larger of that and the plain SEM: with few batches
the batch-means estimate is itself noisy and can come out small by luck.

Defaults (:class:`MeasurementPolicy`): a 10 s warm-up, 20 s windows, a 3% target and a budget
of four windows (90 s). One sample per second gives 20 samples a window; a job whose steps
vary by 5-10% averages several steps per sample and reaches a 1-2% standard error in the first
window, so 8-12 trials take a few minutes on a quiet GPU node or a busy shared host alike. A
job noisier than that (a 2-core host shared with other work: 4-10% standard error after two
minutes) is extended three times, then accepted with its error: 90 s per trial at most, not
a failed study. 3% is the target because two configurations 10% apart are then told apart by
about 2.4 standard errors of their difference; the differences the tuner looks for (batch size,
sync period) are larger.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from tuneloop.errors import InvalidInput

# The estimate is the core's (the job actuator verifies changes on it too); a trial's verdict
# carries it, so the tuner's API names it as well.
from tuneloop.window_stats import WindowStats as WindowStats
from tuneloop.window_stats import window_stats as window_stats

VerdictAction: TypeAlias = Literal["accept", "wait", "extend", "fail"]


class MeasurementError(InvalidInput):
    """A measurement policy is invalid."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One measurement: ``t`` in seconds on the same clock as ``now`` (epoch seconds)."""

    t: float
    value: float


@dataclass(frozen=True, slots=True)
class MeasurementPolicy:
    """How long to measure a trial and when its window may end early.

    Each error names the field as the study's ``measurement`` object spells it."""

    warmup_s: float = 10.0
    """Samples earlier than ``window_start + warmup_s`` are discarded (caches, the data loader
    and the allocator settling after a config change)."""
    warmup_samples: int = 0
    """Further samples to discard after the warm-up time (e.g. the first steps after a
    checkpoint restore, or a compilation longer than the warm-up)."""
    window_s: float = 20.0
    """Measurement time after the warm-up; each extension adds this much again."""
    min_samples: int = 10
    """Fewer samples than this at the budget fail the trial (nothing usable was measured)."""
    max_rel_stderr: float = 0.03
    """The target: a window whose standard error relative to the mean is at most this ends
    early and is accepted; a noisier one is extended, and accepted with its error (``noisy``)
    once the budget is spent. Not a pass/fail line."""
    max_age_s: float = 60.0
    """Data is stale when the newest sample is older than this at judging time."""
    max_extensions: int = 3
    """Windows that may follow the first. With ``budget_s`` given it is derived from the
    budget (the last extension is cut short at it)."""
    budget_s: float | None = None
    """The most time one trial may be measured (warm-up plus window plus extensions); ``None``:
    ``warmup_s + window_s * (1 + max_extensions)``. At least one window (``warmup_s +
    window_s``)."""

    def __post_init__(self) -> None:
        for name in ("warmup_s", "window_s", "max_age_s", "max_rel_stderr"):
            _check_number(name, getattr(self, name))
        for name in ("window_s", "max_age_s", "max_rel_stderr"):
            if getattr(self, name) <= 0:
                raise MeasurementError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.min_samples < 4:
            raise MeasurementError(
                f"min_samples must be >= 4 (two batches of two), got {self.min_samples}"
            )
        if self.warmup_samples < 0:
            raise MeasurementError(f"warmup_samples must be >= 0, got {self.warmup_samples}")
        if self.max_extensions < 0:
            raise MeasurementError(f"max_extensions must be >= 0, got {self.max_extensions}")
        if self.budget_s is None:
            return
        _check_number("budget_s", self.budget_s)
        one_window = self.warmup_s + self.window_s
        if self.budget_s < one_window:
            raise MeasurementError(
                f"budget_s must be at least warmup_s + window_s = {one_window:g} s (one "
                f"window), got {self.budget_s:g}"
            )
        # Extensions the budget holds, the last one possibly cut short: what the loop counts.
        extra = (self.budget_s - one_window) / self.window_s
        object.__setattr__(self, "max_extensions", math.ceil(extra - 1e-9))

    @property
    def budget(self) -> float:
        """Seconds one trial may be measured, warm-up included."""
        if self.budget_s is not None:
            return float(self.budget_s)
        return self.warmup_s + self.window_s * (1 + self.max_extensions)

    def window_end(self, window_start: float, extensions: int) -> float:
        """When the window ends after ``extensions`` extensions; never past the budget."""
        length = self.warmup_s + self.window_s * (1 + extensions)
        return window_start + min(length, self.budget)

    def at_budget(self, extensions: int) -> bool:
        """Whether the window after ``extensions`` extensions is the last one."""
        return extensions >= self.max_extensions


def _check_number(name: str, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise MeasurementError(f"{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class TrialVerdict:
    """``noisy``: an accepted value whose window never reached the target (``reason`` says
    how noisy); its ``stderr`` tells the strategies how much it counts."""

    action: VerdictAction
    value: float | None = None
    stderr: float | None = None
    reason: str = ""
    stats: WindowStats | None = None
    noisy: bool = False

    @classmethod
    def accept(
        cls, value: float, stderr: float, stats: WindowStats | None = None, *, noisy: str = ""
    ) -> TrialVerdict:
        """``noisy``: why the value is accepted above the target (empty when it is not)."""
        if not (math.isfinite(value) and math.isfinite(stderr)):
            raise MeasurementError(f"an accepted value must be finite, got {value}, {stderr}")
        return cls("accept", float(value), float(stderr), noisy, stats, bool(noisy))

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

    last = policy.at_budget(extensions)
    unusable = _unusable_reason(stats, now, policy)
    if unusable is not None:
        if last:
            return TrialVerdict.fail(f"gave up after {extensions} extensions: {unusable}", stats)
        return TrialVerdict.extend(unusable, stats)
    if stats.rel_stderr <= policy.max_rel_stderr:
        return TrialVerdict.accept(stats.mean, stats.stderr, stats)
    noise = f"relative stderr {stats.rel_stderr:.1%} > target {policy.max_rel_stderr:.1%}"
    if not last:
        return TrialVerdict.extend(f"noise too high: {noise}", stats)
    spent = f"after the {policy.budget:g} s budget (measurement.budget_s)"
    return TrialVerdict.accept(
        stats.mean, stats.stderr, stats, noisy=f"noisy, accepted {spent}: {noise}"
    )


def _unusable_reason(stats: WindowStats, now: float, policy: MeasurementPolicy) -> str | None:
    """Why the window holds no usable value yet (``None`` when it does, noisy or not)."""
    if stats.last_t is None:
        extra = f" ({stats.dropped} non-finite dropped)" if stats.dropped else ""
        return f"stale: no samples after warm-up{extra}"
    age = now - stats.last_t
    if age > policy.max_age_s:
        return f"stale: newest sample is {age:.0f} s old (max {policy.max_age_s:.0f} s)"
    if stats.n < policy.min_samples:
        return f"too few samples: {stats.n} < {policy.min_samples}"
    return None
