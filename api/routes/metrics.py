"""``GET /metrics``: this API process's own metrics in the Prometheus text format, the
alert receivers' delivery health and the alert rules' evaluation in this process. No
authentication: without a token the receivers and evaluations are only counted; a token adds
the series of its project's receivers and rules (every project's for an admin)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from alerts.evaluation_metrics import EVALUATION, EvaluationCollector
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
    audience = audience_of(token)
    receivers.register(ReceiverHealthCollector(lambda: engine, audience))
    receivers.register(EvaluationCollector(EVALUATION, audience))
    body = generate_latest(api_metrics.registry) + generate_latest(receivers)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
