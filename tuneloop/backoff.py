"""Exponential backoff with jitter: the one retry policy of the collector's loops, the alert
dispatcher and the job-side agent's threads.

Shipped with the job-side agent (agent/pyproject.toml), so it imports nothing but the standard
library.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

_MAX_EXPONENT = 64
"""Past this many doublings every delay is the cap anyway; also keeps ``**`` from overflowing."""


def backoff_delay_s(
    failures: int,
    *,
    initial_s: float,
    max_s: float,
    multiplier: float = 2.0,
    jitter: float = 0.5,
    draw: Callable[[], float] = random.random,
) -> float:
    """The delay after ``failures`` failed attempts: ``initial_s * multiplier**(failures - 1)``,
    capped at ``max_s``, of which the last ``jitter`` fraction is drawn at random (``draw()``
    in [0, 1): 0 is the shortest delay, 1 the full one), so that clients that failed together
    do not all come back at once."""
    exponent = min(max(0, failures - 1), _MAX_EXPONENT)
    ceiling = min(max_s, initial_s * multiplier**exponent)
    return float(ceiling * (1.0 - jitter + jitter * draw()))


@dataclass(slots=True)
class Backoff:
    """The delays of one retry loop: each ``next_delay`` counts one more failure, ``reset``
    starts over after a success."""

    initial_s: float
    max_s: float
    multiplier: float = 2.0
    jitter: float = 0.5
    attempts: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.initial_s <= 0 or self.max_s < self.initial_s:
            raise ValueError(f"need 0 < initial_s <= max_s, got {self.initial_s}, {self.max_s}")
        if not 0 <= self.jitter < 1 or self.multiplier < 1:
            raise ValueError("need 0 <= jitter < 1 and multiplier >= 1")

    def next_delay(self) -> float:
        """The delay before the next attempt."""
        self.attempts += 1
        # Jitter, not security: the default generator is the right tool.
        return backoff_delay_s(
            self.attempts,
            initial_s=self.initial_s,
            max_s=self.max_s,
            multiplier=self.multiplier,
            jitter=self.jitter,
        )

    def reset(self) -> None:
        """Back to the first delay (after a success)."""
        self.attempts = 0
