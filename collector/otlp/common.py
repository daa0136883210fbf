"""What the metric and trace mappings share: per-point rejection, time bounds, and the
builder that groups samples into one :class:`SeriesBatch` per series under a series cap."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final

from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind

if TYPE_CHECKING:
    from collector.otlp.series_cache import KnownSeries, SeriesKey

EARLIEST: Final = datetime(2000, 1, 1, tzinfo=UTC)
"""Samples before this are refused: a zero or garbage clock, not history worth keeping."""
MAX_FUTURE: Final = timedelta(days=1)
"""Samples further ahead of the receiver's clock are refused."""
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


class Rejected(Exception):
    """One data point (or span) refused; ``reason`` is a stable word for counting."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(slots=True)
class Rejections:
    """Rejected points by reason, with the first message of each reason as an example."""

    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)

    def add(self, reason: str, message: str, points: int = 1) -> None:
        self.counts[reason] += points
        self.examples.setdefault(reason, message)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def summary(self, noun: str) -> str:
        """One line for ``partial_success.error_message``: each reason, its count, an example."""
        parts = [
            f"{reason} x{count} (e.g. {self.examples[reason]})"
            for reason, count in sorted(self.counts.items())
        ]
        return f"rejected {self.total} {noun}: " + "; ".join(parts)


def to_datetime(unix_nanos: int, now: datetime, what: str = "time_unix_nano") -> datetime:
    """``unix_nanos`` as an aware datetime (microsecond precision), refused (``Rejected``)
    before :data:`EARLIEST` or more than :data:`MAX_FUTURE` after ``now``."""
    try:
        ts = _EPOCH + timedelta(microseconds=unix_nanos // 1_000)
    except OverflowError:
        ts = datetime.max.replace(tzinfo=UTC)
    if ts < EARLIEST or ts > now + MAX_FUTURE:
        raise Rejected(
            "timestamp_out_of_range",
            f"{what} {unix_nanos} is before 2000 or more than a day in the future",
        )
    return ts


def check_finite(value: float, what: str) -> float:
    if not math.isfinite(value):
        raise Rejected("non_finite_value", f"{what} is {value}: NaN and infinities are refused")
    return value


@dataclass(frozen=True, slots=True)
class Sample:
    metric: str
    labels: Mapping[str, str]
    kind: SeriesKind
    ts: datetime
    value: float


class SeriesBuilder:
    """Groups samples into one batch per series; refuses a point whose samples would take the
    number of series past ``max_series``."""

    def __init__(self, max_series: int) -> None:
        self.max_series = max_series
        self._series: dict[SeriesKey, SeriesBatch] = {}
        self.lists_of: dict[KnownSeries, tuple[list[datetime], list[float]]] = {}
        """The timestamps and values of each batch by the KnownSeries (compared by identity)
        that fed it: the fast path's lookup, which never hashes labels."""

    def add_point(self, samples: Sequence[Sample]) -> None:
        """Add all of ``samples`` (one data point's worth) or none of them (``Rejected``)."""
        keys = [(s.metric, tuple(sorted(s.labels.items()))) for s in samples]
        new = {key for key in keys if key not in self._series}
        if len(self._series) + len(new) > self.max_series:
            raise Rejected(
                "too_many_series",
                f"the request would create more than {self.max_series} series",
            )
        for key, sample in zip(keys, samples, strict=True):
            batch = self._series.get(key)
            if batch is None:
                batch = SeriesBatch(sample.metric, dict(sample.labels), [], [], sample.kind)
                self._series[key] = batch
            assert isinstance(batch.timestamps, list) and isinstance(batch.values, list)
            batch.timestamps.append(sample.ts)
            batch.values.append(sample.value)

    def lists(self, series: KnownSeries, kind: SeriesKind) -> tuple[list[datetime], list[float]]:
        """:meth:`add_point` for the points of a series whose labels were computed before
        (metric ``series.key[0]``, one sample a point): the timestamps and values of its batch,
        made if needed (``Rejected`` past the cap), to append to; :attr:`lists_of` then has
        them. The same grouping and the same cap as :meth:`add_point`."""
        timestamps: list[datetime] = []
        values: list[float] = []
        # The labels are shared with the cache: batches are never changed downstream.
        new = SeriesBatch(series.key[0], series.labels, timestamps, values, kind)
        size = len(self._series)
        # setdefault hashes the key (a tuple: its hash is not cached) once, not twice; the
        # batch made for nothing when the series is there already is the rare case.
        batch = self._series.setdefault(series.key, new)
        if batch is new:
            if size >= self.max_series:
                del self._series[series.key]
                raise Rejected(
                    "too_many_series",
                    f"the request would create more than {self.max_series} series",
                )
        else:
            assert isinstance(batch.timestamps, list) and isinstance(batch.values, list)
            timestamps, values = batch.timestamps, batch.values
        lists = self.lists_of[series] = (timestamps, values)
        return lists

    def batches(self) -> list[SeriesBatch]:
        return list(self._series.values())

    @property
    def samples(self) -> int:
        return sum(len(batch.values) for batch in self._series.values())
