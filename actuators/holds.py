"""Why a job's newest desired config is not released yet, and until when: what the config
endpoints answer as ``held``, read from the reconcile loop's last decision on the actuator row
(so it is as fresh as the last pass: an agent's long-poll runs one before it answers).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from tuneloop.storage.models import JobActuator

CONDITION: Final = "reconcile"
"""Key of the reconcile loop's last decision in ``JobActuator.conditions``."""

HOLD_REASONS: Final = frozenset(
    {
        "frozen",
        "awaiting_approval",
        "dry_run",
        "out_of_bounds",
        "verifying",
        "awaiting_measurements",
        "measuring_baseline",
    }
)
"""Decision reasons that keep a desired version from being released."""


@dataclass(frozen=True, slots=True)
class Hold:
    reason: str
    """One of :data:`HOLD_REASONS`."""
    version: int | None
    """The desired version held."""
    until: datetime | None
    """When the hold ends by itself; ``None``: only a person ends it (approval, dry run,
    bounds)."""
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "version": self.version,
            "until": self.until.isoformat() if self.until is not None else None,
            "message": self.message,
        }


def condition_entry(
    action: str, reason: str, message: str, retry_at: float | None
) -> dict[str, Any]:
    """The condition the reconcile loop records for a decision (``until`` for :func:`hold`)."""
    until = None if retry_at is None else datetime.fromtimestamp(retry_at, UTC).isoformat()
    return {"action": action, "reason": reason, "message": message, "until": until}


def hold(row: JobActuator | None) -> Hold | None:
    """The hold on the job's goal, or ``None`` when nothing waits (in sync, or released)."""
    if row is None or row.goal_version is None or row.goal_version == row.released_version:
        return None
    condition = (row.conditions or {}).get(CONDITION) or {}
    reason = condition.get("reason")
    if reason not in HOLD_REASONS:
        return None
    until = condition.get("until")
    return Hold(
        reason=str(reason),
        version=row.goal_version,
        until=datetime.fromisoformat(until) if isinstance(until, str) else None,
        message=str(condition.get("message", "")),
    )
