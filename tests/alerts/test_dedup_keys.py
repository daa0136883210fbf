"""Delivery is at least once: a sender that dies between a send and the record of its outcome
leaves the notification leased, and once the lease expires it is sent again. Every send of one
event carries the same key, so receivers drop the repeat; another event gets another key."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

from alerts.dispatch import Dispatcher
from tests.alerts.conftest import Alerting, at
from tests.alerts.receivers import Receiver, Reply, serve

TEMP = "DCGM_FI_DEV_GPU_TEMP"
HOT = {"name": "GpuHot", "kind": "threshold", "query": {"metric": TEMP}, "op": ">", "threshold": 85}
LEASE = timedelta(seconds=4 * 10 + 30 + 1)
"""A claim's lease with the default 10 s timeout: 4 timeouts and a margin."""


class Clock:
    def __init__(self) -> None:
        self.now = at(0)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with serve(Receiver(Reply(202, '{"status":"success"}'))) as running:
        yield running


def send_then_die(alerting: Alerting, clock: Clock) -> None:
    """A sender that sends what it claimed and dies before recording that it did."""
    dead = Dispatcher(alerting.sessions, clock=clock)
    for batch in dead._claim(8):
        assert dead.notifiers[batch.kind].send(batch.config, batch.message).status == "sent"
    dead.close()


def resend_after_the_lease(alerting: Alerting, clock: Clock) -> None:
    fresh = Dispatcher(alerting.sessions, clock=clock)
    assert fresh.dispatch() == 0, "still leased to the dead sender"
    clock.now += LEASE
    assert fresh.dispatch() == 1
    assert fresh.drain()
    fresh.close()


def send(alerting: Alerting, clock: Clock) -> None:
    dispatcher = Dispatcher(alerting.sessions, clock=clock)
    assert dispatcher.dispatch() == 1
    assert dispatcher.drain()
    dispatcher.close()


def test_a_webhook_message_sent_again_carries_the_same_keys(
    alerting: Alerting, receiver: Receiver
) -> None:
    alerting.rule(**HOT)
    alerting.receiver("hook", receiver.url)
    alerting.write(TEMP, {"gpu": "0", "hostname": "n1"}, [(0, 95.0), (60, 40.0)])
    clock = Clock()
    alerting.evaluate(0)
    send_then_die(alerting, clock)
    resend_after_the_lease(alerting, clock)
    first, again = receiver.wait_for(2)
    assert again.headers["Idempotency-Key"] == first.headers["Idempotency-Key"]
    assert again.body == first.body  # groupKey, and each alert's fingerprint and startsAt
    assert alerting.outcomes() == [("hook", "firing", "sent", 1)]

    alerting.evaluate(60)
    clock.now = at(60) + 2 * LEASE
    send_then_die(alerting, clock)
    resend_after_the_lease(alerting, clock)
    _, _, resolved, resolved_again = receiver.wait_for(4)
    assert resolved.headers["Idempotency-Key"] == resolved_again.headers["Idempotency-Key"]
    assert resolved.headers["Idempotency-Key"] != first.headers["Idempotency-Key"]
    assert resolved.body["groupKey"] == first.body["groupKey"]
    fingerprints = [[alert["fingerprint"] for alert in r.body["alerts"]] for r in (first, resolved)]
    assert fingerprints[0] == fingerprints[1]


def test_pagerduty_events_sent_again_and_the_resolve_share_one_dedup_key(
    alerting: Alerting, receiver: Receiver
) -> None:
    alerting.rule(**HOT)
    config = {"routing_key": "R" * 32, "url": f"{receiver.url}/v2/enqueue"}
    alerting.receiver("pd", kind="pagerduty", config=config)
    alerting.write(TEMP, {"gpu": "0", "hostname": "n1"}, [(0, 95.0), (60, 40.0), (120, 96.0)])
    clock = Clock()
    alerting.evaluate(0)
    send_then_die(alerting, clock)
    resend_after_the_lease(alerting, clock)
    alerting.evaluate(60)
    send(alerting, clock)
    alerting.evaluate(120)  # the same alert fires again: a new incident
    send(alerting, clock)
    trigger, trigger_again, resolve, next_trigger = receiver.wait_for(4)
    assert [r.body["event_action"] for r in (trigger, trigger_again, resolve, next_trigger)] == [
        "trigger", "trigger", "resolve", "trigger"
    ]  # fmt: skip
    key = trigger.body["dedup_key"]
    assert trigger_again.body == trigger.body
    assert resolve.body["dedup_key"] == key
    assert next_trigger.body["dedup_key"] != key
    assert len(next_trigger.body["dedup_key"]) <= 255


def test_a_resolve_waits_for_the_firing_still_in_flight(
    alerting: Alerting, receiver: Receiver
) -> None:
    """Sent after a late re-send of the trigger, a resolve would leave an incident open."""
    alerting.rule(**HOT)
    config = {"routing_key": "R" * 32, "url": f"{receiver.url}/v2/enqueue"}
    alerting.receiver("pd", kind="pagerduty", config=config)
    alerting.write(TEMP, {"gpu": "0", "hostname": "n1"}, [(0, 95.0), (60, 40.0)])
    clock = Clock()
    alerting.evaluate(0)
    send_then_die(alerting, clock)
    alerting.evaluate(60)
    clock.now = at(60)
    waiting = Dispatcher(alerting.sessions, clock=clock)
    assert waiting.dispatch() == 0, "the trigger is still leased: the resolve waits"
    clock.now = at(0) + LEASE
    assert waiting.dispatch() == 1 and waiting.drain()  # the trigger again
    assert waiting.dispatch() == 1 and waiting.drain()  # then the resolve
    waiting.close()
    actions = [r.body["event_action"] for r in receiver.wait_for(3)]
    assert actions == ["trigger", "trigger", "resolve"]
    assert alerting.outcomes() == [("pd", "firing", "sent", 1), ("pd", "resolved", "sent", 1)]
