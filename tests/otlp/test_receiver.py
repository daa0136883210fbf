"""The receiver without HTTP: what it submits, what it answers, and that no input crashes it."""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Sequence

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AggregationTemporality,
    ExponentialHistogram,
    ExponentialHistogramDataPoint,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    Sum,
    Summary,
    SummaryDataPoint,
)
from prometheus_client import CollectorRegistry

from collector.otlp.decode import OtlpError
from collector.otlp.receiver import OtlpReceiver, Signal
from collector.otlp.telemetry import telemetry_for
from tests.otlp.builders import NOW, SECOND, T0_NS, metrics_request, number, span, traces_request
from tuneloop.storage.timeseries.types import SeriesBatch

CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
DELTA = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA


class Collected:
    """A submit callback that keeps what it is given."""

    def __init__(self) -> None:
        self.batches: list[SeriesBatch] = []

    def __call__(self, batches: Sequence[SeriesBatch]) -> None:
        self.batches.extend(batches)


def receiver(registry: CollectorRegistry | None = None) -> OtlpReceiver:
    telemetry = telemetry_for(registry) if registry is not None else None
    return OtlpReceiver(max_body_bytes=1 << 20, telemetry=telemetry, clock=lambda: NOW)


def every_metric_type() -> bytes:
    exp = ExponentialHistogramDataPoint(
        time_unix_nano=T0_NS,
        start_time_unix_nano=T0_NS - SECOND,
        scale=2,
        count=3,
        zero_count=1,
        sum=5.0,
        positive=ExponentialHistogramDataPoint.Buckets(offset=-1, bucket_counts=[1, 1]),
    )
    hist = HistogramDataPoint(
        time_unix_nano=T0_NS, count=2, sum=1.0, explicit_bounds=[1.0], bucket_counts=[1, 1]
    )
    summary = SummaryDataPoint(
        time_unix_nano=T0_NS,
        count=2,
        sum=3.0,
        quantile_values=[SummaryDataPoint.ValueAtQuantile(quantile=0.5, value=1.5)],
    )
    delta = number(3, start_time_unix_nano=T0_NS - SECOND, labels={"k": "v"})
    request = metrics_request(
        [
            Metric(name="g", gauge=Gauge(data_points=[number(1.5, labels={"a": True})])),
            Metric(
                name="c",
                sum=Sum(aggregation_temporality=DELTA, is_monotonic=True, data_points=[delta]),
            ),
            Metric(
                name="h",
                histogram=Histogram(aggregation_temporality=CUMULATIVE, data_points=[hist]),
            ),
            Metric(
                name="e",
                exponential_histogram=ExponentialHistogram(
                    aggregation_temporality=DELTA, data_points=[exp]
                ),
            ),
            Metric(name="s", summary=Summary(data_points=[summary])),
        ]
    )
    return bytes(request.SerializeToString())


def test_every_metric_type_is_submitted_once_and_counted() -> None:
    registry = CollectorRegistry()
    submitted = Collected()
    result = receiver(registry).export(
        Signal.METRICS,
        gzip.compress(every_metric_type()),
        content_type="application/x-protobuf",
        content_encoding="gzip",
        project_id=1,
        max_series=1000,
        submit=submitted,
    )
    assert result.media_type == "application/x-protobuf"
    assert ExportMetricsServiceResponse.FromString(result.body) == ExportMetricsServiceResponse()
    assert result.received == 5 and result.rejections.total == 0
    names = {batch.metric for batch in submitted.batches}
    assert names == {
        "g",
        "c_total",
        "h_bucket",
        "h_sum",
        "h_count",
        "e_bucket",
        "e_sum",
        "e_count",
        "s",
        "s_sum",
        "s_count",
    }
    assert (
        registry.get_sample_value("tuneloop_otlp_points_received_total", {"signal": "metrics"}) == 5
    )


def test_nothing_is_submitted_when_everything_is_rejected() -> None:
    submitted = Collected()
    body = metrics_request([Metric(name="g", gauge=Gauge(data_points=[number(float("nan"))]))])
    result = receiver().export(
        Signal.METRICS,
        json_format.MessageToJson(body).encode(),
        content_type="application/json",
        content_encoding=None,
        project_id=1,
        max_series=10,
        submit=submitted,
    )
    assert submitted.batches == []
    partial = json.loads(result.body)["partialSuccess"]
    assert partial["rejectedDataPoints"] == "1" and "non_finite_value" in partial["errorMessage"]


def test_a_refused_submission_propagates_and_nothing_is_counted() -> None:
    registry = CollectorRegistry()

    def refuse(_batches: Sequence[SeriesBatch]) -> None:
        raise RuntimeError("full")

    with pytest.raises(RuntimeError, match="full"):
        receiver(registry).export(
            Signal.METRICS,
            every_metric_type(),
            content_type="application/x-protobuf",
            content_encoding=None,
            project_id=1,
            max_series=1000,
            submit=refuse,
        )
    assert registry.get_sample_value(
        "tuneloop_otlp_points_received_total", {"signal": "metrics"}
    ) in (None, 0.0)


def _mutations(body: bytes, rng: random.Random) -> bytes:
    data = bytearray(body)
    for _ in range(1 if rng.random() < 0.7 else rng.randint(2, 6)):
        choice = rng.random()
        if choice < 0.6 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif choice < 0.7 and data:
            del data[rng.randrange(len(data)) :]
        elif choice < 0.85:
            position = rng.randrange(len(data) + 1)
            data[position:position] = rng.randbytes(rng.randint(1, 16))
        elif data:
            start = rng.randrange(len(data))
            data[start:start] = data[start : start + rng.randint(1, 64)]
    return bytes(data)


def test_no_input_crashes_the_receiver() -> None:
    """Random corruptions of valid protobuf and JSON bodies of both signals: each is either
    answered (200, maybe with rejections) or refused with an OtlpError, never anything else."""
    rng = random.Random(20261122)
    step = span(
        "tuneloop.step", T0_NS, T0_NS + SECOND, span_id=b"s" * 8, labels={"tuneloop.job": "j"}
    )
    phase = span("tuneloop.phase.forward", T0_NS, T0_NS + 1, span_id=b"p" * 8, parent=b"s" * 8)
    traces = traces_request([step, phase])
    seeds = [
        (Signal.METRICS, "application/x-protobuf", every_metric_type()),
        (Signal.TRACES, "application/x-protobuf", traces.SerializeToString()),
        (
            Signal.METRICS,
            "application/json",
            json_format.MessageToJson(
                metrics_request([Metric(name="g", gauge=Gauge(data_points=[number(1.0)]))])
            ).encode(),
        ),
        (Signal.TRACES, "application/json", json_format.MessageToJson(traces).encode()),
    ]
    the_receiver = receiver(CollectorRegistry())
    outcomes = {"ok": 0, "refused": 0}
    for _ in range(3000):
        signal, content_type, seed = rng.choice(seeds)
        body = _mutations(seed, rng)
        compressed = rng.random() < 0.2
        try:
            the_receiver.export(
                signal,
                gzip.compress(body) if compressed else body,
                content_type=content_type,
                content_encoding="gzip" if compressed else None,
                project_id=1,
                max_series=100,
                submit=Collected(),
            )
            outcomes["ok"] += 1
        except OtlpError as exc:
            assert exc.status in (400, 413, 415)
            outcomes["refused"] += 1
    assert outcomes["ok"] > 300 and outcomes["refused"] > 300, outcomes
