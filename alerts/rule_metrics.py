"""Which metrics a rule may read, checked when it is created: the project's own series (in the
store, or in the process's TSDB), else what tuneloop's collectors write."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from alerts.catalog import known_metrics
from alerts.rules import MetricInfo, MetricLookup
from tuneloop.storage.models import Series
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.timeseries.query import TooManySeries
from tuneloop.storage.timeseries.types import SeriesKind


def metric_lookup(
    session: Session, project_id: int, series: TimeSeriesBackend | None = None
) -> MetricLookup:
    """Finds a metric among the project's series (in ``series``, default the store), else
    among what the collectors write."""

    def lookup(name: str) -> MetricInfo | None:
        kind: SeriesKind | None
        if series is None:
            stored = session.scalars(
                select(Series.kind).where(Series.project_id == project_id, Series.metric == name)
            ).first()
            kind = None if stored is None else SeriesKind(stored)
        else:
            kind = series_kind(series, project_id, name)
        kind = kind or known_metrics().get(name)
        return MetricInfo(name, kind) if kind is not None else None

    return lookup


def series_kind(series: TimeSeriesBackend, project_id: int, metric: str) -> SeriesKind | None:
    """The kind of the project's ``metric`` series, or ``None`` when it has none."""
    try:
        found = series.find_series(project_id, metric, max_series=1)
    except TooManySeries:  # a TSDB's kinds follow the name: any one series tells
        found = series.find_series(project_id, metric)
    return found[0].kind if found else None
