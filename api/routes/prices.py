"""GPU prices: server-wide at ``/api/v1/prices`` (admin tokens), a project's own at
``/api/v1/projects/{project}/prices`` (read by every role of the project, written by members
and admins). A project's rows override the server-wide ones (:mod:`tuneloop.prices`)::

    curl -H "Authorization: Bearer $ADMIN" localhost:8000/api/v1/prices -d \\
        '{"model": "NVIDIA H100*", "capacity_type": "spot", "price_per_gpu_hour": "2.10",
          "currency": "USD"}'
"""

from __future__ import annotations

from fastapi import APIRouter, status

from api.deps import (
    API_PREFIX,
    AUTH_ERRORS,
    AdminToken,
    CurrentToken,
    PathId,
    ProjectDep,
    SessionDep,
    require_member,
)
from api.schemas.common import ErrorOut
from api.schemas.prices import PriceIn, PriceOut
from tuneloop import prices

ERRORS = {**AUTH_ERRORS, 422: {"model": ErrorOut, "description": "A field is not accepted"}}

router = APIRouter(prefix=f"{API_PREFIX}/prices", tags=["prices"], responses=ERRORS)
project_router = APIRouter(
    prefix=f"{API_PREFIX}/projects/{{project}}/prices", tags=["prices"], responses=ERRORS
)


@router.post("", status_code=status.HTTP_201_CREATED, summary="Add a server-wide price (admin)")
def create_price(body: PriceIn, session: SessionDep, token: AdminToken) -> PriceOut:
    return PriceOut.model_validate(prices.add_price(session, body.to_price(None)))


@router.get("", summary="The server-wide prices (admin)")
def list_prices(session: SessionDep, token: AdminToken) -> list[PriceOut]:
    return [PriceOut.model_validate(row) for row in prices.list_prices(session, None)]


@router.put("/{price_id}", summary="Change a server-wide price (admin)")
def update_price(
    price_id: PathId, body: PriceIn, session: SessionDep, token: AdminToken
) -> PriceOut:
    return PriceOut.model_validate(prices.update_price(session, price_id, body.to_price(None)))


@router.delete(
    "/{price_id}", status_code=status.HTTP_204_NO_CONTENT, summary="Delete a server-wide price"
)
def delete_price(price_id: PathId, session: SessionDep, token: AdminToken) -> None:
    prices.delete_price(session, price_id, None)


@project_router.post("", status_code=status.HTTP_201_CREATED, summary="Add a project's price")
def create_project_price(
    body: PriceIn, project: ProjectDep, session: SessionDep, token: CurrentToken
) -> PriceOut:
    require_member(token, "setting prices")
    return PriceOut.model_validate(prices.add_price(session, body.to_price(project.id)))


@project_router.get("", summary="The project's own prices (server-wide ones: /api/v1/prices)")
def list_project_prices(project: ProjectDep, session: SessionDep) -> list[PriceOut]:
    return [PriceOut.model_validate(row) for row in prices.list_prices(session, project.id)]


@project_router.put("/{price_id}", summary="Change a project's price")
def update_project_price(
    price_id: PathId, body: PriceIn, project: ProjectDep, session: SessionDep, token: CurrentToken
) -> PriceOut:
    require_member(token, "setting prices")
    row = prices.update_price(session, price_id, body.to_price(project.id))
    return PriceOut.model_validate(row)


@project_router.delete(
    "/{price_id}", status_code=status.HTTP_204_NO_CONTENT, summary="Delete a project's price"
)
def delete_project_price(
    price_id: PathId, project: ProjectDep, session: SessionDep, token: CurrentToken
) -> None:
    require_member(token, "deleting prices")
    prices.delete_price(session, price_id, project.id)
