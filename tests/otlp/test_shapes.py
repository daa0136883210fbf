"""Requests of a known shape read in bulk (collector/otlp/shapes.py): on random shapes and
numbers, bad numbers included, the receiver hands over exactly the batches, point count,
rejections and response the point-by-point mapping makes of the same body, and uses the bulk
path whenever it may."""

from __future__ import annotations

import gzip
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, Metric

from collector.otlp.common import Rejections
from collector.otlp.delta import DeltaAccumulator
from collector.otlp.metrics import map_metrics
from collector.otlp.receiver import ExportResult, OtlpReceiver, Signal
from collector.otlp.shapes import ShapeCache
from tests.otlp.builders import NOW, SECOND, T0_NS, metrics_request, number
from tuneloop.storage.timeseries.columns import Batch, SampleColumns, expand
from tuneloop.storage.timeseries.types import SeriesBatch

CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
DELTA = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
PROTOBUF = "application/x-protobuf"


@dataclass(frozen=True)
class MetricShape:
    name: str
    kind: str  # "gauge" or "sum"
    ints: bool
    start: bool  # points carry start_time_unix_nano
    series: list[dict[str, str | int]]
    points: int  # per series


def random_shape(rng: random.Random) -> list[MetricShape]:
    shapes = []
    for index in range(rng.randint(1, 4)):
        series = [
            {"gpu": str(gpu), "host": f"node-{rng.randint(0, 9)}", "n": rng.randint(0, 300)}
            for gpu in range(rng.randint(1, 6))
        ]
        if rng.random() < 0.2 and len(series) > 1:
            series[-1] = dict(series[0])  # one attribute set twice: one series
        shapes.append(
            MetricShape(
                f"m{index}.value",
                rng.choice(["gauge", "sum"]),
                rng.random() < 0.4,
                rng.random() < 0.5,
                series,
                rng.randint(1, 4),
            )
        )
    return shapes


def fill(shapes: Sequence[MetricShape], rng: random.Random, bad: float = 0.0) -> bytes:
    """A request of ``shapes`` with random numbers; ``bad``: the chance of a bad one each."""
    metrics = []
    for shape in shapes:
        metric = Metric(name=shape.name, unit="1")
        if shape.kind == "sum":
            metric.sum.aggregation_temporality = CUMULATIVE
            metric.sum.is_monotonic = True
            points = metric.sum.data_points
        else:
            points = metric.gauge.data_points
        for tick in range(shape.points):
            for labels in shape.series:
                t_ns = T0_NS + rng.randint(0, 3_600) * SECOND + rng.randint(0, 999_999_999)
                value: float | int = (
                    rng.randint(-(2**62), 2**62) if shape.ints else rng.uniform(-1e9, 1e9)
                )
                if rng.random() < bad:
                    roll = rng.random()
                    if roll < 0.3 and not shape.ints:
                        value = rng.choice([math.nan, math.inf, -math.inf])
                    elif roll < 0.6:
                        t_ns = rng.choice([1, T0_NS + 30 * 86_400 * SECOND])
                    else:
                        t_ns = 2**64 - 1 - tick
                point = number(value, t_ns + tick, labels)
                if shape.start:
                    point.start_time_unix_nano = T0_NS - 60 * SECOND
                points.append(point)
        metrics.append(metric)
    request = metrics_request(metrics, resource={"service.name": "trainer", "host.name": "a"})
    return bytes(request.SerializeToString())


def comparable(batches: Sequence[Batch]) -> list[tuple[Any, ...]]:
    return [
        (b.metric, dict(b.labels), list(b.timestamps), list(b.values), b.kind)
        for b in expand(batches)
    ]


def slow_path(body: bytes, max_series: int) -> tuple[list[SeriesBatch], int, Rejections]:
    request = ExportMetricsServiceRequest.FromString(body)
    mapped = map_metrics(
        request, project_id=1, now=NOW, max_series=max_series, deltas=DeltaAccumulator()
    )
    return mapped.batches, mapped.points, mapped.rejections


class Receiver:
    def __init__(self) -> None:
        self.receiver = OtlpReceiver(max_body_bytes=1 << 24, clock=lambda: NOW)
        self.submitted: list[Batch] = []

    def export(
        self, body: bytes, *, max_series: int = 1_000, encoding: str | None = None
    ) -> ExportResult:
        self.submitted = []
        return self.receiver.export(
            Signal.METRICS,
            gzip.compress(body) if encoding == "gzip" else body,
            content_type=PROTOBUF,
            content_encoding=encoding,
            project_id=1,
            max_series=max_series,
            submit=self.submitted.extend,
        )

    @property
    def bulk(self) -> bool:
        return any(isinstance(batch, SampleColumns) for batch in self.submitted)


def check_same(receiver: Receiver, body: bytes, max_series: int = 1_000, **kw: Any) -> None:
    result = receiver.export(body, max_series=max_series, **kw)
    batches, points, rejections = slow_path(body, max_series)
    assert comparable(receiver.submitted) == comparable(batches)
    assert (result.received, result.rejections.counts) == (points, rejections.counts)
    assert result.body == response_of(body, max_series)


def response_of(body: bytes, max_series: int) -> bytes:
    """The response the receiver gives with no shape known (a fresh one, same body)."""
    fresh = OtlpReceiver(max_body_bytes=1 << 24, clock=lambda: NOW, shapes=ShapeCache())
    return fresh.export(
        Signal.METRICS,
        body,
        content_type=PROTOBUF,
        content_encoding=None,
        project_id=1,
        max_series=max_series,
        submit=lambda _: None,
    ).body


@pytest.mark.parametrize("seed", range(12))
def test_random_shapes_map_as_point_by_point(seed: int) -> None:
    rng = random.Random(seed)
    shape = random_shape(rng)
    receiver = Receiver()
    for _ in range(2):  # seen once, then learned
        check_same(receiver, fill(shape, rng))
        assert not receiver.bulk
    for round_ in range(8):
        bad = 0.0 if round_ % 2 else 0.1
        body = fill(shape, rng, bad)
        check_same(receiver, body, encoding="gzip" if round_ == 3 else None)
        _, _, rejections = slow_path(body, 1_000)
        assert receiver.bulk == (not rejections.total)


def test_more_series_than_the_cap_are_refused_point_by_point() -> None:
    rng = random.Random(1)
    shape = random_shape(rng)
    receiver = Receiver()
    for _ in range(3):
        check_same(receiver, fill(shape, rng))
    assert receiver.bulk
    check_same(receiver, fill(shape, rng), max_series=1)
    assert not receiver.bulk


def test_another_shape_of_the_same_length_is_mapped_point_by_point() -> None:
    shape = [MetricShape("a", "gauge", False, False, [{"gpu": "0"}, {"gpu": "1"}], 2)]
    other = [MetricShape("b", "gauge", False, False, [{"gpu": "0"}, {"gpu": "2"}], 2)]
    rng = random.Random(3)
    receiver = Receiver()
    for _ in range(3):
        check_same(receiver, fill(shape, rng))
    assert receiver.bulk
    body = fill(other, rng)
    assert len(body) == len(fill(shape, rng))
    check_same(receiver, body)
    assert not receiver.bulk


def test_stale_shapes_of_a_length_give_way_to_the_new_one() -> None:
    """Four shapes of one length are known, then the exporter's series change (same length):
    after a while the old shapes are forgotten and the new one is learned."""
    rng = random.Random(5)
    receiver = Receiver()
    for gpu in "1234":
        shape = [MetricShape("a", "gauge", False, False, [{"gpu": "0"}, {"gpu": gpu}], 2)]
        for _ in range(3):
            check_same(receiver, fill(shape, rng))
        assert receiver.bulk
    assert len(receiver.receiver.shapes) == 4
    new = [MetricShape("a", "gauge", False, False, [{"gpu": "0"}, {"gpu": "5"}], 2)]
    for _ in range(20):
        check_same(receiver, fill(new, rng))
    assert receiver.bulk


def learned(body: bytes) -> bool:
    receiver = Receiver()
    receiver.export(body)
    receiver.export(body)
    return len(receiver.receiver.shapes) == 1


def test_shapes_that_need_more_than_the_numbers_are_not_learned() -> None:
    point = number(1.5, T0_NS, {"gpu": "0"})
    delta = Metric(name="d")
    delta.sum.aggregation_temporality = DELTA
    delta.sum.data_points.append(point)
    no_value = Metric(name="n")
    no_value.gauge.data_points.append(number(1.5, T0_NS, {"gpu": "0"}, flags=1))
    histogram = Metric(name="h")
    histogram.histogram.aggregation_temporality = CUMULATIVE
    histogram.histogram.data_points.add(time_unix_nano=T0_NS, count=1, bucket_counts=[1])
    gauge = Metric(name="g")
    gauge.gauge.data_points.append(point)
    with_exemplar = Metric(name="e")
    with_exemplar.gauge.data_points.append(point)
    with_exemplar.gauge.data_points[0].exemplars.add(time_unix_nano=T0_NS, as_double=1.0)
    plain = bytes(metrics_request([gauge]).SerializeToString())
    assert learned(plain)
    for metric in (delta, no_value, histogram):
        assert not learned(bytes(metrics_request([gauge, metric]).SerializeToString()))
    # Exemplars are part of the skeleton: learned, but they match only themselves.
    assert learned(bytes(metrics_request([with_exemplar]).SerializeToString()))
    # Not canonical: a field the walk does not know, or a singular field twice.
    assert not learned(plain + b"\xf8\x06\x01")  # field 111, varint: an unknown field
    resource = bytes(metrics_request([]).resource_metrics[0].resource.SerializeToString())
    twice = b"\x0a" + bytes([len(resource)]) + resource
    request = bytes(metrics_request([gauge]).resource_metrics[0].SerializeToString())
    doubled = request + twice  # ResourceMetrics.resource again: the parser merges the two
    assert not learned(b"\x0a" + bytes([len(doubled)]) + doubled)


def test_points_in_another_field_order_are_mapped_point_by_point() -> None:
    """A point whose value comes before its time (valid protobuf, not the runtime's order)."""
    gauge = Metric(name="g")
    point = number(2.5, T0_NS, {"gpu": "0"})
    gauge.gauge.data_points.append(point)
    body = bytearray(metrics_request([gauge]).SerializeToString())
    encoded = point.SerializeToString()
    at = body.index(encoded)
    assert encoded[0] == 0x19 and encoded[9] == 0x21  # time, then value
    body[at : at + 18] = encoded[9:18] + encoded[:9]
    assert not learned(bytes(body))
    receiver = Receiver()
    for _ in range(3):
        check_same(receiver, bytes(body))


def test_the_label_of_every_point_comes_from_its_attributes() -> None:
    """Points of one series whose attributes are written in another order: one series."""
    gauge = Metric(name="g")
    gauge.gauge.data_points.append(number(1.0, T0_NS, {"a": "1", "b": "2"}))
    gauge.gauge.data_points.append(number(2.0, T0_NS + SECOND, {"b": "2", "a": "1"}))
    body = bytes(metrics_request([gauge]).SerializeToString())
    receiver = Receiver()
    for _ in range(3):
        check_same(receiver, body)
    assert receiver.bulk
    assert len(expand(receiver.submitted)) == 1
