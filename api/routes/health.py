"""``GET /healthz``: is this process able to serve? No authentication."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from api.deps import RuntimeDep
from api.schemas import HealthOut
from api.services.health import check_health

router = APIRouter(tags=["health"])


@router.get(
    "/healthz",
    response_model=HealthOut,
    responses={503: {"model": HealthOut, "description": "A configured dependency is down"}},
    summary="Database and Redis reachability",
)
def healthz(runtime: RuntimeDep) -> JSONResponse:
    """200 when every configured dependency answers; 503 (``degraded``) when the database, or a
    configured Redis, does not."""
    health = check_health(runtime.engine, runtime.settings.redis_url)
    code = 200 if health.status == "ok" else 503
    return JSONResponse(health.model_dump(mode="json"), status_code=code)
