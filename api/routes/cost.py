"""GPU cost of a project over a period, per job, team, namespace, pod or GPU (MIG instance)::

    curl -G -H "Authorization: Bearer $TOKEN" localhost:8000/api/v1/projects/vision/cost \\
        --data-urlencode start=2026-11-01T00:00:00Z --data-urlencode end=2026-12-01T00:00:00Z \\
        --data-urlencode by=team
    {"by": "team", "groups": [{"key": "nlp", "gpus": 16, "gpu_hours": 11520.0,
     "idle_gpu_hours": 310.5, "energy_kwh": 5210.3}, ...], "total": {...}, ...}

GPU time, idle time and energy are defined in :mod:`tuneloop.cost`. Every role of the project
may read. Cost reads the built-in store's samples and rollups: with ``TUNELOOP_TSDB_URL`` set
(series in a TSDB) it answers 409 and says so.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import API_PREFIX, AUTH_ERRORS, ProjectDep, RuntimeDep, SessionDep
from api.query_params import time_param
from api.routes.series import TIME_DOC
from api.schemas.common import ErrorOut
from api.schemas.cost import CostFiguresOut, CostReportOut
from tuneloop import cost
from tuneloop.errors import Conflict, InvalidInput

router = APIRouter(
    prefix=f"{API_PREFIX}/projects/{{project}}",
    tags=["cost"],
    responses={**AUTH_ERRORS, 422: {"model": ErrorOut, "description": "A malformed parameter"}},
)

MAX_PERIOD = timedelta(days=400)
"""The longest period the 1-minute rollups are kept by default."""

NOT_ON_A_TSDB = (
    "cost reads the built-in store's samples and rollups; not available with "
    "TUNELOOP_TSDB_URL (series live in the TSDB: docs/deploy-on-your-tsdb.md)"
)


@router.get(
    "/cost",
    summary="GPU-hours, idle GPU-hours and energy over a period",
    responses={409: {"model": ErrorOut, "description": "Series live in a TSDB (no cost)"}},
)
def project_cost(
    project: ProjectDep,
    session: SessionDep,
    runtime: RuntimeDep,
    start: Annotated[str, Query(description=TIME_DOC, examples=["2026-11-01T00:00:00Z"])],
    end: Annotated[str, Query(description=TIME_DOC, examples=["2026-12-01T00:00:00Z"])],
    by: Annotated[cost.GroupBy, Query(description="Group the GPUs by")] = cost.GroupBy.TEAM,
    idle_below: Annotated[
        float, Query(ge=0, le=100, description="A minute is idle below this utilization, %")
    ] = cost.DEFAULT_IDLE_BELOW,
) -> CostReportOut:
    if runtime.remote_series is not None:
        raise Conflict(NOT_ON_A_TSDB)
    begin, finish = time_param(start, "start"), time_param(end, "end")
    if finish <= begin:
        raise InvalidInput("end must be after start")
    if finish - begin > MAX_PERIOD:
        raise InvalidInput(f"the period may span at most {MAX_PERIOD.days} days")
    usages = cost.gpu_usage(session.connection(), project.id, begin, finish, idle_below=idle_below)
    return CostReportOut(
        start=begin,
        end=finish,
        by=by,
        idle_below_percent=idle_below,
        groups=[CostFiguresOut.of(group) for group in cost.summarize(usages, by)],
        total=CostFiguresOut.of(cost.total(usages)),
    )
