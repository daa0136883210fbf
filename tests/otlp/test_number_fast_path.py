"""The gauge and sum fast path (labels found again by the bytes of a point's attributes, see
collector/otlp/series_cache.py) against a transcription of the point-by-point mapping it
replaced, on random requests full of bad input: the same batches, points and rejections."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AggregationTemporality,
    Gauge,
    Metric,
    NumberDataPoint,
    Summary,
    SummaryDataPoint,
)

from collector.otlp.common import (
    Rejected,
    Rejections,
    Sample,
    SeriesBuilder,
    check_finite,
    to_datetime,
)
from collector.otlp.delta import DeltaAccumulator, OutOfOrder
from collector.otlp.labels import attribute_labels, check_labels, resource_labels, scope_labels
from collector.otlp.metrics import map_metrics
from collector.otlp.names import NameKind, metric_name
from collector.otlp.series_cache import LabelCache
from collector.otlp.wire import (
    attributes_key,
    from_object,
    has_no_time_or_value,
    number_points,
)
from tests.otlp.builders import NOW, SECOND, T0_NS, metrics_request, number
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import MAX_METRIC_LENGTH

DELTA = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
NO_RECORDED_VALUE = 1


# ---------------------------------------------------------------------- the reference


def reference_map(
    request: ExportMetricsServiceRequest,
    *,
    project_id: int,
    now: datetime,
    max_series: int,
    deltas: DeltaAccumulator,
) -> tuple[list[SeriesBatch], int, Rejections]:
    """Gauges and sums mapped one point at a time, labels computed for every point: the code
    before the fast path, as plain as it was."""
    builder = SeriesBuilder(max_series)
    rejections = Rejections()
    points = 0
    for resource_metrics in request.resource_metrics:
        try:
            resource = resource_labels(resource_metrics.resource.attributes)
            check_labels(resource)
        except Rejected as exc:
            count = sum(
                len(getattr(m, str(m.WhichOneof("data"))).data_points)
                for s in resource_metrics.scope_metrics
                for m in s.metrics
            )
            points += count
            rejections.add(exc.reason, f"resource: {exc.message}", count)
            continue
        for scope_metrics in resource_metrics.scope_metrics:
            base = resource | scope_labels(scope_metrics.scope)
            for metric in scope_metrics.metrics:
                data = metric.WhichOneof("data")
                assert data in ("gauge", "sum")
                monotonic = data == "sum" and metric.sum.is_monotonic
                name_kind = (
                    NameKind.GAUGE
                    if data == "gauge"
                    else NameKind.COUNTER
                    if monotonic
                    else NameKind.OTHER
                )
                name = metric_name(metric.name, metric.unit, name_kind)
                for point in getattr(metric, data).data_points:
                    points += 1
                    try:
                        if not name or len(name) + len("_bucket") > MAX_METRIC_LENGTH:
                            raise Rejected(
                                "invalid_metric_name",
                                f"the name is empty or longer than {MAX_METRIC_LENGTH} characters",
                            )
                        if point.flags & NO_RECORDED_VALUE:
                            continue
                        labels = {**base, **attribute_labels(point.attributes)}
                        check_labels(labels)
                        ts = to_datetime(point.time_unix_nano, now)
                        which = point.WhichOneof("value")
                        if which is None:
                            raise Rejected(
                                "missing_value", "the data point has neither as_double nor as_int"
                            )
                        value = point.as_double if which == "as_double" else float(point.as_int)
                        check_finite(value, "value")
                        kind = SeriesKind.COUNTER if monotonic else SeriesKind.GAUGE
                        if data == "sum":
                            temporality = metric.sum.aggregation_temporality
                            if temporality not in (DELTA, CUMULATIVE):
                                raise Rejected(
                                    "invalid_temporality",
                                    "aggregation_temporality must be DELTA or CUMULATIVE",
                                )
                            if temporality == DELTA:
                                key = (project_id, "sum", name, tuple(sorted(labels.items())))
                                try:
                                    value = deltas.add(
                                        key,
                                        point.start_time_unix_nano,
                                        point.time_unix_nano,
                                        value,
                                        lambda a, b: a + b,
                                    )
                                except OutOfOrder as exc:
                                    raise Rejected("delta_out_of_order", str(exc)) from None
                        builder.add_point([Sample(name, labels, kind, ts, value)])
                    except Rejected as exc:
                        rejections.add(exc.reason, f"metric {metric.name[:100]!r}: {exc.message}")
    return builder.batches(), points, rejections


def comparable(batches: list[SeriesBatch]) -> list[tuple[Any, ...]]:
    return [
        (b.metric, list(b.labels.items()), b.kind, list(b.timestamps), list(b.values))
        for b in batches
    ]


# ---------------------------------------------------------------------- random requests

KEYS = ["gpu", "gpu.uuid", "gpu_uuid", "1st", "__x", "", "k8s.pod.name", "Hostname"]


def any_value(rng: random.Random) -> AnyValue:
    roll = rng.random()
    if roll < 0.6:
        return AnyValue(string_value=rng.choice(["0", "1", "a", "", "b\x00c", "x" * 2_100]))
    if roll < 0.7:
        return AnyValue(int_value=rng.choice([0, 7, -1]))
    if roll < 0.75:
        return AnyValue(bool_value=rng.random() < 0.5)
    if roll < 0.8:
        return AnyValue(double_value=rng.choice([0.5, float("nan"), 1e16]))
    if roll < 0.85:
        value = AnyValue()
        value.array_value.values.add(string_value="a")
        value.array_value.values.add(int_value=2)
        return value
    if roll < 0.9:
        value = AnyValue()
        value.kvlist_value.values.add(key="k", value=AnyValue(string_value="v"))
        return value
    if roll < 0.95:
        return AnyValue(bytes_value=b"\x01\xff")
    return AnyValue()


def attribute_set(rng: random.Random) -> list[KeyValue]:
    chosen = rng.sample(KEYS, rng.randint(0, 4))
    return [KeyValue(key=key, value=any_value(rng)) for key in chosen]


def random_point(rng: random.Random, attributes: list[KeyValue]) -> NumberDataPoint:
    ns = rng.choice(
        [T0_NS, T0_NS + SECOND, T0_NS + 2 * SECOND, 0, T0_NS + 200_000 * SECOND, T0_NS + 3]
    )
    point = NumberDataPoint(time_unix_nano=ns)
    # Attributes in either order: the same set, other bytes.
    point.attributes.extend(attributes if rng.random() < 0.8 else attributes[::-1])
    roll = rng.random()
    if roll < 0.55:
        point.as_double = rng.choice([0.0, 1.5, -2.25, float("nan"), float("inf")])
    elif roll < 0.95:
        point.as_int = rng.choice([0, 3, -40, 2**62])
    if rng.random() < 0.3:
        point.start_time_unix_nano = rng.choice([0, T0_NS - SECOND, T0_NS])
    if rng.random() < 0.05:
        point.flags = NO_RECORDED_VALUE
    if rng.random() < 0.05:
        point.exemplars.add(time_unix_nano=T0_NS, as_double=rng.random())
    return point


def random_metric(rng: random.Random, series: list[list[KeyValue]]) -> Metric:
    name = rng.choice(["gpu.temperature", "gpu.temperature", "tokens", "", "x" * 250, "9lives"])
    unit = rng.choice(["", "Cel", "1", "By"])
    points = [random_point(rng, rng.choice(series)) for _ in range(rng.randint(0, 12))]
    if rng.random() < 0.5:
        return Metric(name=name, unit=unit, gauge=Gauge(data_points=points))
    metric = Metric(name=name, unit=unit)
    metric.sum.is_monotonic = rng.random() < 0.6
    metric.sum.aggregation_temporality = rng.choice([CUMULATIVE, CUMULATIVE, DELTA, 0])
    metric.sum.data_points.extend(points)
    return metric


def random_request(rng: random.Random) -> ExportMetricsServiceRequest:
    series = [attribute_set(rng) for _ in range(rng.randint(1, 6))]
    request = ExportMetricsServiceRequest()
    for _ in range(rng.randint(1, 3)):
        resource_metrics = request.resource_metrics.add()
        host = rng.choice(["node-1", "node-2", "y" * 3_000])  # the last is refused
        resource_metrics.resource.attributes.extend(
            [
                KeyValue(key="service.name", value=AnyValue(string_value="trainer")),
                KeyValue(key="host.name", value=AnyValue(string_value=host)),
            ]
        )
        for _ in range(rng.randint(1, 2)):
            scope_metrics = resource_metrics.scope_metrics.add()
            scope_metrics.scope.name = rng.choice(["", "lib"])
            scope_metrics.scope.version = rng.choice(["", "1.0"])
            scope_metrics.metrics.extend(random_metric(rng, series) for _ in range(3))
    return request


# ---------------------------------------------------------------------- the tests


@pytest.mark.parametrize("cache_size", [100_000, 3])
def test_random_requests_map_as_point_by_point(cache_size: int) -> None:
    rng = random.Random(20_261_122)
    cache = LabelCache(cache_size)
    ours, theirs = DeltaAccumulator(), DeltaAccumulator()
    sent: list[ExportMetricsServiceRequest] = []
    for _ in range(300):
        # Half the time a request seen before: its series are in the cache now.
        request = rng.choice(sent) if sent and rng.random() < 0.5 else random_request(rng)
        sent.append(request)
        max_series = rng.choice([2, 5, 10_000])
        got = map_metrics(
            request, project_id=1, now=NOW, max_series=max_series, deltas=ours, cache=cache
        )
        want, points, rejections = reference_map(
            request, project_id=1, now=NOW, max_series=max_series, deltas=theirs
        )
        assert comparable(got.batches) == comparable(want)
        assert got.points == points
        assert dict(got.rejections.counts) == dict(rejections.counts)
        assert got.rejections.examples == rejections.examples
    assert len(cache) <= cache_size


def test_points_without_attributes_are_all_kept() -> None:
    # Their key is b"", which must not be taken for "no previous point".
    gauge = Metric(name="up", gauge=Gauge(data_points=[number(1.0), number(2.0, T0_NS + SECOND)]))
    result = map_metrics(
        metrics_request([gauge]),
        project_id=1,
        now=NOW,
        max_series=10,
        deltas=DeltaAccumulator(),
    )
    assert [(b.metric, dict(b.labels), list(b.values)) for b in result.batches] == [
        ("up", {"job": "trainer"}, [1.0, 2.0])
    ]


def test_a_series_fed_by_a_gauge_and_a_summary_is_one_batch() -> None:
    # Fast path (gauge) and point-by-point path (summary) group by the same key.
    labels = {"gpu": "0"}
    gauge = Metric(name="x_count", gauge=Gauge(data_points=[number(9.0, labels=labels)]))
    summary = Metric(
        name="x",
        summary=Summary(
            data_points=[
                SummaryDataPoint(
                    time_unix_nano=T0_NS + SECOND,
                    count=4,
                    sum=2.0,
                    attributes=[KeyValue(key="gpu", value=AnyValue(string_value="0"))],
                )
            ]
        ),
    )
    result = map_metrics(
        metrics_request([gauge, summary]),
        project_id=1,
        now=NOW,
        max_series=10,
        deltas=DeltaAccumulator(),
    )
    counts = [b for b in result.batches if b.metric == "x_count"]
    assert len(counts) == 1 and list(counts[0].values) == [9.0, 4.0]


def test_the_receiver_cache_serves_later_requests() -> None:
    cache = LabelCache()
    request = metrics_request([Metric(name="t", gauge=Gauge(data_points=[number(1.0)]))])

    def run() -> list[tuple[Any, ...]]:
        result = map_metrics(
            request, project_id=1, now=NOW, max_series=10, deltas=DeltaAccumulator(), cache=cache
        )
        return comparable(result.batches)

    first = run()
    assert len(cache) == 1
    assert run() == first and len(cache) == 1


def test_attributes_key_skips_only_the_leading_time_and_value_records() -> None:
    attributes = [KeyValue(key="gpu", value=AnyValue(string_value="0"))]
    only = NumberDataPoint(attributes=attributes).SerializeToString()
    for fields in [
        {"time_unix_nano": T0_NS, "as_double": 1.5},
        {"time_unix_nano": T0_NS, "as_int": -3, "start_time_unix_nano": T0_NS - SECOND},
        {"as_double": 0.0},  # a set oneof is written even when zero
        {},
    ]:
        point = NumberDataPoint(attributes=attributes, **fields)  # type: ignore[arg-type]
        assert attributes_key(point.SerializeToString()) == only
    flagged = NumberDataPoint(time_unix_nano=T0_NS, attributes=attributes, flags=1)
    assert attributes_key(flagged.SerializeToString()) != only  # flags are in the key
    assert attributes_key(NumberDataPoint(time_unix_nano=T0_NS).SerializeToString()) == b""


def test_timestamps_are_checked_and_converted_once_per_value() -> None:
    late = T0_NS + 3 * 86_400 * SECOND  # NOW is an hour after T0: two days ahead of it
    gauge = Metric(
        name="t",
        gauge=Gauge(data_points=[number(1.0), number(2.0, late), number(3.0), number(4.0, late)]),
    )
    result = map_metrics(
        metrics_request([gauge]), project_id=1, now=NOW, max_series=10, deltas=DeltaAccumulator()
    )
    (batch,) = result.batches
    assert list(batch.values) == [1.0, 3.0]
    assert batch.timestamps[0] is batch.timestamps[1]  # one datetime for one time
    assert batch.timestamps[0] == NOW - timedelta(hours=1)
    assert dict(result.rejections.counts) == {"timestamp_out_of_range": 2}


def test_the_wire_walk_reads_every_layout_as_the_runtime_does() -> None:
    rng = random.Random(7)
    gauge = Gauge()
    for _ in range(400):
        point = random_point(rng, attribute_set(rng))
        if rng.random() < 0.1:
            point.ClearField("time_unix_nano")
        if rng.random() < 0.05:  # a point over 16 KB: a three-byte length
            point.attributes.add(key="big", value=AnyValue(string_value="z" * 20_000))
        if rng.random() < 0.03:
            point.Clear()
        gauge.data_points.append(point)
    walked = list(number_points(gauge.SerializeToString(), gauge.data_points))
    read = [from_object(index, point) for index, point in enumerate(gauge.data_points)]
    # NaN != NaN: compare the values by their repr
    assert [(*f[:4], repr(f[4])) for f in walked] == [(*f[:4], repr(f[4])) for f in read]
    # as_int (field 6) is written after exemplars (field 5): such a key holds the value.
    for (_, key, *_), point in zip(walked, gauge.data_points, strict=True):
        has_int_after_exemplars = bool(point.exemplars) and point.HasField("as_int")
        assert has_no_time_or_value(key) != has_int_after_exemplars


def test_keys_holding_a_time_or_value_are_not_trusted() -> None:
    attribute = KeyValue(key="gpu", value=AnyValue(string_value="0")).SerializeToString()
    attributes = b"\x3a" + bytes([len(attribute)]) + attribute
    assert has_no_time_or_value(attributes + b"\x40\x01")  # attributes and flags
    assert not has_no_time_or_value(attributes + b"\x19" + bytes(8))  # a time after them
    assert not has_no_time_or_value(attributes + b"\x21" + bytes(8))
    assert not has_no_time_or_value(attributes[:-1])  # cut short
    # An unknown field is fine; so are the exemplars.
    assert has_no_time_or_value(attributes + b"\x98\x06\x01" + b"\x2a\x00")


def test_a_point_whose_time_follows_its_attributes_is_read_through_its_object() -> None:
    # Not what the runtime writes, but valid protobuf: a time record after the attributes.
    point = number(1.5, labels={"gpu": "0"})
    head = NumberDataPoint(as_double=1.5).SerializeToString()
    tail = NumberDataPoint(attributes=point.attributes).SerializeToString()
    odd = head + tail + b"\x19" + T0_NS.to_bytes(8, "little")
    reparsed = NumberDataPoint.FromString(odd)
    assert reparsed.time_unix_nano == T0_NS
    gauge = Metric(name="t", gauge=Gauge(data_points=[reparsed, reparsed]))
    result = map_metrics(
        metrics_request([gauge]), project_id=1, now=NOW, max_series=10, deltas=DeltaAccumulator()
    )
    (batch,) = result.batches
    assert list(batch.values) == [1.5, 1.5]
    assert list(batch.timestamps) == [NOW - timedelta(hours=1)] * 2
