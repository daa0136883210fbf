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

from collections.abc import Callable, Mapping, Sequence
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
    scope_labels,
)
from collector.otlp.names import NameKind, metric_name
from collector.otlp.series_cache import (
    SKIP,
    KnownSeries,
    LabelCache,
    ScopeKey,
    SeriesKey,
)
from collector.otlp.shapes import Recorded
from collector.otlp.wire import from_object, has_no_time_or_value, number_points
from collector.sources.dcgm_fields import DCGM_PREFIX, is_blank_reading
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import MAX_METRIC_LENGTH

_DELTA: Final = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
_CUMULATIVE: Final = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
_NO_RECORDED_VALUE: Final = DataPointFlags.DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK
_LONGEST_SUFFIX: Final = len("_bucket")
_MISSING_VALUE: Final = "the data point has neither as_double nor as_int"

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
    cache: LabelCache | None = None,
    record: list[Recorded] | None = None,
) -> MappedMetrics:
    """The series batches of ``request`` for ``project_id`` and what was rejected, and why.
    ``cache`` keeps labels from one request to the next (the receiver's); without, the labels
    of each series are still computed once per request. ``record``: appended the series (and
    its kind) of each gauge or sum point that became a sample, in order (for
    :mod:`collector.otlp.shapes`)."""
    cache = cache if cache is not None else LabelCache()
    return _Mapper(project_id, now, max_series, deltas, cache, record).run(request)


class _Mapper:
    def __init__(
        self,
        project_id: int,
        now: datetime,
        max_series: int,
        deltas: DeltaAccumulator,
        cache: LabelCache,
        record: list[Recorded] | None = None,
    ) -> None:
        self.project_id = project_id
        self.record = record
        self.now = now
        self.deltas = deltas
        self.cache = cache
        self.builder = SeriesBuilder(max_series)
        self.rejections = Rejections()
        self.points = 0
        # Points of one request mostly share a few timestamps (every point of one collection
        # has the same): convert and bound-check each distinct one once.
        self.times: dict[int, datetime] = {}

    def run(self, request: ExportMetricsServiceRequest) -> MappedMetrics:
        for resource_metrics in request.resource_metrics:
            resource_key = resource_metrics.resource.SerializeToString()
            try:
                resource = self.cache.resource(resource_key, resource_metrics.resource)
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
                scope = scope_metrics.scope
                base = resource | scope_labels(scope)
                scope_key = (resource_key, scope.name, scope.version)
                for metric in scope_metrics.metrics:
                    self._metric(metric, base, scope_key)
        return MappedMetrics(self.builder.batches(), self.points, self.rejections)

    def _metric(self, metric: Metric, base: Labels, scope_key: ScopeKey) -> None:
        data = metric.WhichOneof("data")
        if data is None:
            return  # no data points to store or to reject
        name = metric_name(metric.name, metric.unit, _name_kind(metric, data))
        points = getattr(metric, data).data_points
        if not name or len(name) + _LONGEST_SUFFIX > MAX_METRIC_LENGTH:
            self.points += len(points)
            if points:
                self.rejections.add(
                    "invalid_metric_name",
                    f"metric {metric.name[:100]!r}: the name is empty or longer than "
                    f"{MAX_METRIC_LENGTH} characters",
                    len(points),
                )
            return
        if data == "gauge" or data == "sum":
            self._numbers(metric, data, name, points, base, scope_key)
            return
        handler: Callable[[Metric, str, Any, Labels], list[Sample]] = getattr(
            self, f"_{data}_point"
        )
        for point in points:
            self.points += 1
            try:
                if point.flags & _NO_RECORDED_VALUE:
                    continue
                labels = _point_labels(base, point)
                self.builder.add_point(handler(metric, name, point, labels))
            except Rejected as exc:
                self._reject(metric, exc)

    # ------------------------------------------------------------------ per type

    def _numbers(
        self,
        metric: Metric,
        data: str,
        name: str,
        points: Sequence[NumberDataPoint],
        base: Labels,
        scope_key: ScopeKey,
    ) -> None:
        """Gauge and sum points: the hot path. The per-metric facts are looked up once, and
        each point is read from the encoding of the whole gauge or sum
        (:mod:`collector.otlp.wire`) and its labels found by its attributes key
        (:mod:`collector.otlp.series_cache`). Checks, their order and their messages are those
        of every other point type."""
        kind = SeriesKind.GAUGE
        delta = bad_temporality = False
        container = metric.gauge if data == "gauge" else metric.sum
        if data == "sum":
            if metric.sum.is_monotonic:
                kind = SeriesKind.COUNTER
            temporality = metric.sum.aggregation_temporality
            bad_temporality = temporality not in (_DELTA, _CUMULATIVE)
            delta = temporality == _DELTA
        known = self.cache.series_of(scope_key, name)
        # DCGM's blank sentinels ("not supported" as 9223372036854775794) are no readings,
        # whichever path dcgm-exporter's families take to tuneloop.
        dcgm = name.startswith(DCGM_PREFIX)
        times, now = self.times, self.now
        builder = self.builder
        lists_of = builder.lists_of
        record = self.record
        self.points += len(points)
        # The series of the last point and its lists: an exporter that batches over time sends
        # the points of one series one after the other, and comparing bytes is cheaper than
        # hashing them. Only a key whose time and value were read whole is kept here.
        last_key: bytes | None = None  # (a point without attributes has the key b"")
        last_series = SKIP
        last_lists: tuple[list[datetime], list[float]] = ([], [])
        lists: tuple[list[datetime], list[float]] | None
        encoded = container.SerializeToString()
        key: bytes | None
        for index, key, start_ns, ns, value in number_points(encoded, points):
            try:
                if key == last_key:
                    series, lists = last_series, last_lists
                else:
                    lists = None
                    found = known.get(key)
                    if found is not None:
                        series = found  # only keys read whole are remembered
                    else:
                        point = points[index]
                        series = self._new_series(point, key, known, name, base)
                        if not has_no_time_or_value(key):
                            # Not the runtime's layout: the fields may be anywhere, so read
                            # them through the object, and forget the key.
                            _, _, start_ns, ns, value = from_object(index, point)
                            known.pop(key, None)
                            key = None
                    if series is SKIP:
                        continue
                ts = times.get(ns)
                if ts is None:
                    ts = times[ns] = to_datetime(ns, now)
                if value is None:
                    raise Rejected("missing_value", _MISSING_VALUE)
                if value - value:  # NaN or infinite (finite: 0.0)
                    check_finite(value, "value")
                if dcgm and is_blank_reading(value):
                    continue
                if bad_temporality:
                    _temporality(metric.sum.aggregation_temporality)
                if delta:
                    value = self._accumulate("sum", series.key, start_ns, ns, value, _add_floats)
                if lists is None:
                    # The builder's lists, looked up here (after every check of the point, as
                    # the series cap comes last): one call less per point.
                    lists = lists_of.get(series)
                    if lists is None:
                        lists = builder.lists(series, kind)
                    if key is not None:
                        last_key, last_series, last_lists = key, series, lists
                lists[0].append(ts)
                lists[1].append(value)
                if record is not None:
                    record.append((series, kind))
            except Rejected as exc:
                self._reject(metric, exc)

    def _reject(self, metric: Metric, exc: Rejected) -> None:
        self.rejections.add(exc.reason, f"metric {metric.name[:100]!r}: {exc.message}")

    def _new_series(
        self,
        point: NumberDataPoint,
        key: bytes,
        known: dict[bytes, KnownSeries],
        name: str,
        base: Labels,
    ) -> KnownSeries:
        """The labels of a point not seen before, checked (``Rejected`` if they cannot be
        stored; nothing is remembered then)."""
        if point.flags & _NO_RECORDED_VALUE:
            series = SKIP
        else:
            labels = _point_labels(base, point)
            series = KnownSeries(labels, (name, tuple(sorted(labels.items()))))
        # Exemplars differ from point to point: such a key would never be seen again.
        if not point.exemplars:
            self.cache.remember(known, key, series)
        return series

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
                "histogram",
                _series_key(name, labels),
                point.start_time_unix_nano,
                point.time_unix_nano,
                (classic, total),
                _add_classic,
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
                "exponential",
                _series_key(name, labels),
                point.start_time_unix_nano,
                point.time_unix_nano,
                (buckets, total),
                _add_exponential,
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
        self,
        kind: str,
        series: SeriesKey,
        start_ns: int,
        end_ns: int,
        delta: Any,
        combine: Callable[..., Any],
    ) -> Any:
        name, items = series
        try:
            return self.deltas.add(
                (self.project_id, kind, name, items), start_ns, end_ns, delta, combine
            )
        except OutOfOrder as exc:
            raise Rejected("delta_out_of_order", str(exc)) from None


def _point_labels(base: Labels, point: Any) -> dict[str, str]:
    """A point's labels: its scope's and resource's, then its attributes; ``Rejected`` when
    they cannot be stored."""
    labels = {**base, **attribute_labels(point.attributes)}
    check_labels(labels)
    return labels


def _series_key(name: str, labels: Labels) -> SeriesKey:
    return name, tuple(sorted(labels.items()))


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
