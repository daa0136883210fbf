"""Where an OTLP export's data goes, and the memory of confirmed tokens that keeps exports
flowing into the pipeline's spool while the database is down.

The receiver owns this state (not the HTTP route): the route hands :meth:`RecentTargets.resolve`
a lookup against the store, and answers whatever it raises.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sqlalchemy.exc import OperationalError


@dataclass(frozen=True, slots=True)
class Target:
    """Where an export request's data goes."""

    project_id: int
    max_series: int


OUTAGE_GRACE_S = 600.0
"""How long a token the database confirmed keeps routing exports while the database is down."""

REVOCATION_SWEEP_S = 5.0
"""How often, while the database answers, the tokens revoked meanwhile are asked for."""


class RecentTargets:
    """Targets of the tokens the database confirmed lately, by token hash.

    Consulted only when the database cannot answer, so that exports go on into the pipeline's
    spool through an outage instead of being refused; while it can answer, every request is
    checked there, and a token it refuses is forgotten at once.

    Refusals are remembered too (a token the database refused, one revoked through this
    process, and those :meth:`sweep` hears of), so a token revoked before an outage is refused
    through it even if it was confirmed lately and not seen since: see :meth:`refused`.
    """

    def __init__(self, max_age_s: float = OUTAGE_GRACE_S, max_entries: int = 10_000) -> None:
        self._max_age_s = max_age_s
        self._max_entries = max_entries
        self._entries: OrderedDict[str, tuple[Target, float]] = OrderedDict()
        self._refused: OrderedDict[str, None] = OrderedDict()
        self._swept_at: float | None = None
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

    def refuse(self, *keys: str) -> None:
        """Forget ``keys`` and remember them as refused (a revocation, an unknown token)."""
        with self._lock:
            for key in keys:
                self._entries.pop(key, None)
                self._refused[key] = None
                self._refused.move_to_end(key)
            while len(self._refused) > self._max_entries:
                self._refused.popitem(last=False)

    def refused(self, key: str) -> bool:
        """Whether ``key`` was refused: during an outage, answer it as revoked, not 503."""
        with self._lock:
            return key in self._refused

    def sweep(self, revoked_since: Callable[[float], Iterable[str]]) -> None:
        """At most every :data:`REVOCATION_SWEEP_S`, while the database answers: refuse the
        token hashes ``revoked_since(seconds_ago)`` names (revoked by another process, the CLI
        or another replica). The first sweep looks back as far as a confirmation lasts."""
        now = time.monotonic()
        with self._lock:
            if self._swept_at is not None and now - self._swept_at < REVOCATION_SWEEP_S:
                return
            # A little overlap: a revocation committed during the last sweep is not missed.
            window = self._max_age_s if self._swept_at is None else now - self._swept_at + 1.0
            self._swept_at = now
        self.refuse(*revoked_since(window))

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
            self.refuse(key)
            raise
        self.remember(key, target)
        return target
