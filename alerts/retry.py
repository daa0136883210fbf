"""When to try a notification again (pure)."""

from __future__ import annotations

from collections.abc import Callable

BASE_S = 1.0
CAP_S = 300.0


def backoff_s(
    attempts: int,
    *,
    retry_after_s: float | None = None,
    rng: Callable[[], float],
    base_s: float = BASE_S,
    cap_s: float = CAP_S,
) -> float:
    """Exponential backoff with jitter after ``attempts`` failed attempts: between half and
    all of ``base * 2**(attempts - 1)`` (capped), so receivers that failed together do not all
    come back at once; never sooner than the receiver's ``Retry-After``."""
    ceiling = min(cap_s, base_s * 2.0 ** max(0, attempts - 1))
    delay = ceiling / 2 + rng() * ceiling / 2
    return float(max(delay, retry_after_s or 0.0))
