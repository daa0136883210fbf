"""Where an OTLP export's data goes, and the memory of confirmed tokens that keeps exports
flowing into the pipeline's spool while the database is down.

The receiver owns this state (not the HTTP route): the route hands :meth:`RecentTargets.resolve`
a lookup against the store, and answers whatever it raises.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.exc import OperationalError


@dataclass(frozen=True, slots=True)
class Target:
    """Where an export request's data goes."""

    project_id: int
    max_series: int


OUTAGE_GRACE_S = 600.0
"""How long a token the database confirmed keeps routing exports while the database is down."""


class RecentTargets:
    """Targets of the tokens the database confirmed lately, by token hash.

    Consulted only when the database cannot answer, so that exports go on into the pipeline's
    spool through an outage instead of being refused; while it can answer, every request is
    checked there, and a token it refuses is forgotten at once.
    """

    def __init__(self, max_age_s: float = OUTAGE_GRACE_S, max_entries: int = 10_000) -> None:
        self._max_age_s = max_age_s
        self._max_entries = max_entries
        self._entries: OrderedDict[str, tuple[Target, float]] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, key: str, target: Target) -> None:
        with self._lock:
            self._entries[key] = (target, time.monotonic())
            self._entries.move_to_end(key)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)

    def forget(self, key: str) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def recall(self, key: str) -> Target | None:
        with self._lock:
            entry = self._entries.get(key)
        if entry is None or time.monotonic() - entry[1] > self._max_age_s:
            return None
        return entry[0]

    def resolve(self, key: str, lookup: Callable[[], Target]) -> Target:
        """The target ``lookup`` finds in the store, remembered under ``key``; while the
        store is unreachable (``OperationalError``), the one remembered, if still fresh.
        Anything else ``lookup`` raises (the token refused) forgets ``key`` and propagates."""
        try:
            target = lookup()
        except OperationalError:
            remembered = self.recall(key)
            if remembered is None:
                raise
            return remembered
        except Exception:
            self.forget(key)
            raise
        self.remember(key, target)
        return target
