"""The checks every range read makes before it reads: a valid range, step and aggregation,
and no more points per series than Prometheus allows."""

from __future__ import annotations

from datetime import datetime

from tuneloop.storage.timeseries.types import Aggregation
from tuneloop.storage.types import to_micros

MAX_POINTS_PER_SERIES = 11_000
"""Prometheus' limit: more points than a screen has pixels is a mistake, not a query."""


def check_query(
    start: datetime, end: datetime, step_s: int, aggregation: Aggregation, q: float | None
) -> None:
    """Raise ``ValueError`` unless ``query_range`` can answer this range and aggregation
    (``q`` given for a quantile and only for it)."""
    check_range(start, end, step_s)
    if aggregation is Aggregation.QUANTILE:
        if q is None or not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile needs q in [0, 1], got {q}")
    elif q is not None:
        raise ValueError(f"q is only meaningful for quantile, not {aggregation.value}")


def check_range(start: datetime, end: datetime, step_s: int) -> None:
    """Raise ``ValueError`` unless ``[start, end)`` at ``step_s`` is a valid range query of
    at most :data:`MAX_POINTS_PER_SERIES` points per series."""
    check_aware(start, end)
    if end <= start:
        raise ValueError(f"end {end.isoformat()} must be after start {start.isoformat()}")
    if step_s <= 0:
        raise ValueError(f"step_s must be a positive number of seconds, got {step_s}")
    step_us = step_s * 1_000_000
    points = (to_micros(end) - 1) // step_us - to_micros(start) // step_us + 1
    if points > MAX_POINTS_PER_SERIES:
        raise ValueError(
            f"the range and step give {points} points per series, more than "
            f"{MAX_POINTS_PER_SERIES}; use a larger step or a shorter range"
        )


def check_aware(*values: datetime) -> None:
    if any(value.tzinfo is None for value in values):
        raise ValueError("naive datetime: tuneloop timestamps must be timezone-aware")
