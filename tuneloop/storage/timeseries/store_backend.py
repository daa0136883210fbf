"""The built-in store (PostgreSQL or SQLite) as a
:class:`~tuneloop.storage.timeseries.backend.TimeSeriesBackend`: each call is the store's own
function of the same name on ``bind``, so behaviour is exactly the store's."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from sqlalchemy import Connection

from tuneloop.storage.timeseries import functions, query, raw
from tuneloop.storage.timeseries.columns import Batch
from tuneloop.storage.timeseries.functions import LabeledSeries
from tuneloop.storage.timeseries.query import METRIC_LABEL, Bind
from tuneloop.storage.timeseries.raw import RawSeries
from tuneloop.storage.timeseries.types import (
    Aggregation,
    LatestSample,
    Matcher,
    RangeSeries,
    SeriesInfo,
    WriteResult,
)
from tuneloop.storage.timeseries.writer import SampleWriter


class StoreBackend:
    """Series in the database behind ``bind`` (an engine, or a connection whose transaction the
    reads join). Writes go through ``writer`` (by default one on the bind's engine)."""

    def __init__(self, bind: Bind, *, writer: SampleWriter | None = None) -> None:
        self.bind = bind
        self._writer = writer

    @property
    def writer(self) -> SampleWriter:
        if self._writer is None:
            engine = self.bind.engine if isinstance(self.bind, Connection) else self.bind
            self._writer = SampleWriter(engine)
        return self._writer

    def write(self, project_id: int, batches: Iterable[Batch]) -> WriteResult:
        return self.writer.write(project_id, batches)

    def find_series(
        self,
        project_id: int,
        metric: str | None,
        matchers: Sequence[Matcher] = (),
        *,
        max_series: int | None = None,
        start: datetime | None = None,
        end: datetime | None = None,
    ) -> list[SeriesInfo]:
        """From the series index, as :meth:`label_names`: ``start``/``end`` do not narrow."""
        return query.find_series(self.bind, project_id, metric, matchers, max_series=max_series)

    def label_names(
        self,
        project_id: int,
        matchers: Sequence[Matcher] = (),
        *,
        start: datetime | None = None,
        end: datetime | None = None,
    ) -> list[str]:
        """From the series index: the store keeps series until retention drops them, so
        ``start`` and ``end`` do not narrow the answer."""
        found = query.find_series(self.bind, project_id, None, matchers)
        names = {name for info in found for name in info.labels}
        return sorted(names | {METRIC_LABEL}) if found else []

    def label_values(
        self,
        project_id: int,
        name: str,
        matchers: Sequence[Matcher] = (),
        *,
        start: datetime | None = None,
        end: datetime | None = None,
    ) -> list[str]:
        """As :meth:`label_names`, from the series index."""
        found = query.find_series(self.bind, project_id, None, matchers)
        if name == METRIC_LABEL:
            return sorted({info.metric for info in found})
        return sorted({info.labels[name] for info in found if info.labels.get(name)})

    def query_range(
        self,
        project_id: int,
        metric: str | None,
        matchers: Sequence[Matcher] = (),
        *,
        start: datetime,
        end: datetime,
        step_s: int,
        aggregation: Aggregation,
        q: float | None = None,
        max_series: int | None = None,
    ) -> list[RangeSeries]:
        return query.query_range(
            self.bind,
            project_id,
            metric,
            matchers,
            start=start,
            end=end,
            step_s=step_s,
            aggregation=aggregation,
            q=q,
            max_series=max_series,
        )

    def latest(
        self,
        project_id: int,
        metric: str | None,
        matchers: Sequence[Matcher] = (),
        *,
        since: datetime | None = None,
        max_series: int | None = None,
    ) -> list[LatestSample]:
        return query.latest(
            self.bind, project_id, metric, matchers, since=since, max_series=max_series
        )

    def rate(
        self,
        project_id: int,
        metric: str | None,
        matchers: Sequence[Matcher] = (),
        *,
        start: datetime,
        end: datetime,
        step_s: int,
        window_s: int | None = None,
        max_series: int | None = None,
    ) -> list[RangeSeries]:
        return functions.rate(
            self.bind,
            project_id,
            metric,
            matchers,
            start=start,
            end=end,
            step_s=step_s,
            window_s=window_s,
            max_series=max_series,
        )

    def increase(
        self,
        project_id: int,
        metric: str | None,
        matchers: Sequence[Matcher] = (),
        *,
        start: datetime,
        end: datetime,
        step_s: int,
        window_s: int | None = None,
        max_series: int | None = None,
    ) -> list[RangeSeries]:
        return functions.increase(
            self.bind,
            project_id,
            metric,
            matchers,
            start=start,
            end=end,
            step_s=step_s,
            window_s=window_s,
            max_series=max_series,
        )

    def read_raw(
        self,
        project_id: int,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        *,
        max_series: int | None = None,
    ) -> list[RawSeries]:
        if isinstance(self.bind, Connection):
            return raw.read(
                self.bind, project_id, matchers, start_ms, end_ms, max_series=max_series
            )
        with self.bind.connect() as connection:
            return raw.read(
                connection, project_id, matchers, start_ms, end_ms, max_series=max_series
            )

    def count_raw(
        self, project_id: int, matchers: Sequence[Matcher], start_ms: int, end_ms: int, limit: int
    ) -> int:
        if isinstance(self.bind, Connection):
            return raw.count_samples(self.bind, project_id, matchers, start_ms, end_ms, limit)
        with self.bind.connect() as connection:
            return raw.count_samples(connection, project_id, matchers, start_ms, end_ms, limit)

    def histogram_quantile(
        self,
        project_id: int,
        q: float,
        metric: str,
        matchers: Sequence[Matcher] = (),
        *,
        start: datetime,
        end: datetime,
        step_s: int,
        window_s: int | None = None,
        max_series: int | None = None,
        by: Sequence[str] | None = None,
    ) -> list[LabeledSeries]:
        return functions.histogram_quantile(
            self.bind,
            project_id,
            q,
            metric,
            matchers,
            start=start,
            end=end,
            step_s=step_s,
            window_s=window_s,
            max_series=max_series,
            by=by,
        )
