"""The one backoff: delays double from the first to the cap, each jittered down by at most
its jitter fraction, and a success starts over."""

from __future__ import annotations

import pytest

from tuneloop.backoff import Backoff, backoff_delay_s


def test_delays_double_to_the_cap_and_the_draw_picks_within_the_jitter() -> None:
    full = [backoff_delay_s(n, initial_s=1, max_s=300, draw=lambda: 1.0) for n in range(1, 11)]
    assert full == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]
    shortest = [backoff_delay_s(n, initial_s=1, max_s=300, draw=lambda: 0.0) for n in (1, 2, 10)]
    assert shortest == [0.5, 1, 150]
    assert backoff_delay_s(0, initial_s=1, max_s=300, draw=lambda: 1.0) == 1  # never below one
    assert backoff_delay_s(10_000, initial_s=1, max_s=300, draw=lambda: 1.0) == 300


def test_a_retry_loop_counts_failures_and_starts_over_after_a_success() -> None:
    backoff = Backoff(0.5, 30.0)
    delays = [backoff.next_delay() for _ in range(8)]
    for failures, delay in enumerate(delays, start=1):
        ceiling = min(30.0, 0.5 * 2 ** (failures - 1))
        assert ceiling / 2 <= delay <= ceiling
    backoff.reset()
    assert backoff.next_delay() <= 0.5


@pytest.mark.parametrize(
    ("initial_s", "max_s", "jitter"), [(0, 1, 0.5), (2, 1, 0.5), (1, 2, 1.0), (1, 2, -0.1)]
)
def test_bad_numbers_are_refused(initial_s: float, max_s: float, jitter: float) -> None:
    with pytest.raises(ValueError, match="need"):
        Backoff(initial_s, max_s, jitter=jitter)
