"""POST /v1/metrics and /v1/traces over HTTP, on real SQLite and PostgreSQL: encodings,
statuses, partial success, authentication, and what ends up stored."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from google.protobuf import json_format
from google.rpc import status_pb2
from httpx import Response
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, Gauge, Metric, Sum

from api.main import create_app
from tests.api.conftest import Minter, bearer
from tests.otlp.builders import SECOND, T0_NS, metrics_request, number, span, traces_request
from tests.otlp.conftest import MAX_BODY, eventually, make_pipeline
from tuneloop.runtime import Runtime
from tuneloop.storage.timeseries.query import latest

PROTOBUF = "application/x-protobuf"


@pytest.fixture
def alpha(mint: Minter) -> tuple[int, dict[str, str]]:
    project_id = mint.project("alpha")
    return project_id, bearer(mint.token("alpha", "agent", "trainer-agent"))


def post(
    client: TestClient,
    path: str,
    body: bytes,
    token: dict[str, str],
    content_type: str = PROTOBUF,
    **headers: str,
) -> Response:
    return client.post(
        path, content=body, headers={**token, "Content-Type": content_type, **headers}
    )


def stored(runtime: Runtime, project_id: int, metric: str) -> dict[str, float]:
    """Latest value of each series of ``metric``, keyed by its ``gpu`` (or ``phase``) label."""
    return {
        s.series.labels.get("gpu", s.series.labels.get("phase", "")): s.value
        for s in latest(runtime.engine, project_id, metric)
    }


def sample_metrics() -> ExportMetricsServiceRequest:
    counter = Sum(
        aggregation_temporality=AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE,
        is_monotonic=True,
        data_points=[number(1234, labels={"gpu": "0"})],
    )
    return metrics_request(
        [
            Metric(
                name="gpu.utilization",
                unit="1",
                gauge=Gauge(data_points=[number(0.75, labels={"gpu": "0"})]),
            ),
            Metric(name="train.samples", sum=counter),
        ]
    )


def test_protobuf_export_is_stored_and_answered_with_an_empty_response(
    client: TestClient, runtime: Runtime, alpha: tuple[int, dict[str, str]]
) -> None:
    project_id, token = alpha
    response = post(client, "/v1/metrics", sample_metrics().SerializeToString(), token)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == PROTOBUF
    assert (
        ExportMetricsServiceResponse.FromString(response.content) == ExportMetricsServiceResponse()
    )
    assert eventually(lambda: stored(runtime, project_id, "gpu_utilization_ratio")) == {"0": 0.75}
    assert eventually(lambda: stored(runtime, project_id, "train_samples_total")) == {"0": 1234.0}


def test_gzip_protobuf_export(
    client: TestClient, runtime: Runtime, alpha: tuple[int, dict[str, str]]
) -> None:
    project_id, token = alpha
    body = gzip.compress(sample_metrics().SerializeToString())
    response = post(client, "/v1/metrics", body, token, **{"Content-Encoding": "gzip"})
    assert response.status_code == 200, response.text
    assert eventually(lambda: stored(runtime, project_id, "train_samples_total")) == {"0": 1234.0}


def test_json_export_gets_a_json_partial_success_and_the_rest_is_stored(
    client: TestClient, runtime: Runtime, alpha: tuple[int, dict[str, str]]
) -> None:
    project_id, token = alpha
    request = metrics_request(
        [
            Metric(
                name="gpu.temperature",
                unit="Cel",
                gauge=Gauge(
                    data_points=[
                        number(64.0, labels={"gpu": "0"}),
                        number(float("nan"), labels={"gpu": "1"}),
                        number(65.0, 0, labels={"gpu": "2"}),
                        number(66.0, labels={"gpu": "3", "note": "x" * 5000}),
                        number(67.0, T0_NS + SECOND, labels={"gpu": "4"}),
                    ]
                ),
            )
        ]
    )
    body = json_format.MessageToJson(request).encode()
    response = post(client, "/v1/metrics", body, token, "application/json; charset=utf-8")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    partial = response.json()["partialSuccess"]
    assert partial["rejectedDataPoints"] == "3"
    message = partial["errorMessage"]
    assert message.startswith("rejected 3 data points: ")
    for reason in ("non_finite_value x1", "timestamp_out_of_range x1", "label_too_long x1"):
        assert reason in message
    assert eventually(lambda: len(stored(runtime, project_id, "gpu_temperature_celsius")) == 2)
    assert stored(runtime, project_id, "gpu_temperature_celsius") == {"0": 64.0, "4": 67.0}


def test_traces_become_step_timing(
    client: TestClient, runtime: Runtime, alpha: tuple[int, dict[str, str]]
) -> None:
    project_id, token = alpha
    step = span(
        "tuneloop.step",
        T0_NS,
        T0_NS + SECOND // 4,
        span_id=b"s" * 8,
        labels={"tuneloop.job": "llama", "tuneloop.samples": 32},
    )
    forward = span(
        "tuneloop.phase.forward", T0_NS, T0_NS + SECOND // 8, span_id=b"f" * 8, parent=b"s" * 8
    )
    typo = span("tuneloop.phase.Forward", T0_NS, T0_NS + 1, span_id=b"t" * 8, parent=b"s" * 8)
    body = traces_request([step, forward, typo]).SerializeToString()
    response = post(client, "/v1/traces", body, token)
    assert response.status_code == 200, response.text
    answer = ExportTraceServiceResponse.FromString(response.content)
    assert answer.partial_success.rejected_spans == 1
    assert "invalid_phase" in answer.partial_success.error_message
    assert eventually(lambda: stored(runtime, project_id, "tuneloop_samples_per_second")) == {
        "": 128.0
    }
    assert stored(runtime, project_id, "tuneloop_step_duration_seconds") == {"": 0.25}
    assert eventually(lambda: stored(runtime, project_id, "tuneloop_step_phase_seconds")) == {
        "forward": 0.125
    }


@pytest.mark.parametrize("content_type", ["text/plain", "application/grpc", None])
def test_unknown_content_type_is_415(
    client: TestClient, alpha: tuple[int, dict[str, str]], content_type: str | None
) -> None:
    headers = dict(alpha[1])
    if content_type is not None:
        headers["Content-Type"] = content_type
    response = client.post("/v1/metrics", content=b"x", headers=headers)
    assert response.status_code == 415
    assert response.json()["code"] == 3 and "content type" in response.json()["message"]


def test_malformed_bodies_are_400_with_a_status_in_the_request_encoding(
    client: TestClient, alpha: tuple[int, dict[str, str]]
) -> None:
    token = alpha[1]
    response = post(client, "/v1/metrics", b"\xff\xff\xff", token)
    assert response.status_code == 400 and response.headers["content-type"] == PROTOBUF
    status = status_pb2.Status.FromString(response.content)
    assert status.code == 3 and "protobuf" in status.message
    response = post(client, "/v1/traces", b"{not json", token, "application/json")
    assert response.status_code == 400 and response.json()["code"] == 3
    response = post(client, "/v1/metrics", b"plain", token, **{"Content-Encoding": "gzip"})
    assert response.status_code == 400
    response = post(client, "/v1/metrics", b"", token, **{"Content-Encoding": "br"})
    assert response.status_code == 415


def test_bodies_over_the_limit_are_413(
    client: TestClient, alpha: tuple[int, dict[str, str]]
) -> None:
    token = alpha[1]
    assert post(client, "/v1/metrics", b"\0" * (MAX_BODY + 1), token).status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: refused while reading
        for _ in range(MAX_BODY // 1024 + 2):
            yield b"\0" * 1024

    response = client.post(
        "/v1/metrics", content=chunks(), headers={**token, "Content-Type": PROTOBUF}
    )
    assert response.status_code == 413
    bomb = gzip.compress(b"\0" * (MAX_BODY * 100))
    assert len(bomb) < MAX_BODY
    response = post(client, "/v1/metrics", bomb, token, **{"Content-Encoding": "gzip"})
    assert response.status_code == 413
    assert status_pb2.Status.FromString(response.content).code == 8


def test_authentication(
    client: TestClient, mint: Minter, alpha: tuple[int, dict[str, str]]
) -> None:
    body = sample_metrics().SerializeToString()
    assert post(client, "/v1/metrics", body, {}).status_code == 401
    assert post(client, "/v1/metrics", body, bearer("tl_nope")).status_code == 401
    response = post(client, "/v1/traces", body, bearer(mint.admin()))
    assert response.status_code == 403
    assert "project token" in response.json()["detail"]
    member = bearer(mint.token("alpha", "member", "alice"))
    assert post(client, "/v1/metrics", body, member).status_code == 200


def test_a_full_pipeline_is_503_with_retry_after(
    runtime: Runtime, alpha: tuple[int, dict[str, str]]
) -> None:
    pipeline = make_pipeline(runtime, queue_max_samples=1)  # never started: nothing drains
    with TestClient(create_app(runtime, pipeline)) as client:
        body = sample_metrics().SerializeToString()
        assert post(client, "/v1/metrics", body, alpha[1]).status_code == 200
        response = post(client, "/v1/metrics", body, alpha[1])
        assert response.status_code == 503
        assert int(response.headers["retry-after"]) >= 1
        assert status_pb2.Status.FromString(response.content).code == 14
        json_body = json_format.MessageToJson(sample_metrics()).encode()
        response = post(client, "/v1/metrics", json_body, alpha[1], "application/json")
        assert response.status_code == 503 and response.json()["code"] == 14
    pipeline.stop(timeout_s=1)


def test_requests_and_points_are_counted_on_the_metrics_endpoint(
    client: TestClient, alpha: tuple[int, dict[str, str]]
) -> None:
    token = alpha[1]
    request = sample_metrics()
    request.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].as_double = float(
        "inf"
    )
    post(client, "/v1/metrics", request.SerializeToString(), token)
    post(client, "/v1/metrics", b"x", token, "text/plain")
    text = client.get("/metrics").text
    for line in (
        'tuneloop_otlp_requests_total{code="200",encoding="protobuf",signal="metrics"} 1.0',
        'tuneloop_otlp_requests_total{code="415",encoding="unknown",signal="metrics"} 1.0',
        'tuneloop_otlp_points_received_total{signal="metrics"} 2.0',
        'tuneloop_otlp_points_rejected_total{reason="non_finite_value",signal="metrics"} 1.0',
    ):
        assert line in text, line


def test_project_series_cap_limits_one_request(
    mint: Minter, client: TestClient, runtime: Runtime
) -> None:
    from tuneloop import accounts
    from tuneloop.storage import session_scope

    with session_scope(runtime.sessions) as session:
        accounts.create_project(session, "tiny", max_series=2)
    token = bearer(mint.token("tiny", "agent"))
    points = [number(float(i), labels={"gpu": str(i)}) for i in range(4)]
    body = metrics_request([Metric(name="g", gauge=Gauge(data_points=points))]).SerializeToString()
    answer = ExportMetricsServiceResponse.FromString(
        post(client, "/v1/metrics", body, token).content
    )
    assert answer.partial_success.rejected_data_points == 2
    assert "too_many_series" in answer.partial_success.error_message


def test_json_and_protobuf_error_bodies_match_the_spec_shape(
    client: TestClient, alpha: tuple[int, dict[str, str]]
) -> None:
    response = post(client, "/v1/metrics", b"[]", alpha[1], "application/json")
    assert response.status_code == 400
    assert set(json.loads(response.content)) == {"code", "message"}
