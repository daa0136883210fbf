"""The health of each source, written by the runner and read by ``/healthz``."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from datetime import datetime


@dataclass(frozen=True, slots=True)
class SourceStatus:
    name: str
    ok: bool | None = None
    """``None`` until the first poll."""
    last_error: str | None = None
    last_success_at: datetime | None = None
    consecutive_failures: int = 0


class StatusBoard:
    """Thread-safe latest status of every source, in the order they were registered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._status: dict[str, SourceStatus] = {}

    def register(self, name: str) -> None:
        with self._lock:
            self._status.setdefault(name, SourceStatus(name))

    def succeeded(self, name: str, at: datetime) -> None:
        with self._lock:
            current = self._status.get(name, SourceStatus(name))
            self._status[name] = replace(
                current, ok=True, last_success_at=at, consecutive_failures=0
            )

    def failed(self, name: str, error: str) -> SourceStatus:
        with self._lock:
            current = self._status.get(name, SourceStatus(name))
            updated = replace(
                current,
                ok=False,
                last_error=error,
                consecutive_failures=current.consecutive_failures + 1,
            )
            self._status[name] = updated
            return updated

    def snapshot(self) -> list[SourceStatus]:
        with self._lock:
            return list(self._status.values())
