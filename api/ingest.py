"""What the routes that take samples in (OTLP, Prometheus remote write) share: the project a
token writes into, remembered through a database outage, and the body read under a size limit.

While the database is down, tokens it confirmed lately still route writes to their project
(:class:`collector.otlp.targets.RecentTargets`), so senders keep writing through an outage
into the pipeline's spool; tokens revoked before it (here, or elsewhere and heard of while the
database answered) are refused through it with 401.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from api.deps import BearerCredentials, RuntimeDep, unauthorized
from collector.otlp.targets import RecentTargets, Target
from tuneloop import accounts
from tuneloop.runtime import Runtime
from tuneloop.storage import session_scope
from tuneloop.storage.models import Project
from tuneloop.storage.types import utcnow

_LOCK = threading.Lock()


def recent_targets(request: Request) -> RecentTargets:
    """The app's memory of confirmed (and refused) project tokens."""
    state = request.app.state
    with _LOCK:
        recent = getattr(state, "otlp_recent_targets", None)
        if not isinstance(recent, RecentTargets):
            recent = state.otlp_recent_targets = RecentTargets()
    return recent


def _target_from_store(runtime: Runtime, secret: str, recent: RecentTargets) -> Target:
    # A session of its own, closed before the body is read: a slow client's 16 MiB upload
    # must not hold a pooled connection.
    with session_scope(runtime.sessions) as session:
        # Revocations made elsewhere (the CLI, another replica) are heard of while the
        # database answers, so an outage cannot bring a revoked token back.
        recent.sweep(
            lambda window_s: accounts.refused_token_hashes(
                session, utcnow() - timedelta(seconds=window_s)
            )
        )
        token = accounts.authenticate(session, secret)
        if token is None:
            raise unauthorized("invalid, expired or revoked token")
        if token.project_id is None:
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                "writing samples needs a project token: an admin token belongs to no project, "
                "so the data would have nowhere to go (create one: tuneloop token create "
                "--project NAME)",
            )
        # One column, not the ORM's lazy load of the whole project: this runs on every request.
        own_cap = session.scalar(select(Project.max_series).where(Project.id == token.project_id))
        return Target(
            token.project_id,
            own_cap if own_cap is not None else runtime.settings.max_series_per_project,
        )


def get_target(request: Request, runtime: RuntimeDep, credentials: BearerCredentials) -> Target:
    """The project the bearer token writes into (401/403 as every route; 503 while the
    database is down and the token was not confirmed lately)."""
    if credentials is None:
        raise unauthorized("missing bearer token")
    recent = recent_targets(request)
    key = accounts.hash_secret(credentials.credentials)
    try:
        return recent.resolve(
            key, lambda: _target_from_store(runtime, credentials.credentials, recent)
        )
    except OperationalError:
        if recent.refused(key):
            raise unauthorized("invalid, expired or revoked token") from None
        # Nothing remembered: 503 with Retry-After (api.errors).
        raise


TargetDep = Annotated[Target, Depends(get_target)]


async def read_body(
    request: Request,
    limit: int,
    *,
    too_large: Callable[[str], Exception],
    malformed: Callable[[str], Exception],
) -> bytes:
    """The body, refused (``too_large``) as soon as it is known to be over ``limit``: from
    ``Content-Length`` before reading, else while reading."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise malformed(f"invalid Content-Length {declared[:32]!r}")
        if int(declared) > limit:
            raise too_large(f"the body is larger than the limit of {limit} bytes")
    # Joined once at the end: no regrowing of a buffer, and no copy of it into bytes after.
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise too_large(f"the body is larger than the limit of {limit} bytes")
    return b"".join(chunks)
