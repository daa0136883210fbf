"""The gradient noise scale estimate from two batch sizes' squared gradient norms."""

from __future__ import annotations

import numpy as np
import pytest

from tuneloop.agent import GradientNoiseScale


def test_recovers_the_noise_scale_of_a_known_gradient_distribution() -> None:
    """Per-sample gradients G + noise with tr(S) = d * sigma^2: B_simple = tr(S) / |G|^2."""
    rng = np.random.default_rng(0)
    d, sigma = 50, 2.0
    true_grad = rng.normal(size=d)
    expected = d * sigma**2 / float(true_grad @ true_grad)
    b_small, world = 16, 4
    estimate = GradientNoiseScale(smoothing=0.999)
    for _ in range(3000):
        samples = true_grad + sigma * rng.normal(size=(world, b_small, d))
        local = samples.mean(axis=1)  # each rank's gradient over b_small samples
        sq_small = float((local**2).sum(axis=1).mean())
        sq_big = float((local.mean(axis=0) ** 2).sum())
        estimate.update(sq_small, sq_big, b_small, b_small * world)
    assert estimate.value == pytest.approx(expected, rel=0.15)


def test_nothing_before_data_and_bad_input() -> None:
    estimate = GradientNoiseScale()
    assert estimate.value is None
    estimate.update(float("nan"), 1.0, 8, 16)  # a diverged step is skipped
    assert estimate.updates == 0
    with pytest.raises(ValueError, match="b_big > b_small"):
        estimate.update(1.0, 1.0, 16, 16)
    with pytest.raises(ValueError, match="smoothing"):
        GradientNoiseScale(smoothing=1.0)
