"""The Prometheus remote-write receiver: ``POST /api/v1/write`` (remote write 1.0).

Point a Prometheus (``remote_write:``), an OpenTelemetry Collector (``prometheusremotewrite``
exporter) or any remote-write sender here with a project token (``Authorization: Bearer
tl_...``); its series go to that token's project. The answers are a Prometheus receiver's, so
senders retry exactly what they should: 204 all kept; 400 (plain text) for a body that is not a
write request (nothing kept) or for series and samples refused (the rest kept; not retried);
413 over ``remote_write_max_body_bytes``; 415 not protobuf and snappy; 503 with
``Retry-After`` while the write pipeline is full (retried). See docs/prometheus.md.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import APIRouter, Request, Response, status
from starlette.concurrency import run_in_threadpool

from api.deps import API_PREFIX, AUTH_ERRORS, PipelineDep, RuntimeDep
from api.ingest import TargetDep, read_body
from collector.pipeline import PipelineFull
from collector.remote_write.receiver import (
    Malformed,
    RemoteWriteReceiver,
    RemoteWriteRefused,
    TooLarge,
    check_headers,
)

router = APIRouter(tags=["prometheus"], responses=AUTH_ERRORS)

_TEXT: dict[str, Any] = {"content": {"text/plain": {}}}
_RESPONSES: dict[int | str, dict[str, Any]] = {
    **AUTH_ERRORS,
    204: {"description": "Every series and sample kept"},
    400: {**_TEXT, "description": "Not a write request, or some series or samples refused"},
    413: {**_TEXT, "description": "Body over remote_write_max_body_bytes"},
    415: {**_TEXT, "description": "Not Content-Type application/x-protobuf with snappy"},
    503: {**_TEXT, "description": "Pipeline full; retry after Retry-After"},
}
_OPENAPI_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/x-protobuf": {"schema": {"type": "string", "format": "binary"}}},
    }
}


@router.post(
    f"{API_PREFIX}/write",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses=_RESPONSES,
    openapi_extra=_OPENAPI_BODY,
    summary="Prometheus remote write 1.0 (snappy-compressed WriteRequest)",
)
async def remote_write(
    request: Request, target: TargetDep, runtime: RuntimeDep, pipeline: PipelineDep
) -> Response:
    receiver = RemoteWriteReceiver(max_body_bytes=runtime.settings.remote_write_max_body_bytes)
    content_type = request.headers.get("content-type")
    content_encoding = request.headers.get("content-encoding")
    try:
        check_headers(content_type, content_encoding)  # before reading a body we cannot use
        body = await read_body(
            request, receiver.max_body_bytes, too_large=TooLarge, malformed=Malformed
        )
        outcome = await run_in_threadpool(
            receiver.write,
            body,
            content_type=content_type,
            content_encoding=content_encoding,
            submit=lambda batches: pipeline.submit(target.project_id, batches),
        )
    except RemoteWriteRefused as exc:
        return _text(exc.status, exc.message)
    except PipelineFull as exc:
        retry_after = str(max(1, math.ceil(exc.retry_after_s)))
        message = f"the write pipeline is full; retry in {retry_after} s"
        return _text(status.HTTP_503_SERVICE_UNAVAILABLE, message, {"Retry-After": retry_after})
    if outcome.refusals:
        return _text(status.HTTP_400_BAD_REQUEST, outcome.message)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


def _text(code: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(message + "\n", status_code=code, media_type="text/plain", headers=headers)
