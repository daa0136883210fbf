"""The engine's samples from any series backend: the built-in store or a Prometheus-compatible
TSDB, through the contract's raw reads, so one engine answers PromQL on either."""

from __future__ import annotations

from collections.abc import Sequence

from tuneloop.promql.values import SampleSource
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.timeseries.raw import RawSeries
from tuneloop.storage.timeseries.types import Matcher


class BackendSource:
    """One project's samples in ``backend``, as :class:`~tuneloop.promql.SampleSource`;
    a read of more than ``max_series`` series is refused before its samples are loaded (in
    the store) or kept (in a TSDB)."""

    def __init__(
        self, backend: TimeSeriesBackend, project_id: int, *, max_series: int | None = None
    ) -> None:
        self.backend = backend
        self.project_id = project_id
        self.max_series = max_series

    def count(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, limit: int) -> int:
        return self.backend.count_raw(self.project_id, matchers, start_ms, end_ms, limit)

    def read(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[RawSeries]:
        return self.backend.read_raw(
            self.project_id, matchers, start_ms, end_ms, max_series=self.max_series
        )


class NewestSampleTracker:
    """A sample source that remembers the time of the newest sample it gave the engine: PromQL's
    lookback keeps a stopped series' last value for minutes, so callers that judge freshness
    (the autoscaler's signals, the tuner's PromQL objective) ask this instead."""

    def __init__(self, inner: SampleSource) -> None:
        self.inner = inner
        self.newest_ms: int | None = None

    def count(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, limit: int) -> int:
        return self.inner.count(matchers, start_ms, end_ms, limit)

    def read(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[RawSeries]:
        found = self.inner.read(matchers, start_ms, end_ms)
        for one in found:
            if len(one.times_ms):
                last = int(one.times_ms[-1])
                self.newest_ms = last if self.newest_ms is None else max(self.newest_ms, last)
        return found
