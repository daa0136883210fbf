"""Typed dependencies of the routes: the runtime, a database session, the caller's token and
the project named in the path.

A project-scoped token that names another project gets 404, exactly as for a project that does
not exist, so tokens cannot probe which projects exist.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, HTTPException, Path, Query, Request, Security, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from api.observability import ApiMetrics
from api.schemas.common import ErrorOut, Page
from collector.fanout import FanOut, WritePipeline
from collector.pipeline import Pipeline
from tuneloop import accounts
from tuneloop.runtime import Runtime
from tuneloop.storage import session_scope
from tuneloop.storage.models import ApiToken, Project
from tuneloop.storage.types import BIGINT_MAX, INTEGER_MAX

API_PREFIX = "/api/v1"

AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "Missing, unknown, expired or revoked token"},
    403: {"model": ErrorOut, "description": "The token's role does not allow this"},
    404: {"model": ErrorOut, "description": "Not found, or not visible to this token"},
}
"""OpenAPI ``responses`` of every authenticated router."""

bearer_scheme = HTTPBearer(
    scheme_name="bearer",
    bearerFormat="tl_…",
    description="An API token secret: `Authorization: Bearer tl_...`",
    auto_error=False,
)


_Started = TypeVar("_Started", Runtime, Pipeline, FanOut)


def _started(request: Request, name: str, kind: type[_Started]) -> _Started:
    """What the app's lifespan put on its state; 503 until it has (or after it stopped)."""
    value = getattr(request.app.state, name, None)
    if not isinstance(value, kind):
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "the service is starting")
    return value


def get_runtime(request: Request) -> Runtime:
    return _started(request, "runtime", Runtime)


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


def get_pipeline(request: Request) -> WritePipeline:
    """The write pipeline shared by every receiver of this process (see ``api.main``)."""
    if isinstance(getattr(request.app.state, "pipeline", None), FanOut):
        return _started(request, "pipeline", FanOut)
    return _started(request, "pipeline", Pipeline)


PipelineDep = Annotated[WritePipeline, Depends(get_pipeline)]


def get_metrics(request: Request) -> ApiMetrics:
    metrics = request.app.state.metrics
    assert isinstance(metrics, ApiMetrics)
    return metrics


MetricsDep = Annotated[ApiMetrics, Depends(get_metrics)]


def get_session(runtime: RuntimeDep) -> Iterator[Session]:
    """One session per request, committed when the route returns without error (before the
    response is sent) and rolled back otherwise."""
    with session_scope(runtime.sessions) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session, scope="function")]


PathId = Annotated[int, Path(ge=1, le=INTEGER_MAX)]
"""A row id in the path (silence, token, trial number): bounded so the store can compare it."""


def unauthorized(message: str) -> HTTPException:
    return HTTPException(
        status.HTTP_401_UNAUTHORIZED, message, headers={"WWW-Authenticate": "Bearer"}
    )


BearerCredentials = Annotated[HTTPAuthorizationCredentials | None, Security(bearer_scheme)]
"""The ``Authorization: Bearer`` credentials, if any (documented in OpenAPI either way)."""


def get_current_token(session: SessionDep, credentials: BearerCredentials) -> ApiToken:
    if credentials is None:
        raise unauthorized("missing bearer token")
    token = accounts.authenticate(session, credentials.credentials)
    if token is None:
        raise unauthorized("invalid, expired or revoked token")
    if token in session.dirty:
        # ``last_used_at`` moved (at most once a minute): keep it even if the request fails.
        session.commit()
    return token


CurrentToken = Annotated[ApiToken, Depends(get_current_token)]


def get_optional_token(request: Request) -> ApiToken | None:
    """The caller's token on routes that also answer without one (``/healthz``, ``/metrics``):
    ``None`` when there is none, it is not valid, or the database cannot tell (those routes
    must answer while it is down). Read from the header itself, so that OpenAPI keeps
    listing those routes as open."""
    scheme, _, secret = request.headers.get("authorization", "").partition(" ")
    runtime = getattr(request.app.state, "runtime", None)
    if scheme.lower() != "bearer" or not secret or not isinstance(runtime, Runtime):
        return None
    try:
        with session_scope(runtime.sessions) as session:
            return accounts.authenticate(session, secret.strip())
    except SQLAlchemyError:
        return None


OptionalToken = Annotated[ApiToken | None, Depends(get_optional_token)]


def get_admin_token(token: CurrentToken) -> ApiToken:
    if token.role != "admin":
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "needs an admin token (create one on the server: tuneloop token create --role admin)",
        )
    return token


AdminToken = Annotated[ApiToken, Depends(get_admin_token)]


def get_project(
    project: Annotated[str, Path(description="Project name")],
    session: SessionDep,
    token: CurrentToken,
) -> Project:
    found = accounts.get_project_by_name(session, project)
    if found is None or not accounts.can_access_project(token, found):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"project {project!r} not found")
    return found


ProjectDep = Annotated[Project, Depends(get_project)]


def require(allowed: bool, message: str) -> None:
    """Raise 403 with ``message`` unless ``allowed``."""
    if not allowed:
        raise HTTPException(status.HTTP_403_FORBIDDEN, message)


def member_needed(action: str) -> str:
    """The 403 message for ``action`` asked with an agent token: the role it needs and how to
    get one."""
    return (
        f"{action} needs a member or admin token; agent tokens only report metrics, step "
        "timings and configs and read their job's config (create one: tuneloop token create "
        "--project NAME --role member)"
    )


def require_member(token: ApiToken, action: str) -> None:
    """403 naming the role needed unless ``token`` is a member's or an admin's."""
    require(accounts.can_write_desired_config(token), member_needed(action))


OutT = TypeVar("OutT", bound=BaseModel)
RowT = TypeVar("RowT")

MAX_PAGE_SIZE = 500


@dataclass(frozen=True)
class PageParams:
    """``limit``/``offset`` of a list request. Ask the store for :attr:`fetch` rows (one more
    than a page) so :meth:`build` can tell whether another page follows without counting."""

    limit: int
    offset: int

    @property
    def fetch(self) -> int:
        return self.limit + 1

    def build(self, rows: Sequence[RowT], to_item: Callable[[RowT], OutT]) -> Page[OutT]:
        """The page of ``rows`` (fetched with :attr:`fetch`), each made an item by ``to_item``
        (``JobOut.model_validate``, ``TrialOut.of``)."""
        more = len(rows) > self.limit
        return Page(
            items=[to_item(row) for row in rows[: self.limit]],
            limit=self.limit,
            offset=self.offset,
            next_offset=self.offset + self.limit if more else None,
        )


def get_page_params(
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE, description="Page size")] = 100,
    offset: Annotated[int, Query(ge=0, le=BIGINT_MAX, description="Items to skip")] = 0,
) -> PageParams:
    return PageParams(limit=limit, offset=offset)


PageDep = Annotated[PageParams, Depends(get_page_params)]
