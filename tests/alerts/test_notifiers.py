"""Each notifier against a local server speaking its protocol: an HTTP receiver standing in for
an Alertmanager webhook receiver, a Slack incoming webhook and PagerDuty's Events API v2, and a
local SMTP server (aiosmtpd) for e-mail. Payloads are checked field by field."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from email import message_from_bytes
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from alerts import store
from alerts.dispatch import Dispatcher
from alerts.rules import parse_rule
from alerts.tasks import close_components, run_evaluation, run_notifications
from tests.alerts.conftest import Alerting, at
from tests.alerts.receivers import Receiver, Reply, serve
from tests.helpers import free_port, wait_for
from tuneloop import accounts
from tuneloop.settings import Settings, configure, load_settings
from tuneloop.storage import make_engine, session_scope
from tuneloop.storage.models import metadata
from tuneloop.storage.timeseries.types import SeriesBatch
from tuneloop.storage.timeseries.writer import SampleWriter
from tuneloop.storage.types import utcnow
from tuneloop.taskqueue.maintenance import close_task_runtime, task_runtime

TEMP = "DCGM_FI_DEV_GPU_TEMP"
RFC3339_Z = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
HOT = {
    "name": "GpuHot",
    "kind": "threshold",
    "query": {"metric": TEMP, "window": "1m"},
    "op": ">",
    "threshold": 85,
    "severity": "critical",
    "annotations": {
        "summary": "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} at {{ $value }}C",
        "runbook_url": "https://runbooks.example/gpu-hot",
    },
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


def fire_and_resolve(alerting: Alerting, dispatcher: Dispatcher, gpus: tuple[str, ...]) -> None:
    """Two GPUs go hot at 0 and cool down at 60; each step is dispatched."""
    for gpu in gpus:
        alerting.write(TEMP, {"gpu": gpu, "Hostname": "n1"}, [(0, 95.0), (60, 40.0)])
    alerting.evaluate(0)
    dispatcher.dispatch()
    assert dispatcher.drain()
    alerting.evaluate(60)
    dispatcher.dispatch()
    assert dispatcher.drain()


def test_webhook_sends_alertmanager_payload_version_4(
    alerting: Alerting, receiver: Receiver
) -> None:
    alerting.rule(**HOT)
    alerting.receiver("team-hook", f"{receiver.url}/alerts", group_by=["alertname", "Hostname"])
    dispatcher = Dispatcher(alerting.sessions, external_url="http://tuneloop:8000")
    fire_and_resolve(alerting, dispatcher, ("0", "1"))
    firing, resolved = receiver.wait_for(2)
    assert firing.path == "/alerts"
    assert firing.headers["Content-Type"] == "application/json"
    body = firing.body
    assert set(body) == {
        "version", "groupKey", "truncatedAlerts", "status", "receiver", "groupLabels",
        "commonLabels", "commonAnnotations", "externalURL", "alerts",
    }  # fmt: skip
    assert body["version"] == "4"
    assert body["groupKey"] == '{}/{}:{Hostname="n1", alertname="GpuHot"}'
    assert body["truncatedAlerts"] == 0
    assert body["status"] == "firing"
    assert body["receiver"] == "team-hook"
    assert body["groupLabels"] == {"alertname": "GpuHot", "Hostname": "n1"}
    assert body["commonLabels"] == {"alertname": "GpuHot", "Hostname": "n1", "severity": "critical"}
    assert body["commonAnnotations"] == {"runbook_url": "https://runbooks.example/gpu-hot"}
    assert body["externalURL"] == "http://tuneloop:8000"
    assert len(body["alerts"]) == 2
    for gpu, alert in zip(("0", "1"), sorted(body["alerts"], key=lambda a: a["labels"]["gpu"])):
        assert set(alert) == {
            "status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint"
        }  # fmt: skip
        assert alert["status"] == "firing"
        assert alert["labels"] == {
            "alertname": "GpuHot", "severity": "critical", "gpu": gpu, "Hostname": "n1"
        }  # fmt: skip
        assert alert["annotations"]["summary"] == f"GPU {gpu} on n1 at 95C"
        assert alert["startsAt"] == "2026-11-23T12:00:00Z"
        assert alert["endsAt"] == "0001-01-01T00:00:00Z"
        assert (
            alert["generatorURL"]
            == "http://tuneloop:8000/api/v1/projects/alpha/alerts/rules/GpuHot"
        )
        assert re.fullmatch(r"[0-9a-f]{16}", alert["fingerprint"])
    assert resolved.body["status"] == "resolved"
    assert {a["status"] for a in resolved.body["alerts"]} == {"resolved"}
    assert {a["endsAt"] for a in resolved.body["alerts"]} == {"2026-11-23T12:01:00Z"}
    assert alerting.outcomes() == [
        ("team-hook", e, "sent", 1) for e in ("firing",) * 2 + ("resolved",) * 2
    ]
    dispatcher.close()


def test_slack_incoming_webhook_payload_and_a_4xx_is_not_retried(
    alerting: Alerting, receiver: Receiver
) -> None:
    alerting.rule(**HOT)
    alerting.receiver("slack", kind="slack", config={"url": f"{receiver.url}/services/T/B/X",
                                                     "channel": "#gpu-oncall"})  # fmt: skip
    receiver.script = [Reply(200, "ok"), Reply(400, "invalid_payload")]
    dispatcher = Dispatcher(alerting.sessions)
    fire_and_resolve(alerting, dispatcher, ("0",))
    firing, resolved = receiver.wait_for(2)
    body = firing.body
    assert set(body) == {"text", "blocks", "channel"}
    assert body["text"] == "[FIRING:1] GpuHot"
    assert body["channel"] == "#gpu-oncall"
    header, section = body["blocks"]
    assert header == {"type": "header", "text": {"type": "plain_text", "text": "[FIRING:1] GpuHot"}}
    assert section["type"] == "section" and section["text"]["type"] == "mrkdwn"
    assert ":red_circle: *GPU 0 on n1 at 95C*" in section["text"]["text"]
    assert resolved.body["text"] == "[RESOLVED] GpuHot"
    # Slack refused the second message: recorded as failed after one attempt, never retried.
    assert alerting.outcomes() == [
        ("slack", "firing", "sent", 1),
        ("slack", "resolved", "failed", 1),
    ]
    assert dispatcher.dispatch() == 0
    health = alerting.receiver_row("slack")
    assert health.consecutive_failures == 1
    # The code and its standard phrase: what the receiver answered is never echoed back.
    assert health.last_error == "HTTP 400: Bad Request"
    dispatcher.close()


def test_pagerduty_trigger_and_resolve_share_a_stable_dedup_key(
    alerting: Alerting, receiver: Receiver
) -> None:
    alerting.rule(**HOT)
    key = "R0UT1NGK3Y0123456789abcdefABCDEF"
    config = {"routing_key": key, "url": f"{receiver.url}/v2/enqueue"}
    alerting.receiver("pd", kind="pagerduty", config=config)
    accepted = Reply(202, '{"status":"success","message":"Event processed","dedup_key":"x"}')
    receiver.default = accepted
    receiver.script = [Reply(429, '{"status":"throttle"}', headers={"Retry-After": "0"})]
    clock = Clock()
    dispatcher = Dispatcher(alerting.sessions, clock=clock, rng=lambda: 0.0)
    alerting.write(TEMP, {"gpu": "0", "Hostname": "n1"}, [(0, 95.0), (60, 40.0)])
    alerting.evaluate(0)
    dispatcher.dispatch()
    assert dispatcher.drain()
    assert alerting.outcomes() == [("pd", "firing", "pending", 1)]  # throttled: retried later
    assert dispatcher.dispatch() == 0  # not before its backoff
    clock.now = at(1)
    dispatcher.dispatch()
    assert dispatcher.drain()
    alerting.evaluate(60)
    clock.now = at(60)
    dispatcher.dispatch()
    assert dispatcher.drain()
    throttled, trigger, resolve = receiver.wait_for(3)
    assert throttled.body == trigger.body
    assert trigger.path == "/v2/enqueue"
    body = trigger.body
    assert set(body) == {"routing_key", "event_action", "dedup_key", "payload", "client", "links"}
    assert body["routing_key"] == key
    assert body["event_action"] == "trigger"
    payload: dict[str, Any] = body["payload"]
    assert payload["summary"] == "GPU 0 on n1 at 95C"
    assert payload["source"] == "n1"
    assert payload["severity"] == "critical"
    assert RFC3339_Z.fullmatch(payload["timestamp"])
    assert payload["component"] == "gpu 0"
    assert payload["class"] == "GpuHot"
    assert payload["custom_details"]["labels"]["gpu"] == "0"
    assert body["client"] == "tuneloop"
    assert body["links"] == [{"href": "https://runbooks.example/gpu-hot", "text": "Runbook"}]
    assert resolve.body == {
        "routing_key": key, "event_action": "resolve", "dedup_key": body["dedup_key"]
    }  # fmt: skip
    assert len(body["dedup_key"]) <= 255
    assert alerting.outcomes() == [("pd", "firing", "sent", 2), ("pd", "resolved", "sent", 1)]
    dispatcher.close()


class _Inbox:
    def __init__(self) -> None:
        self.messages: list[tuple[str, list[str], Message]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(
            (envelope.mail_from, list(envelope.rcpt_tos), message_from_bytes(envelope.content))
        )
        return "250 Message accepted for delivery"


def test_email_over_smtp_to_a_local_server(alerting: Alerting) -> None:
    inbox = _Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        alerting.rule(**HOT)
        alerting.receiver("mail", kind="email", config={
            "to": ["oncall@example.org"], "from": "tuneloop@example.org",
            "host": "127.0.0.1", "port": port,
        })  # fmt: skip
        dispatcher = Dispatcher(alerting.sessions)
        fire_and_resolve(alerting, dispatcher, ("0",))
        dispatcher.close()
        wait_for(lambda: len(inbox.messages) >= 2, 5, "the firing and resolved mails")
    finally:
        controller.stop()
    (sender, recipients, firing), (_, _, resolved) = inbox.messages
    assert sender == "tuneloop@example.org" and recipients == ["oncall@example.org"]
    assert firing["Subject"] == "[FIRING:1] GpuHot"
    assert firing["To"] == "oncall@example.org"
    text = firing.get_payload(decode=True).decode()
    assert "summary: GPU 0 on n1 at 95C" in text and 'gpu="0"' in text
    assert resolved["Subject"] == "[RESOLVED] GpuHot"
    assert alerting.outcomes() == [("mail", "firing", "sent", 1), ("mail", "resolved", "sent", 1)]


def test_5xx_is_retried_with_backoff_and_a_slow_receiver_blocks_no_one(
    alerting: Alerting,
) -> None:
    broken, slow, healthy = Receiver(Reply(503, "busy")), Receiver(Reply(delay_s=1.5)), Receiver()
    with serve(broken), serve(slow), serve(healthy):
        alerting.rule(**{**HOT, "severity": "warning"})
        alerting.receiver("broken", broken.url)
        alerting.receiver("slow", kind="webhook", config={"url": slow.url, "timeout_s": 0.5})
        alerting.receiver("healthy", healthy.url)
        clock = Clock()
        dispatcher = Dispatcher(alerting.sessions, clock=clock, rng=lambda: 1.0)
        alerting.write(TEMP, {"gpu": "0", "Hostname": "n1"}, [(0, 95.0)])
        alerting.evaluate(0)
        started = time.monotonic()
        assert dispatcher.dispatch() == 3
        assert time.monotonic() - started < 0.5, "dispatch hands the sends to the pool"
        healthy.wait_for(1, timeout_s=2)
        assert time.monotonic() - started < 0.5, "the slow receiver held up the healthy one"
        assert dispatcher.drain()
        by_name = {name: (status, tries) for name, _, status, tries in alerting.outcomes()}
        assert by_name == {"broken": ("pending", 1), "slow": ("pending", 1), "healthy": ("sent", 1)}
        assert alerting.receiver_row("slow").last_error == "timed out after 0.5s"
        slow.default = Reply()
        # Backoff doubles with each failure (jitter drawn at its maximum here): 1 s, 2 s, 4 s.
        for attempt, wait_s in ((2, 1.0), (3, 2.0), (4, 4.0)):
            clock.now += timedelta(seconds=wait_s - 0.01)
            assert dispatcher.dispatch() == 0, "not before its backoff"
            clock.now += timedelta(seconds=0.01)
            assert dispatcher.dispatch() >= 1
            assert dispatcher.drain()
            assert len(broken.received) == attempt
        assert alerting.receiver_row("broken").consecutive_failures == 4
        assert alerting.receiver_row("broken").last_error == "HTTP 503: Service Unavailable"
        assert alerting.receiver_row("slow").consecutive_failures == 0
        dispatcher.close()


def test_a_dispatcher_that_dies_mid_send_is_replaced_without_losing_it(
    alerting: Alerting, receiver: Receiver
) -> None:
    alerting.rule(**HOT)
    alerting.receiver("hook", receiver.url)
    alerting.write(TEMP, {"gpu": "0", "Hostname": "n1"}, [(0, 95.0)])
    alerting.evaluate(0)
    clock = Clock()
    dead = Dispatcher(alerting.sessions, clock=clock)
    assert len(dead._claim(8)) == 1  # claimed; the process dies before it sends
    dead.close()
    fresh = Dispatcher(alerting.sessions, clock=clock)
    assert fresh.dispatch() == 0, "still leased to the dead sender"
    clock.now += timedelta(seconds=4 * 10 + 30 + 1)  # the lease: 4 timeouts and a margin
    assert fresh.dispatch() == 1
    assert fresh.drain()
    assert len(receiver.wait_for(1)) == 1
    assert fresh.dispatch() == 0
    assert alerting.outcomes() == [("hook", "firing", "sent", 1)]
    fresh.close()


def test_the_periodic_tasks_evaluate_and_send_at_once(tmp_path: Path, receiver: Receiver) -> None:
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    configure(Settings(database_url=url, redis_url=None))
    try:
        engine = make_engine(url)
        metadata.create_all(engine)
        engine.dispose()
        runtime = task_runtime()
        with session_scope(runtime.sessions) as session:
            project = accounts.create_project(session, "alpha")
            store.create_rule(session, project, parse_rule({**HOT, "name": "GpuHotNow"}))
            store.create_receiver(
                session, project, name="hook", kind="webhook", config={"url": receiver.url}
            )
            project_id = project.id
        batch = SeriesBatch(TEMP, {"gpu": "0", "Hostname": "n1"}, [utcnow()], [97.0])
        SampleWriter(runtime.engine).write(project_id, [batch])
        run_evaluation(runtime)  # queues, then starts sending without waiting for run_notifications
        (received,) = receiver.wait_for(1)
        assert received.body["alerts"][0]["labels"]["alertname"] == "GpuHotNow"
        run_notifications(runtime)
        assert len(receiver.received) == 1
    finally:
        close_components()
        close_task_runtime()
        configure(load_settings())
