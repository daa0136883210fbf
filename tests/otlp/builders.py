"""Small builders of OTLP protobuf messages, so tests state only what they are about."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
T0_NS = int(datetime(2026, 11, 22, 11, 0, tzinfo=UTC).timestamp()) * 1_000_000_000
"""An hour before NOW, in Unix nanoseconds."""
SECOND = 1_000_000_000

Attrs = Mapping[str, str | int | float | bool]


def any_value(value: str | int | float | bool) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=value)


def attrs(values: Attrs | None = None) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in (values or {}).items()]


def number(
    value: float | int, t_ns: int = T0_NS, labels: Attrs | None = None, **kw: object
) -> NumberDataPoint:
    point = NumberDataPoint(time_unix_nano=t_ns, attributes=attrs(labels), **kw)  # type: ignore[arg-type]
    if isinstance(value, int):
        point.as_int = value
    else:
        point.as_double = value
    return point


def metrics_request(
    metrics: Iterable[Metric],
    resource: Attrs | None = None,
    scope: str = "",
) -> ExportMetricsServiceRequest:
    return ExportMetricsServiceRequest(
        resource_metrics=[
            ResourceMetrics(
                resource=Resource(attributes=attrs(resource or {"service.name": "trainer"})),
                scope_metrics=[
                    ScopeMetrics(scope=InstrumentationScope(name=scope), metrics=list(metrics))
                ],
            )
        ]
    )


def span(
    name: str,
    start_ns: int,
    end_ns: int,
    *,
    span_id: bytes,
    parent: bytes = b"",
    trace_id: bytes = b"\x01" * 16,
    labels: Attrs | None = None,
) -> Span:
    return Span(
        name=name,
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent,
        start_time_unix_nano=start_ns,
        end_time_unix_nano=end_ns,
        attributes=attrs(labels),
    )


def traces_request(
    spans: Iterable[Span], resource: Attrs | None = None
) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=Resource(attributes=attrs(resource or {})),
                scope_spans=[ScopeSpans(spans=list(spans))],
            )
        ]
    )
