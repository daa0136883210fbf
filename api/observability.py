"""The API's own metrics, on a registry per app (never the process-global one), so that tests
and several apps in one process do not collide."""

from __future__ import annotations

import time
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNMATCHED_ROUTE: Final = "<unmatched>"
"""Route label of requests that matched no route, so stray paths cannot grow the label set."""

LATENCY_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ApiMetrics:
    """Request count and latency by method, route template and status code."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.requests = Counter(
            "tuneloop_api_requests",
            "HTTP requests handled, by method, route template and status code.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "tuneloop_api_request_duration_seconds",
            "Time to handle an HTTP request, by method, route template and status code.",
            ["method", "route", "status"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        labels = {"method": method, "route": route, "status": str(status)}
        self.requests.labels(**labels).inc()
        self.latency.labels(**labels).observe(seconds)


class MetricsMiddleware:
    """Pure ASGI middleware timing every HTTP request into :class:`ApiMetrics`.

    The route label is the matched route's ``path`` (its template, e.g.
    ``/api/v1/projects/{project}/jobs``), so routers must carry their full prefix rather than
    receive it from ``include_router(prefix=...)``.
    """

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_and_record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_record_status)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) if isinstance(route, BaseRoute) else None
            self.metrics.observe(
                scope["method"],
                template if isinstance(template, str) else UNMATCHED_ROUTE,
                status,
                time.perf_counter() - started,
            )
