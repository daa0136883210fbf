"""The demo's statistics: t intervals of a mean, Welch's interval of a difference."""

from __future__ import annotations

import math

import pytest

from tuneloop.demo.stats import mean_interval, welch_faster


def test_mean_interval_is_the_t_interval() -> None:
    interval = mean_interval([1.0, 2.0, 3.0, 4.0])
    # mean 2.5, s = 1.291, t(0.975, 3) = 3.182: half-width 3.182 * 1.291 / 2 = 2.054
    assert interval.mean == 2.5
    assert interval.half_width == pytest.approx(2.054, abs=1e-3)
    assert interval.fmt("s", 2) == "2.50 +- 2.05 s"


def test_mean_interval_of_one_and_of_none() -> None:
    assert mean_interval([3.0]).half_width == 0
    empty = mean_interval([])
    assert empty.n == 0 and math.isnan(empty.mean)
    assert empty.fmt("s", 2) == "n/a"


def test_welch_tells_a_clear_difference_from_noise() -> None:
    clear = welch_faster([2.0, 2.1, 1.9, 2.0], [4.0, 4.2, 3.9, 4.1])
    assert clear.difference == pytest.approx(2.05)
    assert clear.significant and clear.low > 0

    noisy = welch_faster([2.0, 3.5, 1.0, 2.8], [2.5, 4.0, 1.5, 3.0])
    assert not noisy.significant

    slower = welch_faster([4.0, 4.2, 3.9, 4.1], [2.0, 2.1, 1.9, 2.0])
    assert slower.significant and slower.high < 0


def test_welch_needs_two_runs_a_side() -> None:
    with pytest.raises(ValueError, match="two runs"):
        welch_faster([1.0], [1.0, 2.0])
