"""API tokens: created under a project (or globally, for admin tokens), listed without their
secrets, revoked by id."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status

from api.deps import (
    API_PREFIX,
    AUTH_ERRORS,
    AdminToken,
    CurrentToken,
    PageDep,
    PathId,
    ProjectDep,
    SessionDep,
    require,
)
from api.ingest import recent_targets
from api.schemas.common import Page
from api.schemas.tokens import AdminTokenCreate, TokenCreate, TokenCreatedOut, TokenOut
from tuneloop import accounts, errors
from tuneloop.storage.models import ApiToken

router = APIRouter(prefix=API_PREFIX, tags=["tokens"], responses=AUTH_ERRORS)

IncludeRevoked = Annotated[bool, Query(description="Also list revoked tokens")]


def _created(token: ApiToken, secret: str) -> TokenCreatedOut:
    return TokenCreatedOut.model_validate(
        {**TokenOut.model_validate(token).model_dump(), "secret": secret}
    )


@router.post(
    "/projects/{project}/tokens",
    status_code=status.HTTP_201_CREATED,
    summary="Create a member or agent token of a project",
)
def create_project_token(
    body: TokenCreate, project: ProjectDep, session: SessionDep, token: CurrentToken
) -> TokenCreatedOut:
    """Admins create member and agent tokens; a member of the project creates agent tokens.
    The secret is in this response only."""
    require(
        accounts.can_create_token(token, project, body.role),
        f"a {token.role} token cannot create {body.role} tokens",
    )
    if body.role == "admin":
        raise errors.InvalidInput("admin tokens belong to no project: POST /api/v1/tokens")
    created, secret = accounts.create_token(
        session,
        project,
        body.name,
        body.role,
        expires_at=body.expires_at,
        actor=accounts.actor_name(token),
    )
    return _created(created, secret)


@router.get("/projects/{project}/tokens", summary="List a project's tokens (never secrets)")
def list_project_tokens(
    project: ProjectDep,
    session: SessionDep,
    token: CurrentToken,
    page: PageDep,
    include_revoked: IncludeRevoked = True,
) -> Page[TokenOut]:
    require(accounts.can_manage_tokens(token, project), "needs a member or admin token")
    rows = accounts.list_tokens(
        session, project, include_revoked=include_revoked, limit=page.fetch, offset=page.offset
    )
    return page.build(rows, TokenOut.model_validate)


@router.post(
    "/tokens", status_code=status.HTTP_201_CREATED, summary="Create an admin token (admin)"
)
def create_admin_token(
    body: AdminTokenCreate, session: SessionDep, token: AdminToken
) -> TokenCreatedOut:
    created, secret = accounts.create_token(
        session,
        None,
        body.name,
        "admin",
        expires_at=body.expires_at,
        actor=accounts.actor_name(token),
    )
    return _created(created, secret)


@router.get("/tokens", summary="List every token of every project (admin)")
def list_all_tokens(
    session: SessionDep, _token: AdminToken, page: PageDep, include_revoked: IncludeRevoked = True
) -> Page[TokenOut]:
    rows = accounts.list_all_tokens(
        session, include_revoked=include_revoked, limit=page.fetch, offset=page.offset
    )
    return page.build(rows, TokenOut.model_validate)


@router.get("/tokens/self", summary="The token making this request")
def whoami(token: CurrentToken) -> TokenOut:
    return TokenOut.model_validate(token)


@router.delete(
    "/tokens/{token_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    summary="Revoke a token (admin, or a member of its project)",
)
def revoke_token(
    token_id: PathId, request: Request, session: SessionDep, token: CurrentToken
) -> Response:
    """Idempotent: revoking a revoked token succeeds and keeps its first revocation time."""
    target = accounts.get_token(session, token_id)
    if target is None or not accounts.can_see_token(token, target):
        raise errors.NotFound(f"token {token_id} not found")
    require(token.role in ("admin", "member"), "needs a member or admin token")
    accounts.revoke_token(session, token_id, actor=accounts.actor_name(token))
    # At once in this process: an outage starting now must not bring the token back.
    recent_targets(request).refuse(target.token_hash)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
