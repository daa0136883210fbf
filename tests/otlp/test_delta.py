"""The delta -> cumulative accumulator's rules."""

from __future__ import annotations

import pytest

from collector.otlp.delta import DeltaAccumulator, OutOfOrder


def add(total: int, delta: int) -> int:
    return total + delta


def test_adds_in_order_repeats_a_retry_and_refuses_the_past() -> None:
    acc = DeltaAccumulator()
    assert acc.add("k", 0, 10, 5, add) == 5
    assert acc.add("k", 10, 20, 2, add) == 7
    assert acc.add("k", 10, 20, 2, add) == 7  # the same interval again: a retry
    assert acc.add("k", 30, 40, 1, add) == 8  # a gap
    assert acc.add("k", 0, 50, 1, add) == 9  # no start time (0): added when it ends later
    with pytest.raises(OutOfOrder):
        acc.add("k", 45, 60, 1, add)  # overlaps the last one
    with pytest.raises(OutOfOrder):
        acc.add("k", 10, 20, 2, add)  # an older interval, no longer the last


def test_incompatible_deltas_start_the_series_again() -> None:
    acc = DeltaAccumulator()
    acc.add("k", 0, 10, 5, add)
    assert acc.add("k", 10, 20, 3, lambda total, delta: None) == 3


def test_keys_are_independent_and_the_least_recently_updated_is_dropped() -> None:
    acc = DeltaAccumulator(max_series=2)
    acc.add("a", 0, 10, 1, add)
    acc.add("b", 0, 10, 1, add)
    acc.add("a", 10, 20, 1, add)
    acc.add("c", 0, 10, 1, add)  # drops "b"
    assert len(acc) == 2
    assert acc.add("b", 10, 20, 1, add) == 1  # starts again, as after a restart; drops "a"
    assert acc.add("c", 10, 20, 1, add) == 2
    assert acc.add("a", 20, 30, 1, add) == 1


def test_max_series_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_series"):
        DeltaAccumulator(max_series=0)
