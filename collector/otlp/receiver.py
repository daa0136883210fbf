"""The OTLP receiver: an export request's body in, series handed to ``submit``, the export
response out. Framework-free, so it is tested without HTTP; the route adds authentication,
the body size limit while reading, and status codes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from collector.otlp import decode
from collector.otlp.common import Rejections
from collector.otlp.delta import DeltaAccumulator
from collector.otlp.metrics import map_metrics
from collector.otlp.series_cache import LabelCache
from collector.otlp.shapes import Recorded, ShapeCache
from collector.otlp.telemetry import OtlpTelemetry
from collector.otlp.traces import map_spans
from tuneloop.storage.timeseries.columns import Batch

Submit = Callable[[Sequence[Batch]], None]
"""Hands batches on for writing; raises (``PipelineFull``) to refuse them all."""


class Signal(StrEnum):
    METRICS = "metrics"
    TRACES = "traces"


@dataclass(frozen=True, slots=True)
class ExportResult:
    body: bytes
    media_type: str
    received: int
    rejections: Rejections


class OtlpReceiver:
    """Decodes, maps and submits export requests. One per API process: it holds the delta
    accumulator (:mod:`collector.otlp.delta`) and the label cache
    (:mod:`collector.otlp.series_cache`). Safe to share between threads."""

    def __init__(
        self,
        *,
        max_body_bytes: int,
        telemetry: OtlpTelemetry | None = None,
        deltas: DeltaAccumulator | None = None,
        labels: LabelCache | None = None,
        shapes: ShapeCache | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.max_body_bytes = max_body_bytes
        self.telemetry = telemetry
        self.deltas = deltas if deltas is not None else DeltaAccumulator()
        # Labels of the series seen before: a periodic exporter sends every series again in
        # each request, so most are computed once per process, not once per request.
        self.labels = labels if labels is not None else LabelCache()
        # Shapes of the requests seen: an exporter repeating a request's shape with new
        # numbers has the next ones read in bulk (collector.otlp.shapes).
        self.shapes = shapes if shapes is not None else ShapeCache()
        self.clock = clock

    def export(
        self,
        signal: Signal,
        body: bytes,
        *,
        content_type: str | None,
        content_encoding: str | None,
        project_id: int,
        max_series: int,
        submit: Submit,
    ) -> ExportResult:
        """Handle one export request. Raises ``decode.OtlpError`` for a request refused as a
        whole, and whatever ``submit`` raises; then nothing was stored or counted."""
        if signal is Signal.METRICS:
            result = self._metrics(
                body, content_type, content_encoding, project_id, max_series, submit
            )
        else:
            result = self._traces(body, content_type, content_encoding, max_series, submit)
        if self.telemetry is not None:
            self.telemetry.points(signal.value, result.received, result.rejections)
        return result

    def _metrics(
        self,
        body: bytes,
        content_type: str | None,
        content_encoding: str | None,
        project_id: int,
        max_series: int,
        submit: Submit,
    ) -> ExportResult:
        encoding = decode.encoding_of(content_type)
        payload = decode.decompress(body, content_encoding, self.max_body_bytes)
        now = self.clock()
        protobuf = encoding is decode.Encoding.PROTOBUF
        if protobuf:
            columns = self.shapes.match(payload, now, max_series)
            if columns is not None:
                submit([columns])
                return _result(ExportMetricsServiceResponse(), encoding, len(columns), Rejections())
        request = decode.parse(payload, encoding, ExportMetricsServiceRequest())
        record: list[Recorded] | None = [] if protobuf and self.shapes.wants(payload) else None
        mapped = map_metrics(
            request,
            project_id=project_id,
            now=now,
            max_series=max_series,
            deltas=self.deltas,
            cache=self.labels,
            record=record,
        )
        if mapped.batches:
            submit(mapped.batches)
        if record is not None and not mapped.rejections.total:
            self.shapes.learn(payload, record, mapped.points)
        response = ExportMetricsServiceResponse()
        if mapped.rejections.total:
            response.partial_success.rejected_data_points = mapped.rejections.total
            response.partial_success.error_message = mapped.rejections.summary("data points")
        return _result(response, encoding, mapped.points, mapped.rejections)

    def _traces(
        self,
        body: bytes,
        content_type: str | None,
        content_encoding: str | None,
        max_series: int,
        submit: Submit,
    ) -> ExportResult:
        request, encoding = decode.decode(
            body, content_type, content_encoding, ExportTraceServiceRequest(), self.max_body_bytes
        )
        mapped = map_spans(request, now=self.clock(), max_series=max_series)
        if mapped.batches:
            submit(mapped.batches)
        response = ExportTraceServiceResponse()
        if mapped.rejections.total:
            response.partial_success.rejected_spans = mapped.rejections.total
            response.partial_success.error_message = mapped.rejections.summary("spans")
        return _result(response, encoding, mapped.spans, mapped.rejections)


def _result(
    response: ExportMetricsServiceResponse | ExportTraceServiceResponse,
    encoding: decode.Encoding,
    received: int,
    rejections: Rejections,
) -> ExportResult:
    return ExportResult(
        decode.encode(response, encoding), decode.MEDIA_TYPES[encoding], received, rejections
    )
