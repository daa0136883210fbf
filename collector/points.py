"""The unit every source emits, and how points and batches are counted and grouped for the
pipeline."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter

from tuneloop.storage.timeseries.columns import Batch, sample_count
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind


@dataclass(frozen=True, slots=True)
class Point:
    metric: str
    labels: Mapping[str, str]
    ts: datetime
    value: float
    kind: SeriesKind = SeriesKind.GAUGE


def to_batches(points: Iterable[Point]) -> list[SeriesBatch]:
    """Group points by (metric, labels) into one batch per series, keeping arrival order."""
    grouped: dict[tuple[str, tuple[tuple[str, str], ...]], list[Point]] = {}
    for point in points:
        key = (point.metric, tuple(sorted(point.labels.items())))
        grouped.setdefault(key, []).append(point)
    return [
        SeriesBatch(
            members[0].metric,
            dict(members[0].labels),
            [point.ts for point in members],
            [point.value for point in members],
            members[0].kind,
        )
        for members in grouped.values()
    ]


_VALUES = attrgetter("values")
_TIMESTAMPS = attrgetter("timestamps")


def samples_in(batches: Sequence[Batch]) -> int:
    # In C: a receiver hands over a batch per series, often of one sample each.
    try:
        return sum(map(max, map(len, map(_VALUES, batches)), map(len, map(_TIMESTAMPS, batches))))
    except (TypeError, AttributeError):  # a batch without lengths, or a block: one by one
        pass
    return sum(map(sample_count, batches))
