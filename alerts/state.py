"""The alert state machine and what to tell the receivers (pure: no I/O).

``inactive -> pending -> firing -> resolved``, as Prometheus: a condition that starts holding
makes the alert pending (firing at once with ``for: 0``); one that held for ``for`` makes it
firing; a pending alert whose condition stops goes back to inactive without a word, a firing
one resolves. A resolved alert whose condition holds again starts over at pending.

What the receivers hear is decided apart from the state: the last event queued for them
(``notified``) is stored with the state, in the same transaction, so an evaluator that restarts
anywhere neither pages twice nor forgets to say an alert is over.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum


class State(StrEnum):
    INACTIVE = "inactive"
    PENDING = "pending"
    FIRING = "firing"
    RESOLVED = "resolved"


class Event(StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"


@dataclass(frozen=True, slots=True)
class AlertState:
    state: State
    active_at: datetime | None = None
    fired_at: datetime | None = None
    resolved_at: datetime | None = None
    value: float | None = None


def advance(
    previous: AlertState | None,
    *,
    holds: bool,
    value: float | None,
    now: datetime,
    hold_for: timedelta,
) -> AlertState | None:
    """The state after one evaluation at ``now``; ``None`` for an alert that never was."""
    if not holds:
        if previous is None:
            return None
        if previous.state is State.PENDING:
            return replace(previous, state=State.INACTIVE)
        if previous.state is State.FIRING:
            return replace(previous, state=State.RESOLVED, resolved_at=now)
        return previous
    if previous is None or previous.state in (State.INACTIVE, State.RESOLVED):
        if hold_for <= timedelta(0):
            return AlertState(State.FIRING, active_at=now, fired_at=now, value=value)
        return AlertState(State.PENDING, active_at=now, value=value)
    if previous.state is State.PENDING:
        assert previous.active_at is not None
        if now - previous.active_at >= hold_for:
            return replace(previous, state=State.FIRING, fired_at=now, value=value)
        return replace(previous, value=value)
    return replace(previous, value=value)


def event_due(state: State, notified: str | None, *, muted: bool) -> Event | None:
    """The event to queue for the receivers now, if any.

    A firing alert is announced once, unless muted (silenced or inhibited); muted, it is
    announced when the mute ends, if it still fires. An alert that was announced is announced
    resolved when it resolves, muted or not: on-call hears it is over.
    """
    if state is State.FIRING:
        return Event.FIRING if not muted and notified != Event.FIRING else None
    if notified == Event.FIRING:
        return Event.RESOLVED
    return None
