"""Alertmanager's route timers on tuneloop's own routing (SQLite and PostgreSQL):
``group_wait`` collects a new group's alerts into one message, ``group_interval`` spaces a
group's messages, ``repeat_interval`` announces a still-firing alert again."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import pytest

from alerts.dispatch import Dispatcher
from tests.alerts.conftest import Alerting, at
from tests.alerts.receivers import Receiver, serve

TEMP = "DCGM_FI_DEV_GPU_TEMP"
HOT = {
    "name": "GpuHot",
    "kind": "threshold",
    "query": {"metric": TEMP, "window": "1m"},
    "op": ">",
    "threshold": 85,
}


class Clock:
    def __init__(self) -> None:
        self.now = at(0)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with serve(Receiver()) as running:
        yield running


def step(alerting: Alerting, dispatcher: Dispatcher, clock: Clock, seconds: float) -> int:
    """Evaluate and dispatch at ``seconds``; the groups sent."""
    clock.now = at(seconds)
    alerting.evaluate(seconds)
    sent = dispatcher.dispatch()
    assert dispatcher.drain()
    return sent


def gpus(message: dict[str, object]) -> list[tuple[str, str]]:
    alerts = message["alerts"]
    assert isinstance(alerts, list)
    return sorted((a["labels"]["gpu"], a["status"]) for a in alerts)


def test_group_wait_collects_and_group_interval_spaces_a_groups_messages(
    alerting: Alerting, receiver: Receiver
) -> None:
    alerting.rule(**HOT)
    alerting.receiver(
        "hook", kind="webhook",
        config={"url": receiver.url, "group_wait": "30s", "group_interval": "5m"},
    )  # fmt: skip
    clock = Clock()
    dispatcher = Dispatcher(alerting.sessions, clock=clock)
    hot = [(t, 95.0) for t in range(0, 601, 10)]
    alerting.write(TEMP, {"gpu": "0", "hostname": "n1"}, hot)
    alerting.write(TEMP, {"gpu": "1", "hostname": "n1"}, [(t, v) for t, v in hot if t >= 10])
    alerting.write(TEMP, {"gpu": "2", "hostname": "n1"}, [(t, v) for t, v in hot if t >= 60])

    assert step(alerting, dispatcher, clock, 0) == 0, "waits group_wait for more"
    assert step(alerting, dispatcher, clock, 10) == 0
    assert step(alerting, dispatcher, clock, 30) == 1
    (first,) = receiver.wait_for(1)
    assert gpus(first.body) == [("0", "firing"), ("1", "firing")]

    # GPU 2 joins a group that had a message 30 s ago: it goes out group_interval after it.
    assert step(alerting, dispatcher, clock, 60) == 0
    assert step(alerting, dispatcher, clock, 329) == 0
    assert step(alerting, dispatcher, clock, 330) == 1
    assert gpus(receiver.wait_for(2)[1].body) == [("2", "firing")]
    assert [status for _, _, status, _ in alerting.outcomes()] == ["sent"] * 3
    dispatcher.close()


def test_repeat_interval_announces_a_still_firing_alert_again(
    alerting: Alerting, receiver: Receiver
) -> None:
    alerting.rule(**HOT)
    alerting.receiver("hook", kind="webhook", config={"url": receiver.url, "repeat_interval": "1h"})
    clock = Clock()
    dispatcher = Dispatcher(alerting.sessions, clock=clock)
    hot = [(t, 95.0) for t in range(0, 7201, 30)]
    alerting.write(TEMP, {"gpu": "0", "hostname": "n1"}, [*hot, (7230, 40.0)])
    for seconds in (0, 60, 1800, 3599):
        step(alerting, dispatcher, clock, seconds)
    assert len(receiver.received) == 1
    step(alerting, dispatcher, clock, 3600)
    step(alerting, dispatcher, clock, 3660)
    assert len(receiver.received) == 2, "once an hour, not once a pass"
    step(alerting, dispatcher, clock, 7200)
    step(alerting, dispatcher, clock, 7230)
    assert alerting.notifications() == [
        ("hook", "firing", "GpuHot/gpu=0/hostname=n1"),
        ("hook", "firing", "GpuHot/gpu=0/hostname=n1"),
        ("hook", "firing", "GpuHot/gpu=0/hostname=n1"),
        ("hook", "resolved", "GpuHot/gpu=0/hostname=n1"),
    ]
    # The repeats are the same alert to the receiver: one dedup key, one start.
    bodies = [request.body["alerts"][0] for request in receiver.wait_for(4)]
    assert {body["startsAt"] for body in bodies} == {"2026-11-23T12:00:00Z"}
    assert {body["fingerprint"] for body in bodies} == {bodies[0]["fingerprint"]}
    dispatcher.close()


def test_without_timers_nothing_waits_or_repeats(alerting: Alerting, receiver: Receiver) -> None:
    alerting.rule(**HOT)
    alerting.receiver("hook", receiver.url)
    clock = Clock()
    dispatcher = Dispatcher(alerting.sessions, clock=clock)
    hot = [(t, 95.0) for t in range(0, 3 * 3600, 60)]
    alerting.write(TEMP, {"gpu": "0", "hostname": "n1"}, hot)
    assert step(alerting, dispatcher, clock, 0) == 1
    for seconds in (3600, 2 * 3600):
        assert step(alerting, dispatcher, clock, seconds) == 0
    assert len(receiver.received) == 1
