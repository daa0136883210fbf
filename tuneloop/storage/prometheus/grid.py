"""Where the Prometheus backend evaluates PromQL so that its points are the store's: bucket
``[b, b + step)`` is read by a window ending at ``b + step`` (1 ms before it, see
:data:`~tuneloop.storage.prometheus.queries.EDGE_SHIFT`) and labelled ``b``. All times here are
milliseconds since the epoch."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from tuneloop.storage.timeseries.query_checks import check_range
from tuneloop.storage.types import from_micros, to_micros


def _ceil_millis(when: datetime) -> int:
    """The first whole millisecond at or after ``when``: a sample in ``[start, end)`` has its
    millisecond in ``[ceil(start), ceil(end))``."""
    return -(-to_micros(when) // 1000)


@dataclass(frozen=True, slots=True)
class Edge:
    """A bucket that ``[start, end)`` cuts: one instant query over its part of the range."""

    label_ms: int
    eval_ms: int
    window_ms: int


@dataclass(frozen=True, slots=True)
class Buckets:
    """The buckets of a range query: those wholly inside ``[start, end)`` (one range query,
    evaluated from ``full[0]`` to ``full[1]``) and the at most two cut at its ends."""

    step_ms: int
    full: tuple[int, int] | None
    edges: tuple[Edge, ...]

    @classmethod
    def of(cls, start: datetime, end: datetime, step_s: int) -> Buckets:
        check_range(start, end, step_s)
        step_ms = step_s * 1000
        start_ms, end_ms = _ceil_millis(start), _ceil_millis(end)
        first = to_micros(start) // (step_ms * 1000) * step_ms
        last = (to_micros(end) - 1) // (step_ms * 1000) * step_ms
        first_full = -(-start_ms // step_ms) * step_ms
        last_full = end_ms // step_ms * step_ms - step_ms
        full = (first_full + step_ms, last_full + step_ms) if first_full <= last_full else None
        edges = []
        for bucket in sorted({first, last}):
            low, high = max(bucket, start_ms), min(bucket + step_ms, end_ms)
            if (low, high) != (bucket, bucket + step_ms) and high > low:
                edges.append(Edge(label_ms=bucket, eval_ms=high, window_ms=high - low))
        return cls(step_ms, full, tuple(edges))


@dataclass(frozen=True, slots=True)
class Windows:
    """The points of a counter function: one per bucket from the one holding ``start`` to the
    one holding the last instant before ``end``, each over ``[b + step - window, b + step)``."""

    step_s: int
    window_s: int
    evaluations: tuple[int, int]
    """First and last evaluation time: each point's bucket end."""

    @classmethod
    def of(cls, start: datetime, end: datetime, step_s: int, window_s: int | None) -> Windows:
        check_range(start, end, step_s)
        window_s = step_s if window_s is None else window_s
        if window_s <= 0:
            raise ValueError(f"window_s must be a positive number of seconds, got {window_s}")
        step_us = step_s * 1_000_000
        first = to_micros(start) // step_us * step_us // 1000
        last = (to_micros(end) - 1) // step_us * step_us // 1000
        return cls(step_s, window_s, (first + step_s * 1000, last + step_s * 1000))

    @property
    def read_from(self) -> datetime:
        return from_micros((self.evaluations[0] - self.window_s * 1000) * 1000)

    @property
    def read_to(self) -> datetime:
        return from_micros(self.evaluations[1] * 1000)
