"""The engine's samples from any series backend: the built-in store or a Prometheus-compatible
TSDB, through the contract's raw reads, so one engine answers PromQL on either."""

from __future__ import annotations

from collections.abc import Sequence

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
