"""The OTLP/HTTP receiver: ``POST /v1/metrics`` and ``POST /v1/traces``.

At the root, not under ``/api/v1``: OpenTelemetry exporters append these paths to the
endpoint they are given, so ``OTEL_EXPORTER_OTLP_ENDPOINT=http://tuneloop:8000`` just works.
Authenticated with a project token (``Authorization: Bearer tl_...`` in
``OTEL_EXPORTER_OTLP_HEADERS``); the data goes to that token's project.

Per the OTLP/HTTP spec: the response is in the request's encoding (protobuf or JSON), 200 with
``partial_success`` when some points were rejected, and errors carry a ``google.rpc.Status``
body: 400 malformed, 413 over ``otlp_max_body_bytes`` (on the wire or decompressed), 415 an
unknown content type or encoding, 503 with ``Retry-After`` while the write pipeline is full.
The token's project is resolved by :mod:`api.ingest`, which keeps exports flowing into the
spool through a database outage.
"""

from __future__ import annotations

import math
import threading
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response, status
from starlette.concurrency import run_in_threadpool

from api.deps import AUTH_ERRORS, MetricsDep, PipelineDep, RuntimeDep
from api.ingest import TargetDep, read_body
from collector.fanout import WritePipeline
from collector.otlp import decode
from collector.otlp.receiver import OtlpReceiver, Signal
from collector.otlp.targets import Target
from collector.otlp.telemetry import telemetry_for
from collector.pipeline import PipelineFull

router = APIRouter(tags=["otlp"], responses=AUTH_ERRORS)

_PROTOBUF_OR_JSON: dict[str, Any] = {
    "content": {"application/x-protobuf": {}, "application/json": {}},
}
_RESPONSES: dict[int | str, dict[str, Any]] = {
    **AUTH_ERRORS,
    200: {**_PROTOBUF_OR_JSON, "description": "Accepted (see partial_success for rejections)"},
    400: {**_PROTOBUF_OR_JSON, "description": "Malformed payload (google.rpc.Status)"},
    413: {**_PROTOBUF_OR_JSON, "description": "Body over otlp_max_body_bytes"},
    415: {"description": "Unsupported content type or content encoding"},
    503: {**_PROTOBUF_OR_JSON, "description": "Pipeline full; retry after Retry-After"},
}
_RECEIVER_LOCK = threading.Lock()


def get_receiver(request: Request, runtime: RuntimeDep, metrics: MetricsDep) -> OtlpReceiver:
    """The app's one receiver (it holds the delta accumulator), made on first use."""
    state = request.app.state
    with _RECEIVER_LOCK:
        receiver = getattr(state, "otlp_receiver", None)
        if not isinstance(receiver, OtlpReceiver):
            receiver = OtlpReceiver(
                max_body_bytes=runtime.settings.otlp_max_body_bytes,
                telemetry=telemetry_for(metrics.registry),
            )
            state.otlp_receiver = receiver
    return receiver


ReceiverDep = Annotated[OtlpReceiver, Depends(get_receiver)]


@router.post(
    "/v1/metrics",
    response_class=Response,
    responses=_RESPONSES,
    summary="OTLP/HTTP metrics export (ExportMetricsServiceRequest)",
)
async def export_metrics(
    request: Request, target: TargetDep, receiver: ReceiverDep, pipeline: PipelineDep
) -> Response:
    return await _export(Signal.METRICS, request, target, receiver, pipeline)


@router.post(
    "/v1/traces",
    response_class=Response,
    responses=_RESPONSES,
    summary="OTLP/HTTP traces export (ExportTraceServiceRequest): step timing",
)
async def export_traces(
    request: Request, target: TargetDep, receiver: ReceiverDep, pipeline: PipelineDep
) -> Response:
    """Spans that follow docs/step-timing.md become step-timing series; others are ignored."""
    return await _export(Signal.TRACES, request, target, receiver, pipeline)


async def _export(
    signal: Signal,
    request: Request,
    target: Target,
    receiver: OtlpReceiver,
    pipeline: WritePipeline,
) -> Response:
    encoding: decode.Encoding | None = None
    try:
        encoding = decode.encoding_of(request.headers.get("content-type"))
        body = await read_body(
            request,
            receiver.max_body_bytes,
            too_large=decode.PayloadTooLarge,
            malformed=decode.MalformedPayload,
        )
        result = await run_in_threadpool(
            receiver.export,
            signal,
            body,
            content_type=request.headers.get("content-type"),
            content_encoding=request.headers.get("content-encoding"),
            project_id=target.project_id,
            max_series=target.max_series,
            submit=lambda batches: pipeline.submit(target.project_id, batches),
        )
        response = Response(result.body, media_type=result.media_type)
    except decode.OtlpError as exc:
        response = _status(exc.status, exc.message, encoding)
    except PipelineFull as exc:
        retry_after = str(max(1, math.ceil(exc.retry_after_s)))
        response = _status(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"the write pipeline is full; retry in {retry_after} s",
            encoding,
            {"Retry-After": retry_after},
        )
    if receiver.telemetry is not None:
        label = encoding.value if encoding is not None else "unknown"
        receiver.telemetry.request(signal.value, label, response.status_code)
    return response


def _status(
    http_status: int,
    message: str,
    encoding: decode.Encoding | None,
    headers: dict[str, str] | None = None,
) -> Response:
    # Before the content type is known (415), answer in JSON.
    encoding = encoding or decode.Encoding.JSON
    return Response(
        decode.status_body(http_status, message, encoding),
        status_code=http_status,
        media_type=decode.MEDIA_TYPES[encoding],
        headers=headers,
    )
