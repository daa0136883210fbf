"""A training job instrumented with the real opentelemetry-sdk, as docs/step-timing.md tells
third parties to write it, exporting over OTLP/HTTP to a tuneloop API.

Protobuf goes through the SDK's own ``OTLPMetricExporter``/``OTLPSpanExporter``. The installed
exporter speaks no JSON, so for JSON the same SDK data is encoded by the SDK's own OTLP encoder
and written as OTLP/JSON (``json_format`` plus the spec's hex ids and integer enums) by the two
small exporters below.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from google.protobuf import json_format
from google.protobuf.message import Message
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import Counter, MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

SECOND = 1_000_000_000
MS = 1_000_000
JOB = {"job": "llama-e2e", "rank": "0"}
"""The labels of the job's step-timing series."""
_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def otlp_json(message: Message) -> bytes:
    """``message`` as OTLP/JSON: camelCase, enums as integers, trace and span ids as hex."""
    document = json_format.MessageToDict(message, use_integers_for_enums=True)
    _hex_ids(document)
    return json.dumps(document).encode()


def _hex_ids(node: Any) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_KEYS and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                _hex_ids(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids(item)


@dataclass
class _JsonPoster:
    endpoint: str
    headers: Mapping[str, str]
    gzip: bool

    def post(self, message: Message) -> bool:
        body = otlp_json(message)
        headers = {**self.headers, "Content-Type": "application/json"}
        if self.gzip:
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        response = httpx.post(self.endpoint, content=body, headers=headers, timeout=10)
        return response.status_code == 200 and not response.json().get("partialSuccess")


class JsonMetricExporter(MetricExporter):
    def __init__(
        self, poster: _JsonPoster, preferred_temporality: dict[type, AggregationTemporality]
    ) -> None:
        super().__init__(preferred_temporality=preferred_temporality)
        self._poster = poster

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        ok = self._poster.post(encode_metrics(metrics_data))
        return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


class JsonSpanExporter(SpanExporter):
    def __init__(self, poster: _JsonPoster) -> None:
        self._poster = poster

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        ok = self._poster.post(encode_spans(spans))
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE


def _exporters(
    base_url: str, token: str, encoding: str, use_gzip: bool, temporality: AggregationTemporality
) -> tuple[MetricExporter, SpanExporter]:
    headers = {"Authorization": f"Bearer {token}"}
    preferred: dict[type, AggregationTemporality] = {Counter: temporality}
    if encoding == "json":
        metrics = _JsonPoster(f"{base_url}/v1/metrics", headers, use_gzip)
        spans = _JsonPoster(f"{base_url}/v1/traces", headers, use_gzip)
        return JsonMetricExporter(metrics, preferred), JsonSpanExporter(spans)
    compression = Compression.Gzip if use_gzip else Compression.NoCompression
    return (
        OTLPMetricExporter(
            endpoint=f"{base_url}/v1/metrics",
            headers=headers,
            compression=compression,
            preferred_temporality=preferred,
        ),
        OTLPSpanExporter(
            endpoint=f"{base_url}/v1/traces", headers=headers, compression=compression
        ),
    )


def run_job(
    base_url: str, token: str, *, encoding: str, use_gzip: bool, step_start_ns: int
) -> None:
    """Train "two steps" of job ``llama-e2e`` (rank 0) and export, flushing after each:

    * ``train.samples`` counter (cumulative): +64 per step -> 128;
    * ``train.tokens`` counter (exported as DELTA): +5, then +7 -> 12 once accumulated;
    * ``gpu.memory.used`` gauge (bytes) on gpu 0: 3.5e9 then 4.25e9;
    * ``train.step.duration`` histogram (s), bounds 0.1, 0.25, 0.5, 1: 0.2, 0.3 in the first
      export, 0.3, 0.7 in the second;
    * one ``tuneloop.step`` span of 500 ms (step 7, 64 samples) at ``step_start_ns``, with
      data_loading 50 ms, forward 100 + 100 ms, backward 120 + 110 ms, optimizer 20 ms.
    """
    resource = Resource.create({"service.name": "e2e-trainer", "tuneloop.job": "llama-e2e"})
    cumulative_exporter, span_exporter = _exporters(
        base_url, token, encoding, use_gzip, AggregationTemporality.CUMULATIVE
    )
    delta_exporter, _ = _exporters(
        base_url, token, encoding, use_gzip, AggregationTemporality.DELTA
    )
    hour = 3_600_000
    meters = MeterProvider(
        resource=resource,
        metric_readers=[
            PeriodicExportingMetricReader(cumulative_exporter, export_interval_millis=hour)
        ],
    )
    delta_meters = MeterProvider(
        resource=resource,
        metric_readers=[PeriodicExportingMetricReader(delta_exporter, export_interval_millis=hour)],
    )
    tracers = TracerProvider(resource=resource)
    tracers.add_span_processor(BatchSpanProcessor(span_exporter))
    try:
        meter = meters.get_meter("e2e-job", "1.0")
        samples = meter.create_counter("train.samples", unit="{sample}")
        memory = meter.create_gauge("gpu.memory.used", unit="By")
        step_time = meter.create_histogram(
            "train.step.duration",
            unit="s",
            explicit_bucket_boundaries_advisory=[0.1, 0.25, 0.5, 1.0],
        )
        tokens = delta_meters.get_meter("e2e-job").create_counter("train.tokens")
        for memory_used, step_times, new_tokens in (
            (3.5e9, (0.2, 0.3), 5),
            (4.25e9, (0.3, 0.7), 7),
        ):
            samples.add(64)
            memory.set(memory_used, {"gpu": "0"})
            for seconds in step_times:
                step_time.record(seconds)
            tokens.add(new_tokens)
            assert meters.force_flush() and delta_meters.force_flush()
        _one_step(tracers.get_tracer("e2e-job"), step_start_ns)
        assert tracers.force_flush()
    finally:
        meters.shutdown()
        delta_meters.shutdown()
        tracers.shutdown()


def _one_step(tracer: trace.Tracer, t: int) -> None:
    step = tracer.start_span(
        "tuneloop.step",
        start_time=t,
        attributes={"tuneloop.step": 7, "tuneloop.samples": 64, "tuneloop.rank": 0},
    )
    context = trace.set_span_in_context(step)
    for phase, begin, end in (
        ("data_loading", 0, 50),
        ("forward", 50, 150),
        ("backward", 150, 270),
        ("forward", 270, 370),
        ("backward", 370, 480),
        ("optimizer", 480, 500),
    ):
        tracer.start_span(
            f"tuneloop.phase.{phase}", context=context, start_time=t + begin * MS
        ).end(end_time=t + end * MS)
    step.end(end_time=t + 500 * MS)
