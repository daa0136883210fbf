"""The pure parts: the state machine, what receivers hear, silences and inhibit rules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from alerts.muting import InhibitIndex, Inhibition, Silence, matcher, mute_reason
from alerts.state import AlertState, Event, State, advance, event_due

T = datetime(2026, 1, 1, tzinfo=UTC)
FOR = timedelta(seconds=60)


def step(previous: AlertState | None, holds: bool, seconds: int) -> AlertState | None:
    return advance(previous, holds=holds, value=1.0 if holds else None,
                   now=T + timedelta(seconds=seconds), hold_for=FOR)  # fmt: skip


def test_the_state_machine() -> None:
    pending = step(None, True, 0)
    assert pending is not None and pending.state is State.PENDING and pending.active_at == T
    still = step(pending, True, 59)
    assert still is not None and still.state is State.PENDING
    firing = step(still, True, 60)
    assert firing is not None and firing.state is State.FIRING
    assert firing.fired_at == T + FOR
    resolved = step(firing, False, 90)
    assert resolved is not None and resolved.state is State.RESOLVED
    again = step(resolved, True, 100)
    assert again is not None and again.state is State.PENDING
    assert again.active_at == T + timedelta(seconds=100)
    gone = step(again, False, 110)
    assert gone is not None and gone.state is State.INACTIVE
    assert step(None, False, 0) is None
    at_once = advance(None, holds=True, value=1.0, now=T, hold_for=timedelta(0))
    assert at_once is not None and at_once.state is State.FIRING


@pytest.mark.parametrize(
    ("state", "notified", "muted", "due"),
    [
        (State.FIRING, None, False, Event.FIRING),
        (State.FIRING, "firing", False, None),
        (State.FIRING, None, True, None),
        (State.FIRING, "resolved", False, Event.FIRING),
        (State.RESOLVED, "firing", False, Event.RESOLVED),
        (State.RESOLVED, "firing", True, Event.RESOLVED),
        (State.RESOLVED, None, False, None),
        (State.RESOLVED, "resolved", False, None),
        (State.PENDING, None, False, None),
    ],
)
def test_what_receivers_hear(
    state: State, notified: str | None, muted: bool, due: Event | None
) -> None:
    assert event_due(state, notified, muted=muted) == due


def test_silences_and_inhibit_rules() -> None:
    node_down = {"alertname": "GpuNodeDown", "hostname": "n1"}
    gpu_n1 = {"alertname": "GpuXidError", "hostname": "n1", "gpu": "0"}
    gpu_n2 = {"alertname": "GpuXidError", "hostname": "n2", "gpu": "0"}
    rule = Inhibition((matcher('alertname="GpuNodeDown"'),), (matcher('gpu=~".+"'),), ("hostname",))
    index = InhibitIndex([node_down, gpu_n1, gpu_n2], [rule])
    assert index.inhibits(gpu_n1)
    assert not index.inhibits(gpu_n2)
    assert not index.inhibits(node_down)  # not a target
    # An alert that is both source and target does not inhibit itself.
    both = Inhibition((matcher('alertname="A"'),), (matcher('alertname="A"'),), ("hostname",))
    a1 = {"alertname": "A", "hostname": "n1"}
    assert not InhibitIndex([a1], [both]).inhibits(a1)
    assert InhibitIndex([a1, {**a1, "x": "1"}], [both]).inhibits(a1)

    silence = Silence(7, (matcher('hostname="n2"'),), T, T + timedelta(hours=1))
    none = InhibitIndex([], [])
    assert mute_reason(gpu_n2, silences=[silence], inhibit=none, now=T) == "silence:7"
    later = T + timedelta(hours=1)
    assert mute_reason(gpu_n2, silences=[silence], inhibit=none, now=later) is None
    assert mute_reason(gpu_n1, silences=[silence], inhibit=index, now=T) == "inhibited"
