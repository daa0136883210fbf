"""Every router of the API, in the order ``create_app`` includes them.

Each router carries its full path prefix (``/api/v1/...``) and is included without one, so a
route's own ``path`` is its full template, which is what the request metrics are labelled with.
"""

from __future__ import annotations

from fastapi import APIRouter

from api.routes import (
    actuators,
    agents,
    alerts,
    autoscalers,
    cost,
    exposition,
    health,
    jobs,
    metrics,
    otlp,
    prices,
    projects,
    promql,
    remote_write,
    series,
    studies,
    tokens,
)

ROUTERS: tuple[APIRouter, ...] = (
    health.router,
    metrics.router,
    projects.router,
    tokens.router,
    jobs.router,
    studies.router,
    agents.router,
    actuators.router,
    autoscalers.router,
    series.router,
    promql.router,
    cost.router,
    prices.router,
    prices.project_router,
    exposition.router,
    otlp.router,
    remote_write.router,
    alerts.router,
)
