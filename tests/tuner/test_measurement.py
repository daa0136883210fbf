"""Measurement windows: statistics and the accept / wait / extend / fail verdicts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tuner.measurement import (
    MeasurementError,
    MeasurementPolicy,
    Sample,
    TrialVerdict,
    judge_window,
    window_stats,
)

POLICY = MeasurementPolicy(
    warmup_s=10.0,
    window_s=30.0,
    min_samples=20,
    max_rel_stderr=0.02,
    max_age_s=5.0,
    max_extensions=2,
)
END = 40.0  # window_start 0 + warm-up 10 + window 30


def steady(
    n: int = 30, start: float = 10.0, step: float = 1.0, level: float = 100.0, wobble: float = 0.5
) -> list[Sample]:
    """Alternating +/- wobble around a level: tiny noise, exactly the level on average."""
    return [Sample(start + i * step, level + (wobble if i % 2 else -wobble)) for i in range(n)]


def noisy(
    n: int, sd: float, seed: int = 0, start: float = 10.0, span: float = 30.0
) -> list[Sample]:
    rng = np.random.default_rng(seed)
    return [Sample(start + i * span / n, 100.0 + sd * rng.standard_normal()) for i in range(n)]


@pytest.mark.parametrize(
    ("case", "samples", "now", "extensions", "action", "reason"),
    [
        ("window not over", steady(), 39.0, 0, "wait", "window ends in 1 s"),
        ("extended window not over", steady(), 50.0, 1, "wait", "window ends in 20 s"),
        ("steady", steady(), END, 0, "accept", ""),
        ("no samples", [], END, 0, "extend", "stale: no samples after warm-up"),
        ("only warm-up samples", steady(start=0.0, n=10), END, 0, "extend", "stale: no samples"),
        (
            "agent went silent",
            steady(n=25),
            END + 10,
            0,
            "extend",
            "stale: newest sample is 16 s old (max 5 s)",
        ),
        ("too few", steady(n=12, step=2.5), END, 0, "extend", "too few samples: 12 < 20"),
        ("noisy", noisy(30, sd=30.0), END, 0, "extend", "noise too high: relative stderr"),
        (
            "noisy, at the budget",
            noisy(90, sd=60.0, span=90.0),
            END + 60,
            2,
            "accept",
            "noisy, accepted after the 100 s budget (measurement.budget_s): relative stderr",
        ),
        (
            "too few at the budget",
            steady(n=18, step=5.0),
            END + 60,
            2,
            "fail",
            "gave up after 2 extensions: too few samples: 18 < 20",
        ),
        ("stale, out of extensions", [], END + 60, 2, "fail", "gave up after 2 extensions: stale"),
        (
            "NaN only",
            [Sample(20.0, math.nan)] * 25,
            END,
            0,
            "extend",
            "stale: no samples after warm-up (25 non-finite dropped)",
        ),
    ],
)
def test_verdicts(case, samples, now, extensions, action, reason) -> None:
    verdict = judge_window(samples, window_start=0.0, now=now, extensions=extensions, policy=POLICY)
    assert verdict.action == action, case
    assert reason in verdict.reason, case
    if action == "accept":
        assert verdict.value == pytest.approx(100.0, abs=0.5 if case == "steady" else 15.0)
        assert verdict.stderr is not None and verdict.stderr > 0
        assert verdict.noisy == (case != "steady")
    else:
        assert verdict.value is None and verdict.stderr is None


def test_nan_samples_are_dropped_not_averaged() -> None:
    samples = [*steady(), Sample(25.5, math.nan), Sample(26.5, math.inf)]
    verdict = judge_window(samples, window_start=0.0, now=END, policy=POLICY)
    assert verdict.action == "accept"
    assert verdict.stats is not None and verdict.stats.dropped == 2
    assert verdict.value == pytest.approx(100.0, abs=0.5)


def test_warmup_samples_are_excluded() -> None:
    # A slow first minute (compilation) must not drag the value down.
    samples = [Sample(float(t), 10.0) for t in range(10)] + steady()
    verdict = judge_window(samples, window_start=0.0, now=END, policy=POLICY)
    assert verdict.action == "accept"
    assert verdict.value == pytest.approx(100.0, abs=0.5)
    skip = MeasurementPolicy(
        warmup_s=10.0, window_s=30.0, min_samples=20, max_age_s=5.0, warmup_samples=5
    )
    verdict = judge_window(samples, window_start=0.0, now=END, policy=skip)
    assert verdict.stats is not None and verdict.stats.n == 25


def test_extension_adds_samples_until_the_noise_is_low_enough() -> None:
    rng = np.random.default_rng(1)
    samples = [Sample(10.0 + i * 0.1, 100.0 + 40.0 * rng.standard_normal()) for i in range(1200)]
    first = [s for s in samples if s.t < END]
    assert judge_window(first, window_start=0.0, now=END, policy=POLICY).action == "extend"
    # Three more windows of samples: stderr shrinks by about sqrt(4).
    verdict = judge_window(samples, window_start=0.0, now=130.0, extensions=2, policy=POLICY)
    assert verdict.action == "accept"


def test_batch_means_see_autocorrelation_that_the_plain_sem_misses() -> None:
    # A slow drift (strongly autocorrelated samples): batch means report a larger stderr.
    values = [100.0 + 5.0 * math.sin(i / 15.0) for i in range(400)]
    stats = window_stats(values)
    plain_sem = float(np.std(values, ddof=1)) / math.sqrt(len(values))
    assert stats.batch_len == 20 and stats.n_batches == 20
    assert stats.stderr > 3 * plain_sem


@pytest.mark.parametrize(
    ("values", "n", "rel"),
    [([], 0, math.inf), ([5.0, 5.0], 2, math.inf), ([0.0] * 10, 10, 0.0), ([7.0] * 9, 9, 0.0)],
)
def test_window_stats_edge_cases(values, n, rel) -> None:
    stats = window_stats(values)
    assert stats.n == n
    assert stats.rel_stderr == rel


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_samples": 3},
        {"window_s": 0.0},
        {"max_rel_stderr": -0.1},
        {"warmup_s": math.nan},
        {"max_extensions": -1},
        {"budget_s": math.inf},
    ],
)
def test_bad_policies_are_refused(kwargs) -> None:
    with pytest.raises(MeasurementError):
        MeasurementPolicy(**kwargs)


def test_a_budget_below_one_window_is_refused_naming_it() -> None:
    with pytest.raises(
        MeasurementError, match=r"^budget_s must be at least warmup_s \+ window_s = 40 s"
    ):
        MeasurementPolicy(warmup_s=10.0, window_s=30.0, budget_s=39.0)
    assert MeasurementPolicy(warmup_s=10.0, window_s=30.0, budget_s=40.0).max_extensions == 0


def test_the_budget_caps_the_window_and_sets_the_extensions() -> None:
    default = MeasurementPolicy()
    assert default.budget == default.warmup_s + default.window_s * (1 + default.max_extensions)
    # 10 s warm-up + 30 s window + 1.5 windows: two extensions, the second cut short.
    policy = MeasurementPolicy(warmup_s=10.0, window_s=30.0, budget_s=85.0)
    assert policy.max_extensions == 2
    assert [policy.window_end(0.0, e) for e in range(3)] == [40.0, 70.0, 85.0]
    assert not policy.at_budget(1) and policy.at_budget(2)
    rng = np.random.default_rng(3)
    samples = [Sample(10.0 + i * 0.25, 100.0 + 100.0 * rng.standard_normal()) for i in range(300)]
    extended = judge_window(samples, window_start=0.0, now=70.0, extensions=1, policy=policy)
    assert extended.action == "extend"
    verdict = judge_window(samples, window_start=0.0, now=85.0, extensions=2, policy=policy)
    assert verdict.action == "accept" and verdict.noisy
    assert verdict.stats is not None and verdict.stderr == verdict.stats.stderr
    assert "85 s budget" in verdict.reason


def test_a_quiet_job_ends_its_window_early_with_the_defaults() -> None:
    # One sample a second with 5-10% step-time noise: accepted after the first window.
    policy = MeasurementPolicy()
    rng = np.random.default_rng(0)
    end = policy.window_end(0.0, 0)
    samples = [
        Sample(float(t), 100.0 * (1 + 0.08 * rng.standard_normal()))
        for t in range(int(policy.warmup_s), int(end))
    ]
    verdict = judge_window(samples, window_start=0.0, now=end, policy=policy)
    assert verdict.action == "accept" and not verdict.noisy
    assert end <= 30.0 and policy.budget <= 90.0


def test_accept_refuses_non_finite_values() -> None:
    with pytest.raises(MeasurementError):
        TrialVerdict.accept(math.nan, 1.0)


def test_a_busy_host_s_noisy_job_is_accepted_at_the_budget_with_its_error() -> None:
    # A 2-core host shared with other work: slow swings (autocorrelated, 40% per sample) that
    # no affordable window brings under the target. Extended to the budget, then a value.
    policy = MeasurementPolicy()
    rng = np.random.default_rng(4)
    level, values = 0.0, []
    for _ in range(int(policy.budget)):
        level = 0.9 * level + 0.4 * rng.standard_normal()
        values.append(100.0 * (1 + 0.5 * level))
    samples = [Sample(float(t), v) for t, v in enumerate(values)]
    verdicts = [
        judge_window(
            samples,
            window_start=0.0,
            now=policy.window_end(0.0, e),
            extensions=e,
            policy=policy,
        )
        for e in range(policy.max_extensions + 1)
    ]
    assert [v.action for v in verdicts] == ["extend"] * policy.max_extensions + ["accept"]
    last = verdicts[-1]
    assert last.noisy and last.stats is not None
    assert last.stats.rel_stderr > policy.max_rel_stderr
    assert last.value == pytest.approx(float(np.mean(values[int(policy.warmup_s) :])))
