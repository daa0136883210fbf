"""Wake-ups for agents long-polling a job's config.

A write that may change what a job's agents should run (a new desired version, a release)
calls :func:`changed_after_commit`; once its transaction commits, every waiter of that job in
this process is woken (from any thread: waiters live on the API's event loop). Writes made by
other processes (a Celery worker's tuner) wake nobody here: pollers re-check the store every
second or so for those.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import event
from sqlalchemy.orm import Session

_PENDING_KEY = "tuneloop.config_changed"


class ConfigEvents:
    """Per-job wake-up events, thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[int, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}

    @contextmanager
    def subscribe(self, job_id: int) -> Iterator[asyncio.Event]:
        """An event set when ``job_id``'s config changes; subscribe before reading the store
        so a change between the read and the wait is not missed. Call on the event loop."""
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiters.setdefault(job_id, set()).add(waiter)
        try:
            yield waiter[1]
        finally:
            with self._lock:
                waiters = self._waiters.get(job_id)
                if waiters is not None:
                    waiters.discard(waiter)
                    if not waiters:
                        del self._waiters[job_id]

    def notify(self, job_id: int) -> None:
        with self._lock:
            waiters = list(self._waiters.get(job_id, ()))
        for loop, waiter in waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(waiter.set)

    def waiting(self, job_id: int) -> int:
        with self._lock:
            return len(self._waiters.get(job_id, ()))


EVENTS = ConfigEvents()
"""The process's one registry (the API's pollers and every writer in the process share it)."""


def changed_after_commit(session: Session, job_id: int) -> None:
    """Notify ``job_id``'s waiters once ``session`` commits (never before: a woken poller
    must find the change in the store)."""
    pending: set[int] = session.info.setdefault(_PENDING_KEY, set())
    pending.add(job_id)


@event.listens_for(Session, "after_commit")
def _notify_committed(session: Session) -> None:
    for job_id in session.info.pop(_PENDING_KEY, ()):
        EVENTS.notify(job_id)


@event.listens_for(Session, "after_rollback")
def _forget_rolled_back(session: Session) -> None:
    # A spurious wake-up would be harmless (pollers re-read); forgetting keeps it tidy.
    if not session.in_transaction():
        session.info.pop(_PENDING_KEY, None)
