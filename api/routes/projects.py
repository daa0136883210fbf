"""Projects: ``/api/v1/projects``. Admin tokens create and list every project; a project's own
tokens see only that project."""

from __future__ import annotations

from fastapi import APIRouter, status

from api.deps import (
    API_PREFIX,
    AUTH_ERRORS,
    AdminToken,
    CurrentToken,
    PageDep,
    ProjectDep,
    SessionDep,
)
from api.schemas.common import ErrorOut, Page
from api.schemas.projects import ProjectCreate, ProjectOut
from tuneloop import accounts

router = APIRouter(prefix=f"{API_PREFIX}/projects", tags=["projects"], responses=AUTH_ERRORS)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    responses={409: {"model": ErrorOut, "description": "The name is taken"}},
    summary="Create a project (admin)",
)
def create_project(body: ProjectCreate, session: SessionDep, token: AdminToken) -> ProjectOut:
    project = accounts.create_project(
        session, body.name, max_series=body.max_series, actor=accounts.actor_name(token)
    )
    return ProjectOut.model_validate(project)


@router.get("", summary="List the projects this token reaches")
def list_projects(session: SessionDep, token: CurrentToken, page: PageDep) -> Page[ProjectOut]:
    only = None if token.role == "admin" else token.project_id
    if token.role != "admin" and only is None:  # a scoped role without project: reaches none
        return page.build([], ProjectOut.model_validate)
    rows = accounts.list_projects(session, only_id=only, limit=page.fetch, offset=page.offset)
    return page.build(rows, ProjectOut.model_validate)


@router.get("/{project}", summary="One project")
def get_project(project: ProjectDep) -> ProjectOut:
    return ProjectOut.model_validate(project)
