"""The one contract every reader and writer of series goes through, whatever keeps them: the
built-in store (:class:`~tuneloop.storage.timeseries.store_backend.StoreBackend`, PostgreSQL or
SQLite) or a Prometheus-compatible TSDB
(:class:`~tuneloop.storage.prometheus.backend.PrometheusBackend`, remote write in, HTTP API out).

The value types are the store's own (:class:`SeriesInfo`, :class:`RangeSeries`,
:class:`LatestSample`, :class:`Matcher`, :class:`Aggregation`, :class:`WriteResult`), so a caller
switches by changing what it calls, not what it reads.

Semantics both implementations keep (the store exactly; a Prometheus-compatible TSDB within the
tolerances stated here and asserted by ``tests/timeseries_contract``):

Projects
    Every call names a project; it sees only the series written for that project.

Buckets (``query_range``)
    Points sit at epoch multiples of ``step_s``; the point labelled ``b`` aggregates the samples
    in ``[b, b + step)``, clipped to ``[start, end)``. A TSDB evaluates windows ``(t - w, t]``
    (Prometheus 3, VictoriaMetrics) or ``[t - w, t]`` (Prometheus 2); the Prometheus backend
    evaluates at ``b + step`` shifted back by 1 ms, so with millisecond timestamps it is exact
    except for a sample exactly 1 ms before a bucket start on Prometheus 2. Times are read to
    the millisecond there (remote write carries milliseconds).

Counter windows (``rate``, ``increase``, ``histogram_quantile``)
    The point labelled ``b`` is about the window ``[b + step - window, b + step)``, not clipped
    to the range. The store pairs a window's first sample with the one before it and never
    extrapolates; PromQL extrapolates to the window's edges (Prometheus) or pairs with the
    sample before the window (VictoriaMetrics). For samples at a regular interval that divides
    the window the two agree; in general a Prometheus-compatible TSDB's values are
    approximations (the contract tests allow 5 % on windows with samples throughout).

Latest
    The newest sample of each series at or after ``since`` (its own timestamp and value). With
    ``since=None`` the store looks at any age; a TSDB looks back
    :data:`~tuneloop.storage.prometheus.queries.DEFAULT_LOOKBACK_S`.

Raw samples (``read_raw``, ``count_raw``)
    Each series the matchers select (PromQL matchers, the name as ``__name__``) with its own
    samples in ``(start, end]``, times in milliseconds, ``__name__`` among its labels: what a
    PromQL engine evaluates over, so one engine (:mod:`tuneloop.promql`) answers on either
    backend. ``count_raw`` bounds a read before it is made: exact in the store, at most one
    sample per series more in a TSDB that counts windows closed at the start (Prometheus 2).

Limits
    ``max_series`` raises :class:`~tuneloop.storage.timeseries.query.TooManySeries` when more
    series match; ``ValueError`` subclasses mean the query is refused (bad range, bad regex,
    a TSDB's 4xx); :class:`~tuneloop.errors.Unavailable` subclasses mean try again later.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

from tuneloop.storage.timeseries.columns import Batch
from tuneloop.storage.timeseries.functions import LabeledSeries
from tuneloop.storage.timeseries.raw import RawSeries
from tuneloop.storage.timeseries.types import (
    Aggregation,
    LatestSample,
    Matcher,
    RangeSeries,
    SeriesInfo,
    WriteResult,
)

__all__ = ["TimeSeriesBackend"]


@runtime_checkable
class TimeSeriesBackend(Protocol):
    """Where a process's series live; see the module docstring for the semantics."""

    def write(self, project_id: int, batches: Iterable[Batch]) -> WriteResult:
        """Store ``batches``; bad batches become rejections, the rest is kept."""
        ...

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
        """Series named ``metric`` (any if ``None``) matching every matcher, by metric then id;
        ``start``/``end`` as for :meth:`label_names`: a TSDB lists the series with samples
        then (without ``start``, in its default lookback), the store every series it keeps."""
        ...

    def label_names(
        self,
        project_id: int,
        matchers: Sequence[Matcher] = (),
        *,
        start: datetime | None = None,
        end: datetime | None = None,
    ) -> list[str]:
        """Sorted label names of the matching series, ``__name__`` among them."""
        ...

    def label_values(
        self,
        project_id: int,
        name: str,
        matchers: Sequence[Matcher] = (),
        *,
        start: datetime | None = None,
        end: datetime | None = None,
    ) -> list[str]:
        """Sorted distinct values of label ``name`` (``__name__``: metric names)."""
        ...

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
        """Each matching series aggregated per bucket; series without a point are left out."""
        ...

    def latest(
        self,
        project_id: int,
        metric: str | None,
        matchers: Sequence[Matcher] = (),
        *,
        since: datetime | None = None,
        max_series: int | None = None,
    ) -> list[LatestSample]:
        """The newest sample of each matching series."""
        ...

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
        """Per-second increase of each counter over each point's window."""
        ...

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
        """Growth of each counter over each point's window, resets handled."""
        ...

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
        """The ``q``-quantile of histogram ``metric`` (its base name) per label set but ``le``;
        with ``by``, per set of those labels, the buckets of a set added up first, as
        ``histogram_quantile(q, sum by (<by>, le) (increase(<metric>_bucket[w])))``."""
        ...

    def read_raw(
        self,
        project_id: int,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        *,
        max_series: int | None = None,
    ) -> list[RawSeries]:
        """Each selected series with its samples in ``(start_ms, end_ms]``, oldest first;
        series without one are left out."""
        ...

    def count_raw(
        self, project_id: int, matchers: Sequence[Matcher], start_ms: int, end_ms: int, limit: int
    ) -> int:
        """Samples :meth:`read_raw` would load, counted to at most ``limit + 1``."""
        ...
