"""``GET /healthz``: is this process able to serve? No authentication; a token adds the names
and errors of its project's alert receivers."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from api.deps import OptionalToken, RuntimeDep
from api.schemas.health import HealthOut
from api.services.health import audience_of, check_health, dependencies_up
from collector.status import StatusBoard

router = APIRouter(tags=["health"])


@router.get(
    "/healthz",
    response_model=HealthOut,
    responses={503: {"model": HealthOut, "description": "A configured dependency is down"}},
    summary="Database and Redis reachability, and the health of this process's collectors",
)
def healthz(runtime: RuntimeDep, request: Request, token: OptionalToken) -> JSONResponse:
    """200 when every configured dependency answers; 503 (``degraded``) when the database, or a
    configured Redis, does not.

    ``collectors`` lists the sources polled by this process (``tuneloop up``). A failing source
    (GPU gone, exporter down) makes the status ``degraded`` but the response stays 200: it is
    retried with backoff while the others go on, and restarting the process would not help.

    ``receivers_failing`` counts the alert receivers that keep failing; ``notifiers`` names
    them, with their last error, only for a token of their project (or an admin token).
    """
    board = getattr(request.app.state, "collector_status", None)
    sources = board.snapshot() if isinstance(board, StatusBoard) else []
    health = check_health(runtime.engine, runtime.settings.redis_url, sources, audience_of(token))
    code = 200 if dependencies_up(health) else 503
    return JSONResponse(health.model_dump(mode="json"), status_code=code)
