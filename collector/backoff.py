"""Exponential backoff with jitter, shared by every retry loop of the collector (the store
retries of the pipeline, the source retries of the runner), as the OpenTelemetry Collector keeps
its retry policy in one helper rather than in each exporter."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

_MAX_EXPONENT = 64
"""Past this many doublings every delay is the cap anyway; also keeps ``**`` from overflowing."""


@dataclass(slots=True)
class Backoff:
    """Delays of ``initial_s * multiplier**n``, capped at ``max_s``, each shortened by up to
    ``jitter`` (a fraction) at random so that many clients retrying the same outage spread out
    instead of reconnecting in lockstep."""

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
        """The delay before the next attempt; each call counts one more failure."""
        exponent = min(self.attempts, _MAX_EXPONENT)
        self.attempts += 1
        delay = min(self.max_s, self.initial_s * self.multiplier**exponent)
        # Jitter, not security: the default generator is the right tool.
        return delay * (1.0 - self.jitter * random.random())  # noqa: S311

    def reset(self) -> None:
        """Back to the first delay (after a success)."""
        self.attempts = 0
