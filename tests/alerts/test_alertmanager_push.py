"""The ``alertmanager`` receiver: tuneloop's evaluator fires and resolves rules on stored data
(SQLite and PostgreSQL) and the dispatcher pushes them into a real Alertmanager 0.25, read back
through its API v2. The request itself (exact body, auth, resends) is checked against a fake
Alertmanager: a local recording HTTP server (``Receiver``) that keeps each request."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from alerts.dispatch import Dispatcher
from tests.alerts.conftest import Alerting, at
from tests.alerts.receivers import Receiver, Reply, serve
from tests.helpers import free_port, wait_for
from tests.peers import alertmanager_alerts, running_alertmanager
from tuneloop.errors import InvalidInput
from tuneloop.storage.types import utcnow

TEMP = "DCGM_FI_DEV_GPU_TEMP"
HOT = {
    "name": "GpuHot",
    "kind": "threshold",
    "query": {"metric": TEMP, "window": "1m"},
    "op": ">",
    "threshold": 85,
    "severity": "critical",
    "labels": {"team": "infra", "empty": ""},
    "annotations": {
        "summary": "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} at {{ $value }}C",
        "description": "Temperature above 85C.",
        "runbook_url": "https://runbooks.example/gpu-hot",
    },
}
GPU0 = {"gpu": "0", "Hostname": "n1"}
EXTERNAL = "http://tuneloop.example:8000"
RULE_URL = f"{EXTERNAL}/api/v1/projects/alpha/alerts/rules/GpuHot"
AM_CONFIG = {
    "route": {"receiver": "blackhole", "group_by": ["alertname"]},
    "receivers": [{"name": "blackhole"}],
}


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    with running_alertmanager(AM_CONFIG, tmp_path / "am") as url:
        yield url


def ends(alert: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(alert["endsAt"])


def send(dispatcher: Dispatcher) -> None:
    dispatcher.dispatch()
    assert dispatcher.drain()


def test_a_firing_alert_is_active_in_alertmanager_and_ends_when_it_resolves(
    alerting: Alerting, alertmanager: str
) -> None:
    alerting.rule(**HOT)
    alerting.receiver("am", kind="alertmanager", config={"urls": [alertmanager]})
    dispatcher = Dispatcher(alerting.sessions, external_url=EXTERNAL)
    alerting.write(TEMP, GPU0, [(0, 95.0), (30, 95.0), (60, 95.0), (90, 40.0)])
    alerting.evaluate(0)
    send(dispatcher)

    wait_for(lambda: len(alertmanager_alerts(alertmanager)) == 1, 10, "the alert in Alertmanager")
    (alert,) = alertmanager_alerts(alertmanager)
    assert alert["labels"] == {
        "alertname": "GpuHot", "severity": "critical", "team": "infra", **GPU0
    }  # fmt: skip
    assert alert["annotations"] == {
        "summary": "GPU 0 on n1 at 95C",
        "description": "Temperature above 85C.",
        "runbook_url": "https://runbooks.example/gpu-hot",
    }
    assert alert["generatorURL"] == RULE_URL
    assert alert["startsAt"].startswith("2026-11-23T12:00:00")
    assert alert["status"]["state"] in ("active", "unprocessed")
    assert alert["receivers"] == [{"name": "blackhole"}]
    # Active for four resend intervals unless sent again.
    ahead = ends(alert) - utcnow()
    assert timedelta(minutes=3) < ahead <= timedelta(minutes=4)

    # Sent again once resend_interval (1m) passed: Alertmanager keeps it active longer.
    alerting.evaluate(30)
    send(dispatcher)
    (again,) = alertmanager_alerts(alertmanager)
    assert again["endsAt"] == alert["endsAt"], "not before resend_interval"
    time.sleep(0.01)
    alerting.evaluate(60)
    send(dispatcher)
    wait_for(lambda: ends(alertmanager_alerts(alertmanager)[0]) > ends(alert), 10, "endsAt to move")

    alerting.evaluate(90)
    send(dispatcher)
    wait_for(lambda: alertmanager_alerts(alertmanager) == [], 10, "the alert to end")
    assert alerting.outcomes() == [("am", "firing", "sent", 1), ("am", "resolved", "sent", 1)]
    dispatcher.close()


def test_the_request_is_prometheus_shaped_and_firing_alerts_are_resent(
    alerting: Alerting,
) -> None:
    clock = Clock(at(0))
    with serve(Receiver()) as recorder:
        alerting.rule(**HOT)
        alerting.receiver(
            "am", kind="alertmanager",
            config={"urls": [recorder.url + "/"], "username": "tl", "password": "s3cret",
                    "resend_interval": "1m"},
        )  # fmt: skip
        dispatcher = Dispatcher(alerting.sessions, external_url=EXTERNAL, clock=clock)
        alerting.write(TEMP, GPU0, [(t, 95.0) for t in range(0, 121, 30)] + [(150, 40.0)])
        for seconds in (0, 30, 59, 60, 90, 120, 150, 180):
            clock.now = at(seconds)
            alerting.evaluate(seconds)
            send(dispatcher)

        sent = recorder.received
        assert [request.path for request in sent] == ["/api/v2/alerts"] * 4
        expected = base64.b64encode(b"tl:s3cret").decode()
        assert {request.headers["Authorization"] for request in sent} == {f"Basic {expected}"}
        first: list[dict[str, Any]] = sent[0].body
        assert first == [
            {
                "labels": {"alertname": "GpuHot", "severity": "critical", "team": "infra", **GPU0},
                "annotations": {
                    "summary": "GPU 0 on n1 at 95C",
                    "description": "Temperature above 85C.",
                    "runbook_url": "https://runbooks.example/gpu-hot",
                },
                "startsAt": "2026-11-23T12:00:00Z",
                # Four resend intervals ahead: still active if a resend or two is lost.
                "endsAt": "2026-11-23T12:04:00Z",
                "generatorURL": RULE_URL,
            }
        ]
        # Sent again every resend interval while firing, each time kept active four more.
        assert [request.body[0]["endsAt"] for request in sent[1:3]] == [
            "2026-11-23T12:05:00Z",
            "2026-11-23T12:06:00Z",
        ]
        # Resolved: once, ending when it resolved.
        assert sent[3].body[0]["endsAt"] == "2026-11-23T12:02:30Z"
        assert sent[3].body[0]["startsAt"] == "2026-11-23T12:00:00Z"
        # One row per firing and one per resolution, however often it was resent.
        assert alerting.outcomes() == [("am", "firing", "sent", 1), ("am", "resolved", "sent", 1)]
        dispatcher.close()


def test_tuneloop_silences_do_not_hold_back_what_alertmanager_decides(
    alerting: Alerting,
) -> None:
    """Silences and inhibit rules for Alertmanager's alerts live in Alertmanager: tuneloop's
    own mute only its own receivers."""
    with serve(Receiver()) as recorder, serve(Receiver()) as hook:
        alerting.rule(**{**HOT, "labels": {}})
        alerting.receiver("am", kind="alertmanager", config={"urls": [recorder.url]})
        alerting.receiver("hook", hook.url)
        alerting.silence(['alertname="GpuHot"'], at(-10), at(600))
        dispatcher = Dispatcher(alerting.sessions)
        alerting.write(TEMP, GPU0, [(0, 95.0)])
        alerting.evaluate(0)
        send(dispatcher)
        assert len(recorder.received) == 1
        assert hook.received == []
        dispatcher.close()


def test_a_down_or_refusing_alertmanager_breaks_no_other_receiver(alerting: Alerting) -> None:
    clock = Clock(at(0))
    refusing = Receiver(Reply(400, '{"message": "bad alerts"}'))
    with serve(refusing), serve(Receiver()) as hook:
        alerting.rule(**HOT)
        down = f"http://127.0.0.1:{free_port()}"
        alerting.receiver("down", kind="alertmanager", config={"urls": [down]})
        alerting.receiver("refusing", kind="alertmanager", config={"urls": [refusing.url]})
        alerting.receiver("hook", hook.url)
        dispatcher = Dispatcher(alerting.sessions, clock=clock, rng=lambda: 1.0)
        alerting.write(TEMP, GPU0, [(t, 95.0) for t in range(0, 121, 30)])
        alerting.evaluate(0)
        send(dispatcher)
        hook.wait_for(1)
        by_name = {name: (status, tries) for name, _, status, tries in alerting.outcomes()}
        assert by_name == {
            "down": ("pending", 1),  # connection refused: retried with backoff
            "refusing": ("failed", 1),  # 400: sending it again cannot help
            "hook": ("sent", 1),
        }
        assert alerting.receiver_row("down").last_error == "request failed (ConnectError)"
        assert alerting.receiver_row("refusing").last_error == "HTTP 400: Bad Request"

        # Retried on the dispatcher's backoff (1 s, 2 s, ...), not queued again meanwhile.
        clock.now = at(1)
        alerting.evaluate(1)
        send(dispatcher)
        assert alerting.receiver_row("down").consecutive_failures == 2
        assert len(alerting.outcomes()) == 3

        # A refused push is tried again at the next resend, in case the Alertmanager was fixed.
        refusing.default = Reply()
        clock.now = at(60)
        alerting.evaluate(60)
        send(dispatcher)
        assert len(refusing.received) == 2
        assert alerting.receiver_row("refusing").consecutive_failures == 0
        dispatcher.close()


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ({"urls": []}, "urls"),
        ({"urls": ["ftp://am:9093"]}, "must be an http:// or https:// URL"),
        ({"urls": ["http://am:9093"], "username": "u"}, "needs both username and password"),
        ({"urls": ["http://am:9093"], "resend_interval": "0s"}, "resend_interval"),
        ({"urls": ["http://am:9093"], "group_wait": "30s"}, "group_wait"),
    ],
)
def test_invalid_alertmanager_receivers_are_refused(
    alerting: Alerting, config: dict[str, Any], problem: str
) -> None:
    with pytest.raises(InvalidInput, match=problem):
        alerting.receiver("am", kind="alertmanager", config=config)


def test_the_ssrf_guard_applies_to_every_alertmanager_url(
    alerting: Alerting, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TUNELOOP_ALERTS_ALLOWED_TARGET_NETWORKS")
    with pytest.raises(InvalidInput, match="loopback"):
        alerting.receiver(
            "am", kind="alertmanager",
            config={"urls": ["http://93.184.216.34:9093", "http://127.0.0.1:9093"]},
            allowed_networks=[],
        )  # fmt: skip


def test_resend_interval_is_kept_apart_from_the_evaluation_interval() -> None:
    """``endsAt`` is four times the longer of the two: a slow evaluator does not let
    Alertmanager expire an alert between two passes."""
    from alerts.notifiers.alertmanager import postable
    from alerts.notifiers.base import AlertMessage

    message = AlertMessage(1, "firing", "f" * 64, {"alertname": "A"}, {}, at(0), None, 1.0)
    body = postable(message, now=at(10), hold=timedelta(minutes=2), external_url="")
    assert body["endsAt"] == "2026-11-23T12:08:10Z"
    assert "generatorURL" not in body
