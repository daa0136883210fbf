"""``GET /metrics``: this API process's own metrics in the Prometheus text format. No
authentication."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.deps import MetricsDep

router = APIRouter(tags=["health"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Text exposition"}},
    summary="Prometheus metrics of the API itself",
)
def metrics(api_metrics: MetricsDep) -> Response:
    return Response(generate_latest(api_metrics.registry), media_type=CONTENT_TYPE_LATEST)
