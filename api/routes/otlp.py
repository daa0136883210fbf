"""The OTLP/HTTP receiver: ``POST /v1/metrics`` and ``POST /v1/traces``.

At the root, not under ``/api/v1``: OpenTelemetry exporters append these paths to the
endpoint they are given, so ``OTEL_EXPORTER_OTLP_ENDPOINT=http://tuneloop:8000`` just works.
Authenticated with a project token (``Authorization: Bearer tl_...`` in
``OTEL_EXPORTER_OTLP_HEADERS``); the data goes to that token's project.

Per the OTLP/HTTP spec: the response is in the request's encoding (protobuf or JSON), 200 with
``partial_success`` when some points were rejected, and errors carry a ``google.rpc.Status``
body: 400 malformed, 413 over ``otlp_max_body_bytes`` (on the wire or decompressed), 415 an
unknown content type or encoding, 503 with ``Retry-After`` while the write pipeline is full.
While the database is down, tokens it confirmed lately still route exports to their
project (:class:`collector.otlp.targets.RecentTargets`), so jobs keep sending through an
outage into the spool; tokens revoked before it (here, or elsewhere and heard of while the
database answered) are refused through it with 401.
"""

from __future__ import annotations

import math
import threading
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request, Response, status
from sqlalchemy import select
from sqlalchemy.exc import OperationalError
from starlette.concurrency import run_in_threadpool

from api.deps import (
    AUTH_ERRORS,
    BearerCredentials,
    MetricsDep,
    PipelineDep,
    RuntimeDep,
    unauthorized,
)
from collector.otlp import decode
from collector.otlp.receiver import OtlpReceiver, Signal
from collector.otlp.targets import RecentTargets, Target
from collector.otlp.telemetry import telemetry_for
from collector.pipeline import Pipeline, PipelineFull
from tuneloop import accounts
from tuneloop.runtime import Runtime
from tuneloop.storage import session_scope
from tuneloop.storage.models import Project
from tuneloop.storage.types import utcnow

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


def recent_targets(request: Request) -> RecentTargets:
    """The app's memory of confirmed (and refused) OTLP tokens."""
    state = request.app.state
    with _RECEIVER_LOCK:
        recent = getattr(state, "otlp_recent_targets", None)
        if not isinstance(recent, RecentTargets):
            recent = state.otlp_recent_targets = RecentTargets()
    return recent


def _target_from_store(runtime: Runtime, secret: str, recent: RecentTargets) -> Target:
    # A session of its own, closed before the body is read: a slow client's 16 MiB upload
    # must not hold a pooled connection.
    with session_scope(runtime.sessions) as session:
        # Revocations made elsewhere (the CLI, another replica) are heard of while the
        # database answers, so an outage cannot bring a revoked token back.
        recent.sweep(
            lambda window_s: accounts.refused_token_hashes(
                session, utcnow() - timedelta(seconds=window_s)
            )
        )
        token = accounts.authenticate(session, secret)
        if token is None:
            raise unauthorized("invalid, expired or revoked token")
        if token.project_id is None:
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                "OTLP export needs a project token: an admin token belongs to no project, so "
                "the data would have nowhere to go (create one: tuneloop token create "
                "--project NAME)",
            )
        # One column, not the ORM's lazy load of the whole project: this runs on every request.
        own_cap = session.scalar(select(Project.max_series).where(Project.id == token.project_id))
        return Target(
            token.project_id,
            own_cap if own_cap is not None else runtime.settings.max_series_per_project,
        )


def get_target(request: Request, runtime: RuntimeDep, credentials: BearerCredentials) -> Target:
    if credentials is None:
        raise unauthorized("missing bearer token")
    recent = recent_targets(request)
    key = accounts.hash_secret(credentials.credentials)
    try:
        return recent.resolve(
            key, lambda: _target_from_store(runtime, credentials.credentials, recent)
        )
    except OperationalError:
        if recent.refused(key):
            raise unauthorized("invalid, expired or revoked token") from None
        # Nothing remembered: 503 with Retry-After (api.errors).
        raise


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


TargetDep = Annotated[Target, Depends(get_target)]
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
    signal: Signal, request: Request, target: Target, receiver: OtlpReceiver, pipeline: Pipeline
) -> Response:
    encoding: decode.Encoding | None = None
    try:
        encoding = decode.encoding_of(request.headers.get("content-type"))
        body = await _read_body(request, receiver.max_body_bytes)
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


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it is known to be over ``limit``: from
    ``Content-Length`` before reading, else while reading."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise decode.MalformedPayload(f"invalid Content-Length {declared[:32]!r}")
        if int(declared) > limit:
            raise decode.PayloadTooLarge(f"the body is larger than the limit of {limit} bytes")
    # Joined once at the end: no regrowing of a buffer, and no copy of it into bytes after.
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise decode.PayloadTooLarge(f"the body is larger than the limit of {limit} bytes")
    return b"".join(chunks)


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
