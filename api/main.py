"""The API application: ``create_app()`` builds it; run it with
``uvicorn --factory api.main:create_app``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI

import tuneloop
from api.errors import install_error_handlers
from api.observability import ApiMetrics, MetricsMiddleware
from api.routes import ROUTERS
from tuneloop.runtime import Runtime
from tuneloop.settings import get_settings
from tuneloop.storage import DatabaseUnavailable, check_database

log = logging.getLogger(__name__)


def _lifespan(
    given: Runtime | None,
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if given is not None:  # the caller owns it and closes it
            yield
            return
        # Started even when the database is down, so /healthz can say so.
        runtime = Runtime.open(get_settings(), check=False)
        try:
            check_database(runtime.engine)
        except DatabaseUnavailable as exc:
            log.warning("%s; serving anyway, /healthz reports 503", exc)
        app.state.runtime = runtime
        try:
            yield
        finally:
            app.state.runtime = None
            runtime.close()

    return lifespan


def create_app(runtime: Runtime | None = None) -> FastAPI:
    """The API app. With ``runtime`` it serves that (and leaves closing it to the caller);
    without, its lifespan opens one from the settings and closes it on shutdown."""
    app = FastAPI(
        title="tuneloop",
        version=tuneloop.__version__,
        summary="Observability and auto-tuning control plane for GPU fleets",
        lifespan=_lifespan(runtime),
    )
    app.state.runtime = runtime
    app.state.metrics = ApiMetrics()
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    return app
