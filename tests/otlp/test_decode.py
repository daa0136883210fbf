"""The OTLP/HTTP wire format: content types, gzip/deflate, protobuf and OTLP/JSON."""

from __future__ import annotations

import base64
import gzip
import json
import zlib

import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, Gauge, Metric, Sum

from collector.otlp import decode
from collector.otlp.decode import Encoding
from tests.otlp.builders import T0_NS, metrics_request, number

LIMIT = 1 << 20


def sample_request() -> ExportMetricsServiceRequest:
    return metrics_request([Metric(name="util", gauge=Gauge(data_points=[number(0.5)]))])


def parse_metrics(
    body: bytes, content_type: str, encoding: str | None = None
) -> ExportMetricsServiceRequest:
    message, _ = decode.decode(body, content_type, encoding, ExportMetricsServiceRequest(), LIMIT)
    return message


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        ("application/x-protobuf", Encoding.PROTOBUF),
        ("application/protobuf", Encoding.PROTOBUF),
        ("Application/X-Protobuf; charset=binary", Encoding.PROTOBUF),
        ("application/json", Encoding.JSON),
        ("application/json; charset=utf-8", Encoding.JSON),
        ("application/json;charset=UTF-8", Encoding.JSON),
    ],
)
def test_content_types_and_their_parameters(content_type: str, expected: Encoding) -> None:
    assert decode.encoding_of(content_type) is expected


@pytest.mark.parametrize("content_type", [None, "", "text/plain", "application/grpc", "json"])
def test_unknown_content_type_is_415(content_type: str | None) -> None:
    with pytest.raises(decode.UnsupportedMediaType) as caught:
        decode.encoding_of(content_type)
    assert caught.value.status == 415


def test_protobuf_round_trip_with_gzip_deflate_and_identity() -> None:
    raw = sample_request().SerializeToString()
    for body, coding in [
        (raw, None),
        (raw, "identity"),
        (gzip.compress(raw), "gzip"),
        (gzip.compress(raw), "x-gzip"),
        (zlib.compress(raw), "deflate"),
        (zlib.compress(raw)[2:-4], "deflate"),  # raw deflate, no zlib header
        (gzip.compress(gzip.compress(raw)), "gzip, gzip"),
        (gzip.compress(raw[:10]) + gzip.compress(raw[10:]), "gzip"),  # two gzip members
    ]:
        assert parse_metrics(body, "application/x-protobuf", coding) == sample_request(), coding


def test_unknown_content_encoding_is_415() -> None:
    with pytest.raises(decode.UnsupportedMediaType, match="br"):
        parse_metrics(b"", "application/x-protobuf", "br")


def test_gzip_bomb_is_413_without_inflating_it() -> None:
    bomb = gzip.compress(b"\0" * (64 * LIMIT))  # 64 MiB of zeros in ~64 KiB
    assert len(bomb) < LIMIT
    with pytest.raises(decode.PayloadTooLarge) as caught:
        parse_metrics(bomb, "application/x-protobuf", "gzip")
    assert caught.value.status == 413


def test_decompressed_size_exactly_at_the_limit_passes() -> None:
    assert decode.decompress(gzip.compress(b"x" * LIMIT), "gzip", LIMIT) == b"x" * LIMIT
    with pytest.raises(decode.PayloadTooLarge):
        decode.decompress(gzip.compress(b"x" * (LIMIT + 1)), "gzip", LIMIT)


def test_uncompressed_body_over_the_limit_is_413() -> None:
    with pytest.raises(decode.PayloadTooLarge):
        decode.decompress(b"x" * (LIMIT + 1), None, LIMIT)


@pytest.mark.parametrize(
    "body",
    [
        b"not gzip at all",
        gzip.compress(b"payload", mtime=0)[:-6],
        gzip.compress(b"a", mtime=0) + b"trailing junk",
        b"",
    ],
    # Named, not shown: ids must be the same in every pytest-xdist worker's collection.
    ids=["not-gzip", "truncated", "trailing-junk", "empty"],
)
def test_broken_gzip_is_400(body: bytes) -> None:
    with pytest.raises(decode.MalformedPayload) as caught:
        parse_metrics(body, "application/x-protobuf", "gzip")
    assert caught.value.status == 400


@pytest.mark.parametrize(
    "body",
    [
        b"\xff\xff\xff\xff",  # truncated varint tag
        b"\x0a\xff\x01",  # length-delimited field longer than the body
        b"\x0a" + b"\x0a\x80" * 200,  # nesting past the recursion limit, truncated
        bytes(range(256)),
    ],
)
def test_malformed_protobuf_is_400(body: bytes) -> None:
    with pytest.raises(decode.MalformedPayload):
        parse_metrics(body, "application/x-protobuf")


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    length, size = b"", len(payload)
    while True:
        length += bytes([(size & 0x7F) | (0x80 if size > 0x7F else 0)])
        size >>= 7
        if not size:
            break
    return bytes([number << 3 | 2]) + length + payload


def test_deep_protobuf_nesting_is_400_not_a_crash() -> None:
    # An attribute value that is an array of an array of ... 1,000 deep.
    value = b""
    for _ in range(1000):
        value = _field(5, _field(1, value))  # AnyValue.array_value -> ArrayValue.values
    attribute = _field(2, value)  # KeyValue.value
    body = _field(1, _field(1, _field(1, attribute)))  # resource_metrics.resource.attributes
    with pytest.raises(decode.MalformedPayload):
        parse_metrics(body, "application/x-protobuf")


@pytest.mark.parametrize(
    "body",
    [b"{", b"[]", b'"text"', b"\xff\xfe garbage", b"[" * 100_000, b'{"a":' * 100_000],
)
def test_malformed_json_is_400(body: bytes) -> None:
    for message in (ExportTraceServiceRequest(), ExportMetricsServiceRequest()):
        with pytest.raises(decode.MalformedPayload):
            decode.decode(body, "application/json", None, message, LIMIT)


@pytest.mark.parametrize(
    "document",
    [
        {"resourceMetrics": 5},
        {
            "resourceMetrics": [
                {"scopeMetrics": [{"metrics": [{"gauge": {"dataPoints": [{"asDouble": "x"}]}}]}]}
            ]
        },
        {
            "resourceMetrics": [
                {"scopeMetrics": [{"metrics": [{"gauge": {"dataPoints": [{"timeUnixNano": -1}]}}]}]}
            ]
        },
    ],
)
def test_json_of_the_wrong_shape_is_400(document: object) -> None:
    with pytest.raises(decode.MalformedPayload):
        parse_metrics(json.dumps(document).encode(), "application/json")


@pytest.mark.parametrize(
    "span",
    [
        {"traceId": "zz"},
        {"traceId": "0102"},  # hex, but not 16 bytes
        {"spanId": "00" * 16},  # a trace id's length
        {"parentSpanId": "AQIDBAUGBwgJ"},  # base64 of 9 bytes
    ],
)
def test_invalid_ids_are_400(span: dict[str, str]) -> None:
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()
    with pytest.raises(decode.MalformedPayload, match="hex digits"):
        decode.decode(body, "application/json", None, ExportTraceServiceRequest(), LIMIT)


def test_otlp_json_quirks_camel_and_snake_case_int_enums_int64_strings_unknown_fields() -> None:
    document = {
        "resourceMetrics": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "t"}}]
                },
                "scope_metrics": [  # snake_case
                    {
                        "metrics": [
                            {
                                "name": "steps",
                                "sum": {
                                    "aggregationTemporality": 2,  # enum as an integer
                                    "is_monotonic": True,
                                    "dataPoints": [
                                        {"timeUnixNano": str(T0_NS), "asInt": "42"},  # strings
                                        {"time_unix_nano": T0_NS + 1, "as_int": 43},  # numbers
                                    ],
                                },
                                "someFutureField": {"x": 1},  # unknown: ignored
                            }
                        ]
                    }
                ],
            }
        ]
    }
    message = parse_metrics(json.dumps(document).encode(), "application/json")
    metric = message.resource_metrics[0].scope_metrics[0].metrics[0]
    assert (
        metric.sum.aggregation_temporality
        == AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
    )
    assert metric.sum.is_monotonic
    assert [(p.time_unix_nano, p.as_int) for p in metric.sum.data_points] == [
        (T0_NS, 42),
        (T0_NS + 1, 43),
    ]
    assert isinstance(metric.sum, Sum)


def test_otlp_json_ids_are_hex_and_base64_is_still_understood() -> None:
    trace_id, span_id = bytes(range(16)), bytes(range(8, 16))
    document = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": trace_id.hex(),
                                "spanId": span_id.hex().upper(),
                                "parentSpanId": "",
                                "name": "a",
                                "links": [{"trace_id": trace_id.hex(), "span_id": span_id.hex()}],
                            },
                            {
                                "traceId": base64.b64encode(trace_id).decode(),
                                "spanId": base64.b64encode(span_id).decode(),
                                "name": "b",
                            },
                        ]
                    }
                ]
            }
        ]
    }
    message, encoding = decode.decode(
        json.dumps(document).encode(), "application/json", None, ExportTraceServiceRequest(), LIMIT
    )
    assert encoding is Encoding.JSON
    first, second = message.resource_spans[0].scope_spans[0].spans
    assert (first.trace_id, first.span_id, first.parent_span_id) == (trace_id, span_id, b"")
    assert (first.links[0].trace_id, first.links[0].span_id) == (trace_id, span_id)
    assert (second.trace_id, second.span_id) == (trace_id, span_id)


def test_json_nan_and_infinity_parse_as_doubles_when_quoted() -> None:
    body = (
        b'{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"g","gauge":{"dataPoints":'
        b'[{"asDouble":"NaN"},{"asDouble":"-Infinity"}]}}]}]}]}'
    )
    points = parse_metrics(body, "application/json").resource_metrics[0].scope_metrics[0]
    values = [p.as_double for p in points.metrics[0].gauge.data_points]
    assert values[0] != values[0] and values[1] == float("-inf")
    with pytest.raises(decode.MalformedPayload):  # a bare NaN is not JSON
        parse_metrics(body.replace(b'"NaN"', b"NaN"), "application/json")


def test_responses_are_encoded_in_the_request_encoding() -> None:
    response = ExportMetricsServiceResponse()
    response.partial_success.rejected_data_points = 3
    response.partial_success.error_message = "bad"
    proto = decode.encode(response, Encoding.PROTOBUF)
    assert ExportMetricsServiceResponse.FromString(proto) == response
    assert json.loads(decode.encode(response, Encoding.JSON)) == {
        "partialSuccess": {"rejectedDataPoints": "3", "errorMessage": "bad"}
    }
    assert decode.encode(ExportMetricsServiceResponse(), Encoding.JSON) == b"{}"


@pytest.mark.parametrize("message", ["", "short", "é" * 300])
def test_status_body_is_a_google_rpc_status(message: str) -> None:
    status = status_pb2.Status.FromString(decode.status_body(400, message, Encoding.PROTOBUF))
    assert (status.code, status.message) == (3, message)
    assert json.loads(decode.status_body(503, message, Encoding.JSON)) == {
        "code": 14,
        "message": message,
    }


def test_error_messages_stay_short_whatever_the_payload() -> None:
    body = json.dumps({"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"gauge": {
        "dataPoints": [{"asDouble": "x" * 100_000}]}}]}]}]}).encode()  # fmt: skip
    with pytest.raises(decode.MalformedPayload) as caught:
        parse_metrics(body, "application/json")
    assert len(caught.value.message) <= 1_003
