"""Limits on reads of the time-series store that a client asks for: each stops after
``READ_TIMEOUT_S``, and as soon as its client disconnects, so that nobody can keep the server
computing an answer no one will read (docs/storage.md, "Regular expressions").

Routes are synchronous and run in a worker thread; a dependency watches the connection from
the event loop meanwhile and cancels the statement in progress when the client goes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Annotated, Final

from fastapi import Depends, Request
from sqlalchemy import Connection
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from tuneloop.storage.deadline import Cancellation, bounded

READ_TIMEOUT_S: Final = 30.0
"""Longer than any read of a project within its series limit takes; a query past it is a
selector to narrow, and the answer says so (422)."""
_POLL_S: Final = 0.2


async def watch_client(request: Request) -> AsyncIterator[Cancellation]:
    """A :class:`Cancellation` that fires when the client disconnects before the route ends."""
    cancellation = Cancellation()

    async def watch() -> None:
        while not await request.is_disconnected():
            await asyncio.sleep(_POLL_S)
        # Cancelling reaches the database (a cancel request to PostgreSQL): not on the loop.
        await run_in_threadpool(cancellation.cancel)

    watcher = asyncio.create_task(watch())
    try:
        yield cancellation
    finally:
        watcher.cancel()


ClientWatchDep = Annotated[Cancellation, Depends(watch_client, scope="function")]


@contextmanager
def bounded_read(session: Session, cancellation: Cancellation) -> Iterator[Connection]:
    """The session's connection, its statements bounded in time and by the client's presence."""
    connection = session.connection()
    with bounded(connection, READ_TIMEOUT_S, cancellation):
        yield connection
