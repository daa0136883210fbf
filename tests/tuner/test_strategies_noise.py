"""Strategies weigh each trial by its stderr: noisy trials count for less, and the configuration
a study keeps is not the one a lucky noisy trial measured."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pytest

from tuner.space import SearchSpace
from tuner.strategies import BayesianOptimization, Observation, best_estimate

POW2 = SearchSpace.training((8, 1024), (1, 16), lr_scaling=None)


def peaked(config: Mapping[str, object]) -> float:
    """A smooth surface in (log2 batch, log2 sync period) with its top at (128, 4)."""
    b = math.log2(int(config["batch_size"]))  # type: ignore[call-overload]
    k = math.log2(int(config["sync_period"]))  # type: ignore[call-overload]
    return 1000.0 * math.exp(-((b - 7.0) ** 2) / 8.0 - ((k - 2.0) ** 2) / 4.0)


def noise_of(config: Mapping[str, object]) -> float:
    """Heteroscedastic relative noise: small batches (a slow, contended data loader) are 40%
    noisy, the rest 3%."""
    return 0.4 if int(config["batch_size"]) <= 32 else 0.03  # type: ignore[call-overload]


def surface_history() -> list[Observation]:
    configs = [
        {"batch_size": b, "sync_period": k}
        for b, k in [(8, 1), (32, 16), (128, 1), (512, 4), (1024, 16), (64, 2), (256, 8)]
    ]
    return [
        Observation(i, c, "complete", value=peaked(c), stderr=0.02 * peaked(c))
        for i, c in enumerate(configs)
    ]


@pytest.mark.parametrize(("log_values", "at_most"), [(True, 0.1), (False, 0.8)])
def test_a_noisy_trial_moves_the_posterior_less_than_a_precise_one(
    log_values: bool, at_most: float
) -> None:
    # A repeat of a measured configuration that comes out 30% higher, told as precise (1%)
    # or as noisy (30%). The learned white noise is the floor of every trial's noise, and it
    # grows when precise trials disagree: on linear values, where the surface fits less well,
    # the precise repeat counts for less than its stated error and the gap is smaller.
    point = {"batch_size": 128, "sync_period": 1}
    surprise = 1.3 * peaked(point)
    before, _ = BayesianOptimization(POW2, seed=0, log_values=log_values).posterior(
        surface_history(), [point]
    )
    moved: dict[str, float] = {}
    for label, rel in (("precise", 0.01), ("noisy", 0.3)):
        bo = BayesianOptimization(POW2, seed=0, log_values=log_values)
        history = [
            *surface_history(),
            Observation(7, point, "complete", value=surprise, stderr=rel * surprise),
        ]
        after, _ = bo.posterior(history, [point])
        moved[label] = float(after[0] - before[0])
    assert moved["precise"] > 0 and moved["noisy"] >= 0, moved
    assert moved["noisy"] < at_most * moved["precise"], moved


def test_bo_finds_the_optimum_under_heteroscedastic_noise() -> None:
    top = max(peaked(c) for c in POW2.grid(None))
    kept: list[float] = []
    for seed in range(5):
        rng = np.random.default_rng(100 + seed)
        bo = BayesianOptimization(POW2, seed=seed)
        history: list[Observation] = []
        for number in range(15):
            config = bo.ask(history)
            rel = noise_of(config)
            value = peaked(config) * max(0.05, 1 + rel * rng.standard_normal())
            history.append(Observation(number, config, "complete", value=value, stderr=rel * value))
        best = best_estimate(history, "maximize")
        assert best is not None
        kept.append(peaked(best.config) / top)
    assert float(np.median(kept)) >= 0.95, kept
    assert min(kept) >= 0.8, kept


def test_the_best_estimate_is_not_fooled_by_one_lucky_noisy_trial() -> None:
    precise = {"batch_size": 64, "sync_period": 1}
    noisy = {"batch_size": 8, "sync_period": 1}
    history = [
        Observation(1, precise, "complete", value=100.0, stderr=2.0),
        Observation(2, noisy, "complete", value=115.0, stderr=40.0),
    ]
    best = best_estimate(history, "maximize")
    assert best is not None and dict(best.config) == precise
    # A noisy trial that beats the precise one by more than its error bar wins.
    clear = [*history[:1], Observation(2, noisy, "complete", value=250.0, stderr=40.0)]
    assert dict(best_estimate(clear, "maximize").config) == noisy  # type: ignore[union-attr]


def test_the_best_estimate_pools_repeats_by_their_stderr() -> None:
    config = {"batch_size": 64, "sync_period": 1}
    history = [
        Observation(1, config, "complete", value=100.0, stderr=1.0),
        Observation(2, config, "complete", value=130.0, stderr=3.0),
        Observation(3, {"batch_size": 8, "sync_period": 1}, "failed"),
    ]
    best = best_estimate(history, "minimize")
    assert best is not None and best.trials == (1, 2)
    assert best.value == pytest.approx((100.0 + 130.0 / 9) / (1 + 1 / 9))
    assert best.stderr == pytest.approx(1 / math.sqrt(1 + 1 / 9))
    assert best_estimate(history[2:], "maximize") is None


def test_without_stderr_the_best_estimate_is_the_best_value() -> None:
    history = [
        Observation(n, {"batch_size": b, "sync_period": 1}, "complete", value=v)
        for n, (b, v) in enumerate([(8, 5.0), (16, 9.0), (32, 7.0)])
    ]
    best = best_estimate(history, "maximize")
    assert best is not None and best.config["batch_size"] == 16 and best.stderr == 0.0
