"""The one contract every source follows."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Protocol

from collector.points import Point


class Source(Protocol):
    """A source is polled by the runner. ``collect`` returns what it could read: a source that
    fails partly returns the rest and raises nothing for partial failures.

    When ``start`` or ``collect`` raises, the runner reports the source as failing, calls
    ``shutdown`` and, after a backoff, ``start`` again before the next ``collect``: a source
    must be restartable (a GPU that fell off the bus needs fresh handles). ``name`` is unique
    among the sources of one runner."""

    name: str

    def start(self) -> None: ...

    def collect(self, now: datetime) -> Iterable[Point]: ...

    def shutdown(self) -> None: ...
