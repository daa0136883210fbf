"""Autoscalers of a project: ``/api/v1/projects/{project}/autoscalers``.

Who may do what. An autoscaler's target makes the server send requests (a webhook URL) or
scale workloads (a Kubernetes Deployment or StatefulSet with the server's own credentials),
so the target is an admin's to choose:

* **admin**: everything: create, delete, and change ``target_kind`` and ``target``.
* **member**: read, and ``PUT`` an existing autoscaler with the same target: ``enabled``,
  ``dry_run``, ``policy`` (bounds, SLO, queue target, stabilization, rate limits, metric age)
  and the ``p99``/``queue`` selectors (which only read this project's series).
* **agent**: read only.

Kubernetes credentials never come from a request: the server uses its in-cluster service
account or the kubeconfig file of the ``TUNELOOP_KUBECONFIG`` setting. Bodies take no other
fields than the documented ones, so no file path or credential can be sent along.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Response, status

from actuators.autoscaler import store
from actuators.autoscaler.store import Definition
from api.deps import (
    API_PREFIX,
    AUTH_ERRORS,
    CurrentToken,
    PageDep,
    ProjectDep,
    SessionDep,
    require,
    require_member,
)
from api.schemas.autoscalers import (
    AutoscalerCreate,
    AutoscalerOut,
    AutoscalerStateOut,
    AutoscalerUpdate,
)
from api.schemas.common import ErrorOut, Page
from tuneloop import accounts
from tuneloop.storage.models import Autoscaler

router = APIRouter(
    prefix=f"{API_PREFIX}/projects/{{project}}/autoscalers",
    tags=["autoscalers"],
    responses={
        **AUTH_ERRORS,
        422: {"model": ErrorOut, "description": "An invalid target, policy or selector"},
    },
)

ADMIN_FOR_TARGETS = (
    "choosing an autoscaler's target needs an admin token: the server sends requests to it "
    "or scales it with its own credentials"
)

ADMIN_FOR_DELETE = "deleting an autoscaler needs an admin token; members can set enabled: false"


def get_autoscaler(
    name: Annotated[str, Path(description="Autoscaler name")],
    project: ProjectDep,
    session: SessionDep,
) -> Autoscaler:
    return store.get_autoscaler(session, project, name)


AutoscalerDep = Annotated[Autoscaler, Depends(get_autoscaler)]


def _definition(body: AutoscalerUpdate) -> Definition:
    return store.check_definition(
        target_kind=body.target_kind,
        target=body.target,
        policy=body.policy,
        p99=body.p99.model_dump(exclude_defaults=True) if body.p99 is not None else None,
        queue=body.queue.model_dump(exclude_defaults=True) if body.queue is not None else None,
        dry_run=body.dry_run,
        enabled=body.enabled,
    )


@router.post("", status_code=status.HTTP_201_CREATED, summary="Create an autoscaler (admin)")
def create_autoscaler(
    body: AutoscalerCreate, project: ProjectDep, session: SessionDep, token: CurrentToken
) -> AutoscalerOut:
    """Scales ``target`` on the P99 latency and the queue its selectors read, as ``policy``
    says, every ``TUNELOOP_AUTOSCALE_INTERVAL_S``. Needs an admin token."""
    require(token.role == "admin", ADMIN_FOR_TARGETS)
    definition = _definition(body)
    row = store.create_autoscaler(
        session, project, body.name, definition, actor=accounts.actor_name(token)
    )
    return AutoscalerOut.model_validate(row)


@router.get("", summary="A project's autoscalers, by name")
def list_autoscalers(
    project: ProjectDep, session: SessionDep, _token: CurrentToken, page: PageDep
) -> Page[AutoscalerOut]:
    rows = store.list_autoscalers(session, project, limit=page.fetch, offset=page.offset)
    return page.build(rows, AutoscalerOut.model_validate)


@router.get("/{name}", summary="One autoscaler's definition")
def read_autoscaler(autoscaler: AutoscalerDep) -> AutoscalerOut:
    return AutoscalerOut.model_validate(autoscaler)


@router.put("/{name}", summary="Replace an autoscaler's definition")
def replace_autoscaler(
    body: AutoscalerUpdate,
    autoscaler: AutoscalerDep,
    session: SessionDep,
    token: CurrentToken,
) -> AutoscalerOut:
    """Members may change everything but ``target_kind`` and ``target`` (send them as they
    are); a new target needs an admin token and starts without remembered state."""
    require_member(token, "changing an autoscaler")
    definition = _definition(body)
    if store.target_changes(autoscaler, definition):
        require(token.role == "admin", ADMIN_FOR_TARGETS)
    store.replace_autoscaler(session, autoscaler, definition, actor=accounts.actor_name(token))
    return AutoscalerOut.model_validate(autoscaler)


@router.delete(
    "/{name}", status_code=status.HTTP_204_NO_CONTENT, summary="Delete an autoscaler (admin)"
)
def delete_autoscaler(
    autoscaler: AutoscalerDep, session: SessionDep, token: CurrentToken
) -> Response:
    """Needs an admin token; members stop an autoscaler with ``enabled: false``."""
    require(token.role == "admin", ADMIN_FOR_DELETE)
    store.delete_autoscaler(session, autoscaler, actor=accounts.actor_name(token))
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{name}/state", summary="What the reconcile loop last saw and did")
def read_state(autoscaler: AutoscalerDep) -> AutoscalerStateOut:
    return AutoscalerStateOut.model_validate(autoscaler)
