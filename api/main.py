"""The API application: ``create_app()`` builds it; run it with
``uvicorn --factory api.main:create_app``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from starlette.concurrency import run_in_threadpool

import tuneloop
from api.errors import install_error_handlers
from api.input_guard import InputGuard
from api.observability import ApiMetrics, MetricsMiddleware
from api.routes import ROUTERS
from collector.fanout import WritePipeline
from collector.status import StatusBoard
from tuneloop.runtime import Runtime
from tuneloop.settings import get_settings
from tuneloop.storage import DatabaseUnavailable, check_database

log = logging.getLogger(__name__)


def _lifespan(
    given_runtime: Runtime | None, given_pipeline: WritePipeline | None
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # What the caller gave, the caller owns (starts, stops, closes); the rest is ours.
        runtime = given_runtime
        if runtime is None:
            # Started even when the database is down, so /healthz can say so.
            runtime = Runtime.open(get_settings(), check=False)
            try:
                check_database(runtime.engine)
            except DatabaseUnavailable as exc:
                log.warning("%s; serving anyway, /healthz reports 503", exc)
            app.state.runtime = runtime
        pipeline = given_pipeline
        if pipeline is None:
            from collector.service import build_pipeline

            pipeline = build_pipeline(runtime, registry=app.state.metrics.registry)
            pipeline.start()
            app.state.pipeline = pipeline
        try:
            yield
        finally:
            if given_pipeline is None:
                app.state.pipeline = None
                # Draining writes to the store (or the spool): keep it off the event loop.
                await run_in_threadpool(pipeline.stop)
            if given_runtime is None:
                app.state.runtime = None
                runtime.close()

    return lifespan


def create_app(
    runtime: Runtime | None = None,
    pipeline: WritePipeline | None = None,
    *,
    registry: CollectorRegistry | None = None,
    collector_status: StatusBoard | None = None,
) -> FastAPI:
    """The API app.

    With ``runtime`` it serves that (and leaves closing it to the caller); without, its
    lifespan opens one from the settings and closes it on shutdown. Likewise ``pipeline``
    (where received samples go): given, the caller starts and stops it; without, the lifespan
    builds one from the runtime, starts it and stops (drains) it on shutdown.

    ``/metrics`` serves ``registry`` (default: the given pipeline's, else a new one per app).
    ``collector_status`` is the board of the sources running in this process, shown by
    ``/healthz``.
    """
    app = FastAPI(
        title="tuneloop",
        version=tuneloop.__version__,
        summary="Observability and auto-tuning control plane for GPU fleets",
        lifespan=_lifespan(runtime, pipeline),
    )
    if registry is None and pipeline is not None:
        registry = pipeline.registry
    app.state.runtime = runtime
    app.state.pipeline = pipeline
    app.state.collector_status = collector_status
    app.state.metrics = ApiMetrics(registry)
    # Added first so it runs inside the metrics middleware: its refusals are counted too.
    app.add_middleware(InputGuard)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    return app
