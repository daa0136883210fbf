"""``GET /metrics``: this API process's own metrics in the Prometheus text format, and the
alert receivers' delivery health. No authentication: without a token the receivers are only
counted; a token adds the gauges of its project's receivers (every project's for an admin)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from alerts.health import ReceiverHealthCollector
from api.deps import MetricsDep, OptionalToken
from api.services.health import audience_of
from tuneloop.runtime import Runtime

router = APIRouter(tags=["health"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Text exposition"}},
    summary="Prometheus metrics of the API itself",
)
def metrics(api_metrics: MetricsDep, request: Request, token: OptionalToken) -> Response:
    runtime = request.app.state.runtime
    engine = runtime.engine if isinstance(runtime, Runtime) else None
    # What a reader sees of the receivers depends on its token: collected per request.
    receivers = CollectorRegistry()
    receivers.register(ReceiverHealthCollector(lambda: engine, audience_of(token)))
    body = generate_latest(api_metrics.registry) + generate_latest(receivers)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
