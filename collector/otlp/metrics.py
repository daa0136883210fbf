"""ExportMetricsServiceRequest -> series batches, point by point.

What each OTLP metric type becomes (names per :mod:`collector.otlp.names`, labels per
:mod:`collector.otlp.labels`):

=============================  ==============================================================
gauge                          ``<name>`` gauge
monotonic sum                  ``<name>_total`` counter
non-monotonic sum              ``<name>`` gauge (an up-down counter's value)
histogram                      ``<name>_bucket{le}`` (cumulative, ``le="+Inf"`` last),
                               ``<name>_sum``, ``<name>_count``: counters
exponential histogram          the same, after conversion (:mod:`collector.otlp.histograms`)
summary                        ``<name>{quantile}`` gauges, ``<name>_sum``/``_count`` counters
=============================  ==============================================================

Delta sums and histograms are accumulated into cumulative ones (:mod:`collector.otlp.delta`).

A data point is all or nothing: it is rejected, with a reason, for a NaN or infinite value,
a timestamp before 2000 or over a day ahead, a label over 2,048 characters, inconsistent
buckets, or a new series past the cap; the rest of the request is kept. A point flagged
``NO_RECORDED_VALUE`` is accepted and writes nothing; so are NaN quantiles of a summary (a
summary with no observations in its window), which are skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AggregationTemporality,
    DataPointFlags,
    Metric,
    NumberDataPoint,
    SummaryDataPoint,
)

from collector.otlp import histograms as hist
from collector.otlp.common import (
    Rejected,
    Rejections,
    Sample,
    SeriesBuilder,
    check_finite,
    to_datetime,
)
from collector.otlp.delta import DeltaAccumulator, OutOfOrder
from collector.otlp.labels import (
    attribute_labels,
    check_labels,
    format_float,
    resource_labels,
    scope_labels,
)
from collector.otlp.names import NameKind, metric_name
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import MAX_METRIC_LENGTH

_DELTA: Final = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
_CUMULATIVE: Final = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
_NO_RECORDED_VALUE: Final = DataPointFlags.DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK
_LONGEST_SUFFIX: Final = len("_bucket")

Labels = Mapping[str, str]


@dataclass(slots=True)
class MappedMetrics:
    batches: list[SeriesBatch]
    points: int
    """Data points in the request (a histogram point is one point, whatever its buckets)."""
    rejections: Rejections = field(default_factory=Rejections)

    @property
    def accepted(self) -> int:
        return self.points - self.rejections.total


def map_metrics(
    request: ExportMetricsServiceRequest,
    *,
    project_id: int,
    now: datetime,
    max_series: int,
    deltas: DeltaAccumulator,
) -> MappedMetrics:
    """The series batches of ``request`` for ``project_id`` and what was rejected, and why."""
    return _Mapper(project_id, now, max_series, deltas).run(request)


class _Mapper:
    def __init__(
        self, project_id: int, now: datetime, max_series: int, deltas: DeltaAccumulator
    ) -> None:
        self.project_id = project_id
        self.now = now
        self.deltas = deltas
        self.builder = SeriesBuilder(max_series)
        self.rejections = Rejections()
        self.points = 0

    def run(self, request: ExportMetricsServiceRequest) -> MappedMetrics:
        for resource_metrics in request.resource_metrics:
            try:
                resource = resource_labels(resource_metrics.resource.attributes)
                check_labels(resource)
            except Rejected as exc:
                count = sum(
                    _point_count(metric)
                    for scope in resource_metrics.scope_metrics
                    for metric in scope.metrics
                )
                self.points += count
                self.rejections.add(exc.reason, f"resource: {exc.message}", count)
                continue
            for scope_metrics in resource_metrics.scope_metrics:
                base = resource | scope_labels(scope_metrics.scope)
                for metric in scope_metrics.metrics:
                    self._metric(metric, base)
        return MappedMetrics(self.builder.batches(), self.points, self.rejections)

    def _metric(self, metric: Metric, base: Labels) -> None:
        data = metric.WhichOneof("data")
        if data is None:
            return  # no data points to store or to reject
        handler: Callable[[Metric, str, Any, Labels], list[Sample]] = getattr(
            self, f"_{data}_point"
        )
        kind = _name_kind(metric, data)
        name = metric_name(metric.name, metric.unit, kind)
        points = getattr(metric, data).data_points
        for point in points:
            self.points += 1
            try:
                if not name or len(name) + _LONGEST_SUFFIX > MAX_METRIC_LENGTH:
                    raise Rejected(
                        "invalid_metric_name",
                        f"the name is empty or longer than {MAX_METRIC_LENGTH} characters",
                    )
                if point.flags & _NO_RECORDED_VALUE:
                    continue
                labels = {**base, **attribute_labels(point.attributes)}
                check_labels(labels)
                self.builder.add_point(handler(metric, name, point, labels))
            except Rejected as exc:
                self.rejections.add(exc.reason, f"metric {metric.name[:100]!r}: {exc.message}")

    # ------------------------------------------------------------------ per type

    def _gauge_point(
        self, _metric: Metric, name: str, point: NumberDataPoint, labels: Labels
    ) -> list[Sample]:
        ts = to_datetime(point.time_unix_nano, self.now)
        return [Sample(name, labels, SeriesKind.GAUGE, ts, _number(point))]

    def _sum_point(
        self, metric: Metric, name: str, point: NumberDataPoint, labels: Labels
    ) -> list[Sample]:
        ts = to_datetime(point.time_unix_nano, self.now)
        value = _number(point)
        temporality = _temporality(metric.sum.aggregation_temporality)
        if temporality == _DELTA:
            value = self._accumulate(("sum", name, labels), point, value, _add_floats)
        kind = SeriesKind.COUNTER if metric.sum.is_monotonic else SeriesKind.GAUGE
        return [Sample(name, labels, kind, ts, value)]

    def _histogram_point(
        self, metric: Metric, name: str, point: Any, labels: Labels
    ) -> list[Sample]:
        ts = to_datetime(point.time_unix_nano, self.now)
        try:
            classic = hist.explicit(point.explicit_bounds, point.bucket_counts, point.count)
        except hist.HistogramError as exc:
            raise Rejected("invalid_histogram", str(exc)) from None
        total = _optional_sum(point)
        if _temporality(metric.histogram.aggregation_temporality) == _DELTA:
            classic, total = self._accumulate(
                ("histogram", name, labels), point, (classic, total), _add_classic
            )
        return _histogram_samples(name, labels, ts, classic, total)

    def _exponential_histogram_point(
        self, metric: Metric, name: str, point: Any, labels: Labels
    ) -> list[Sample]:
        ts = to_datetime(point.time_unix_nano, self.now)
        try:
            buckets = hist.exponential_from_point(point)
        except hist.HistogramError as exc:
            raise Rejected("invalid_histogram", str(exc)) from None
        total = _optional_sum(point)
        if _temporality(metric.exponential_histogram.aggregation_temporality) == _DELTA:
            buckets, total = self._accumulate(
                ("exponential", name, labels), point, (buckets, total), _add_exponential
            )
        return _histogram_samples(name, labels, ts, hist.to_classic(buckets), total)

    def _summary_point(
        self, _metric: Metric, name: str, point: SummaryDataPoint, labels: Labels
    ) -> list[Sample]:
        ts = to_datetime(point.time_unix_nano, self.now)
        total = check_finite(point.sum, "sum")
        samples = []
        for quantile in point.quantile_values:
            if not 0.0 <= quantile.quantile <= 1.0:
                raise Rejected("invalid_summary", f"quantile {quantile.quantile} not in [0, 1]")
            if quantile.value == quantile.value:  # NaN: no observations in the window
                value = check_finite(quantile.value, "quantile value")
                q_labels = {**labels, "quantile": format_float(quantile.quantile)}
                samples.append(Sample(name, q_labels, SeriesKind.GAUGE, ts, value))
        samples.append(Sample(f"{name}_sum", labels, SeriesKind.COUNTER, ts, total))
        samples.append(Sample(f"{name}_count", labels, SeriesKind.COUNTER, ts, float(point.count)))
        return samples

    # ------------------------------------------------------------------ delta

    def _accumulate(
        self, key: tuple[str, str, Labels], point: Any, delta: Any, combine: Callable[..., Any]
    ) -> Any:
        kind, name, labels = key
        series_key = (self.project_id, kind, name, tuple(sorted(labels.items())))
        try:
            return self.deltas.add(
                series_key, point.start_time_unix_nano, point.time_unix_nano, delta, combine
            )
        except OutOfOrder as exc:
            raise Rejected("delta_out_of_order", str(exc)) from None


def _point_count(metric: Metric) -> int:
    data = metric.WhichOneof("data")
    return 0 if data is None else len(getattr(metric, data).data_points)


def _name_kind(metric: Metric, data: str) -> NameKind:
    if data == "gauge":
        return NameKind.GAUGE
    if data == "sum" and metric.sum.is_monotonic:
        return NameKind.COUNTER
    return NameKind.OTHER


def _temporality(value: int) -> int:
    if value not in (_DELTA, _CUMULATIVE):
        raise Rejected("invalid_temporality", "aggregation_temporality must be DELTA or CUMULATIVE")
    return value


def _number(point: NumberDataPoint) -> float:
    which = point.WhichOneof("value")
    if which is None:
        raise Rejected("missing_value", "the data point has neither as_double nor as_int")
    value = point.as_double if which == "as_double" else float(point.as_int)
    return check_finite(value, "value")


def _optional_sum(point: Any) -> float | None:
    return check_finite(point.sum, "sum") if point.HasField("sum") else None


def _add_floats(total: float, delta: float) -> float:
    return total + delta


def _add_sums(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def _add_classic(
    total: tuple[hist.Classic, float | None], delta: tuple[hist.Classic, float | None]
) -> tuple[hist.Classic, float | None] | None:
    (a, a_sum), (b, b_sum) = total, delta
    if a.bounds != b.bounds:
        return None  # the bucket layout changed (a new view): start the series again
    cumulative = tuple(x + y for x, y in zip(a.cumulative, b.cumulative, strict=True))
    return hist.Classic(a.bounds, cumulative, a.count + b.count), _add_sums(a_sum, b_sum)


def _add_exponential(
    total: tuple[hist.Exponential, float | None], delta: tuple[hist.Exponential, float | None]
) -> tuple[hist.Exponential, float | None]:
    (a, a_sum), (b, b_sum) = total, delta
    return hist.merge(a, b), _add_sums(a_sum, b_sum)


def _histogram_samples(
    name: str, labels: Labels, ts: datetime, classic: hist.Classic, total: float | None
) -> list[Sample]:
    bucket = f"{name}_bucket"
    counter = SeriesKind.COUNTER
    samples = [
        Sample(bucket, {**labels, "le": format_float(bound)}, counter, ts, float(count))
        for bound, count in zip(classic.bounds, classic.cumulative, strict=True)
    ]
    samples.append(Sample(bucket, {**labels, "le": "+Inf"}, counter, ts, float(classic.count)))
    if total is not None:
        samples.append(Sample(f"{name}_sum", labels, counter, ts, total))
    samples.append(Sample(f"{name}_count", labels, counter, ts, float(classic.count)))
    return samples
