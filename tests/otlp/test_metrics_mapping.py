"""ExportMetricsServiceRequest -> series batches, for every metric type and every bad input."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AggregationTemporality,
    ExponentialHistogram,
    ExponentialHistogramDataPoint,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
    Sum,
    Summary,
    SummaryDataPoint,
)

from collector.otlp.delta import DeltaAccumulator
from collector.otlp.metrics import MappedMetrics, map_metrics
from tests.otlp.builders import NOW, SECOND, T0_NS, metrics_request, number
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind

DELTA = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
T0 = NOW - timedelta(hours=1)
JOB = {"job": "trainer"}


def mapped(
    *metrics: Metric, deltas: DeltaAccumulator | None = None, max_series: int = 10_000
) -> MappedMetrics:
    return map_metrics(
        metrics_request(metrics),
        project_id=1,
        now=NOW,
        max_series=max_series,
        deltas=deltas if deltas is not None else DeltaAccumulator(),
    )


def rows(
    batches: Sequence[SeriesBatch],
) -> dict[tuple[str, tuple[tuple[str, str], ...]], list[float]]:
    return {(b.metric, tuple(sorted(b.labels.items()))): list(b.values) for b in batches}


def one(result: MappedMetrics) -> SeriesBatch:
    assert len(result.batches) == 1, result.batches
    return result.batches[0]


def gauge(*points: NumberDataPoint, name: str = "gpu.temperature", unit: str = "Cel") -> Metric:
    return Metric(name=name, unit=unit, gauge=Gauge(data_points=points))


def test_gauge() -> None:
    result = mapped(
        gauge(number(71.5, labels={"gpu": "0"}), number(72, T0_NS + SECOND, {"gpu": "0"}))
    )
    batch = one(result)
    assert (batch.metric, dict(batch.labels), batch.kind) == (
        "gpu_temperature_celsius",
        {**JOB, "gpu": "0"},
        SeriesKind.GAUGE,
    )
    assert list(batch.timestamps) == [T0, T0 + timedelta(seconds=1)]
    assert list(batch.values) == [71.5, 72.0]
    assert (result.points, result.accepted, result.rejections.total) == (2, 2, 0)


def test_cumulative_monotonic_sum_is_a_counter_and_non_monotonic_a_gauge() -> None:
    counter = Metric(
        name="train.samples",
        sum=Sum(aggregation_temporality=CUMULATIVE, is_monotonic=True, data_points=[number(640)]),
    )
    updown = Metric(
        name="queue.depth",
        unit="{item}",
        sum=Sum(aggregation_temporality=CUMULATIVE, is_monotonic=False, data_points=[number(-3)]),
    )
    result = mapped(counter, updown)
    kinds = {b.metric: (b.kind, list(b.values)) for b in result.batches}
    assert kinds == {
        "train_samples_total": (SeriesKind.COUNTER, [640.0]),
        "queue_depth": (SeriesKind.GAUGE, [-3.0]),
    }


def delta_sum(start_ns: int, end_ns: int, value: int, monotonic: bool = True) -> Metric:
    point = number(value, end_ns, start_time_unix_nano=start_ns)
    return Metric(
        name="tokens",
        sum=Sum(aggregation_temporality=DELTA, is_monotonic=monotonic, data_points=[point]),
    )


def test_delta_sums_accumulate_into_a_cumulative_counter() -> None:
    deltas = DeltaAccumulator()
    s = SECOND
    values = []
    for start, end, value in [(0, 10, 5), (10, 20, 7), (25, 30, 1)]:  # a gap is fine
        batch = one(mapped(delta_sum(T0_NS + start * s, T0_NS + end * s, value), deltas=deltas))
        assert (batch.metric, batch.kind) == ("tokens_total", SeriesKind.COUNTER)
        values.append(batch.values[0])
    assert values == [5.0, 12.0, 13.0]


def test_a_retried_delta_writes_the_same_total_and_an_older_one_is_rejected() -> None:
    deltas = DeltaAccumulator()
    s = SECOND
    mapped(delta_sum(T0_NS, T0_NS + 10 * s, 5), deltas=deltas)
    mapped(delta_sum(T0_NS + 10 * s, T0_NS + 20 * s, 7), deltas=deltas)
    retry = mapped(delta_sum(T0_NS + 10 * s, T0_NS + 20 * s, 7), deltas=deltas)
    assert one(retry).values == [12.0]
    late = mapped(delta_sum(T0_NS + 5 * s, T0_NS + 15 * s, 1), deltas=deltas)
    assert late.batches == [] and dict(late.rejections.counts) == {"delta_out_of_order": 1}


def test_delta_up_down_counter_accumulates_into_a_gauge() -> None:
    deltas = DeltaAccumulator()
    mapped(delta_sum(T0_NS, T0_NS + SECOND, 4, monotonic=False), deltas=deltas)
    batch = one(mapped(delta_sum(T0_NS + SECOND, T0_NS + 2 * SECOND, -6, False), deltas=deltas))
    assert (batch.metric, batch.kind, batch.values) == ("tokens", SeriesKind.GAUGE, [-2.0])


def test_delta_series_of_different_projects_do_not_mix() -> None:
    deltas = DeltaAccumulator()
    request = metrics_request([delta_sum(T0_NS, T0_NS + SECOND, 3)])
    for project in (1, 2):
        result = map_metrics(request, project_id=project, now=NOW, max_series=10, deltas=deltas)
        assert one(result).values == [3.0]


def histogram_metric(
    temporality: AggregationTemporality.ValueType = CUMULATIVE,
    *points: HistogramDataPoint,
    name: str = "step.duration",
) -> Metric:
    return Metric(
        name=name,
        unit="s",
        histogram=Histogram(aggregation_temporality=temporality, data_points=points),
    )


def hist_point(
    counts: list[int], total: float | None, start_ns: int = 0, end_ns: int = T0_NS
) -> HistogramDataPoint:
    point = HistogramDataPoint(
        time_unix_nano=end_ns,
        start_time_unix_nano=start_ns,
        count=sum(counts),
        explicit_bounds=[0.1, 0.5, 1.0],
        bucket_counts=counts,
    )
    if total is not None:
        point.sum = total
    return point


def test_histogram_becomes_classic_buckets_sum_and_count() -> None:
    result = mapped(histogram_metric(CUMULATIVE, hist_point([1, 2, 0, 1], 2.35)))
    assert rows(result.batches) == {
        ("step_duration_seconds_bucket", (("job", "trainer"), ("le", "0.1"))): [1.0],
        ("step_duration_seconds_bucket", (("job", "trainer"), ("le", "0.5"))): [3.0],
        ("step_duration_seconds_bucket", (("job", "trainer"), ("le", "1.0"))): [3.0],
        ("step_duration_seconds_bucket", (("job", "trainer"), ("le", "+Inf"))): [4.0],
        ("step_duration_seconds_sum", (("job", "trainer"),)): [2.35],
        ("step_duration_seconds_count", (("job", "trainer"),)): [4.0],
    }
    assert {b.kind for b in result.batches} == {SeriesKind.COUNTER}
    assert result.batches[-2].metric.endswith("_sum")  # +Inf is the last bucket, before _sum
    assert result.batches[3].labels["le"] == "+Inf"


def test_histogram_without_sum_has_no_sum_series() -> None:
    result = mapped(histogram_metric(CUMULATIVE, hist_point([1, 0, 0, 0], None)))
    assert not any(b.metric.endswith("_sum") for b in result.batches)


def test_delta_histograms_accumulate() -> None:
    deltas = DeltaAccumulator()
    first = hist_point([1, 0, 0, 0], 0.25, T0_NS - SECOND, T0_NS)
    second = hist_point([0, 1, 0, 1], 2.5, T0_NS, T0_NS + SECOND)
    mapped(histogram_metric(DELTA, first), deltas=deltas)
    result = mapped(histogram_metric(DELTA, second), deltas=deltas)
    values = {(b.metric, b.labels.get("le")): b.values[0] for b in result.batches}
    assert values == {
        ("step_duration_seconds_bucket", "0.1"): 1.0,
        ("step_duration_seconds_bucket", "0.5"): 2.0,
        ("step_duration_seconds_bucket", "1.0"): 2.0,
        ("step_duration_seconds_bucket", "+Inf"): 3.0,
        ("step_duration_seconds_sum", None): 2.75,
        ("step_duration_seconds_count", None): 3.0,
    }


def exp_metric(
    temporality: AggregationTemporality.ValueType, *points: ExponentialHistogramDataPoint
) -> Metric:
    return Metric(
        name="io.latency",
        unit="ms",
        exponential_histogram=ExponentialHistogram(
            aggregation_temporality=temporality, data_points=points
        ),
    )


def exp_point(
    positive: list[int], offset: int, start_ns: int = 0, end_ns: int = T0_NS, zero: int = 0
) -> ExponentialHistogramDataPoint:
    return ExponentialHistogramDataPoint(
        time_unix_nano=end_ns,
        start_time_unix_nano=start_ns,
        scale=0,
        count=sum(positive) + zero,
        zero_count=zero,
        sum=10.0,
        positive=ExponentialHistogramDataPoint.Buckets(offset=offset, bucket_counts=positive),
    )


def test_exponential_histogram_becomes_classic_buckets() -> None:
    # scale 0: bucket 1 is (2, 4], bucket 2 is (4, 8]; the zero bucket joins the lowest.
    result = mapped(exp_metric(CUMULATIVE, exp_point([3, 1], offset=1, zero=2)))
    values = {(b.metric, b.labels.get("le")): b.values[0] for b in result.batches}
    assert values == {
        ("io_latency_milliseconds_bucket", "4.0"): 5.0,
        ("io_latency_milliseconds_bucket", "8.0"): 6.0,
        ("io_latency_milliseconds_bucket", "+Inf"): 6.0,
        ("io_latency_milliseconds_sum", None): 10.0,
        ("io_latency_milliseconds_count", None): 6.0,
    }


def test_delta_exponential_histograms_merge_across_different_ranges() -> None:
    deltas = DeltaAccumulator()
    mapped(exp_metric(DELTA, exp_point([1], 1, T0_NS - SECOND, T0_NS)), deltas=deltas)
    result = mapped(exp_metric(DELTA, exp_point([2], 3, T0_NS, T0_NS + SECOND)), deltas=deltas)
    values = {b.labels.get("le"): b.values[0] for b in result.batches if "_bucket" in b.metric}
    # (2,4] x1 from the first, (8,16] x2 from the second; (4,8] is empty in between.
    assert values == {"4.0": 1.0, "8.0": 1.0, "16.0": 3.0, "+Inf": 3.0}


def test_summary_quantiles_sum_and_count() -> None:
    point = SummaryDataPoint(
        time_unix_nano=T0_NS,
        count=10,
        sum=4.5,
        quantile_values=[
            SummaryDataPoint.ValueAtQuantile(quantile=0.5, value=0.4),
            SummaryDataPoint.ValueAtQuantile(quantile=0.99, value=float("nan")),  # no data
        ],
    )
    result = mapped(Metric(name="rpc.duration", unit="s", summary=Summary(data_points=[point])))
    assert rows(result.batches) == {
        ("rpc_duration_seconds", (("job", "trainer"), ("quantile", "0.5"))): [0.4],
        ("rpc_duration_seconds_sum", (("job", "trainer"),)): [4.5],
        ("rpc_duration_seconds_count", (("job", "trainer"),)): [10.0],
    }
    assert result.rejections.total == 0


def test_bad_points_are_rejected_by_reason_and_the_rest_is_kept() -> None:
    good = number(1.0, labels={"gpu": "0"})
    huge = "x" * 2049
    bad_points = [
        number(float("nan")),
        number(float("inf")),
        number(float("-inf")),
        number(1.0, 0),  # 1970
        number(1.0, 946_684_799 * SECOND),  # a second before 2000
        number(1.0, int((NOW + timedelta(days=2)).timestamp()) * SECOND),
        number(1.0, labels={"a": huge}),
        number(1.0, labels={huge: "a"}),
        number(1.0, labels={"nul": "a\x00b"}),
        NumberDataPoint(time_unix_nano=T0_NS),  # no value
    ]
    result = mapped(gauge(good, *bad_points))
    assert rows(result.batches) == {
        ("gpu_temperature_celsius", (("gpu", "0"), ("job", "trainer"))): [1.0]
    }
    assert dict(result.rejections.counts) == {
        "non_finite_value": 3,
        "timestamp_out_of_range": 3,
        "label_too_long": 2,
        "invalid_label": 1,
        "missing_value": 1,
    }
    assert (result.points, result.accepted) == (11, 1)
    summary = result.rejections.summary("data points")
    assert summary.startswith("rejected 10 data points: ")
    assert "non_finite_value x3 (e.g. metric 'gpu.temperature': value is nan" in summary


def test_a_day_ahead_is_still_accepted() -> None:
    ahead = int((NOW + timedelta(hours=23)).timestamp()) * SECOND
    assert mapped(gauge(number(1.0, ahead))).accepted == 1


def test_too_many_series_rejects_the_points_that_would_create_more() -> None:
    points = [number(float(i), labels={"gpu": str(i)}) for i in range(5)]
    points.append(number(9.0, T0_NS + SECOND, labels={"gpu": "0"}))  # an existing series
    result = mapped(gauge(*points), max_series=3)
    assert len(result.batches) == 3
    assert dict(result.rejections.counts) == {"too_many_series": 2}
    assert rows(result.batches)[
        ("gpu_temperature_celsius", (("gpu", "0"), ("job", "trainer")))
    ] == [0.0, 9.0]


def test_a_histogram_point_is_all_or_nothing_under_the_series_cap() -> None:
    result = mapped(histogram_metric(CUMULATIVE, hist_point([1, 0, 0, 0], 0.1)), max_series=5)
    assert result.batches == [] and dict(result.rejections.counts) == {"too_many_series": 1}


def test_invalid_histograms_temporality_names_and_resources() -> None:
    bad_hist = hist_point([1, 0, 0, 0], 0.1)
    bad_hist.count = 7
    nan_sum = hist_point([1, 0, 0, 0], float("nan"))
    no_temporality = Metric(name="x", sum=Sum(data_points=[number(1.0)]))
    no_name = gauge(number(1.0), name="...")
    long_name = gauge(number(1.0), name="n" * 200)
    result = mapped(
        histogram_metric(CUMULATIVE, bad_hist, nan_sum), no_temporality, no_name, long_name
    )
    assert dict(result.rejections.counts) == {
        "invalid_histogram": 1,
        "non_finite_value": 1,
        "invalid_temporality": 1,
        "invalid_metric_name": 2,
    }
    assert result.batches == []


def test_a_resource_with_a_huge_attribute_rejects_its_points_only() -> None:
    request = metrics_request(
        [gauge(number(1.0), number(2.0, T0_NS + 1))], resource={"host": "h" * 5000}
    )
    request.resource_metrics.extend(metrics_request([gauge(number(3.0))]).resource_metrics)
    result = map_metrics(request, project_id=1, now=NOW, max_series=10, deltas=DeltaAccumulator())
    assert dict(result.rejections.counts) == {"label_too_long": 2}
    assert [b.values for b in result.batches] == [[3.0]]


def test_no_recorded_value_points_write_nothing_and_are_not_rejected() -> None:
    result = mapped(gauge(number(1.0, flags=1)))
    assert result.batches == [] and result.rejections.total == 0 and result.points == 1


def test_labels_merge_resource_scope_and_point_attributes() -> None:
    request = metrics_request(
        [gauge(number(1.0, labels={"gpu": "0", "host.name": "override"}))],
        resource={"service.name": "trainer", "service.instance.id": "i-1", "host.name": "n1"},
        scope="torch.cuda",
    )
    result = map_metrics(request, project_id=1, now=NOW, max_series=10, deltas=DeltaAccumulator())
    assert dict(one(result).labels) == {
        "job": "trainer",
        "instance": "i-1",
        "host_name": "override",
        "otel_scope_name": "torch.cuda",
        "gpu": "0",
    }


def test_dcgm_sentinels_and_empty_attributes_are_not_stored() -> None:
    # dcgm-exporter's families reaching tuneloop through an OpenTelemetry collector: DCGM's
    # "not supported" (an int64 sentinel) is no reading, an empty pod is no pod.
    labels = {"gpu": "3", "Hostname": "gpu-node-42", "pod": ""}
    result = mapped(
        gauge(
            number(47, labels=labels),
            number(9223372036854775794, T0_NS + SECOND, labels),
            number(140737488355330.0, T0_NS + 2 * SECOND, labels),
            name="DCGM_FI_DEV_GPU_TEMP",
            unit="",
        )
    )
    batch = one(result)
    assert (batch.metric, dict(batch.labels)) == (
        "DCGM_FI_DEV_GPU_TEMP",
        {**JOB, "gpu": "3", "Hostname": "gpu-node-42"},
    )
    assert list(batch.values) == [47.0]
