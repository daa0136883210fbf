"""Alertmanager's API v2 (``POST /api/v2/alerts``), as Prometheus's notifier uses it: tuneloop's
alerts join the routing, silences, inhibit rules and on-call of the user's own Alertmanager.

Each alert is a ``postableAlert``: ``labels`` (``alertname``, ``severity`` and the series' labels;
empty values left out, as Prometheus drops them), ``annotations`` (the rule's rendered ones),
``startsAt``, ``endsAt`` and ``generatorURL`` (the rule in tuneloop's API). A firing alert is
sent again every ``resend_interval`` (the evaluator queues it) with ``endsAt`` four intervals
ahead, stamped when it is sent, so Alertmanager keeps it active while tuneloop keeps sending
and lets it expire if tuneloop goes away; a resolved one is sent with ``endsAt`` its resolve
time. Alertmanager answers 200; 400 means the alerts are invalid (not retried), 5xx and
timeouts are retried.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import httpx

from alerts.notifiers.base import AlertMessage, GroupMessage, Outcome, post_json, rfc3339
from alerts.notifiers.config import AlertmanagerConfig, ReceiverConfig
from tuneloop.storage.types import utcnow

API_PATH = "/api/v2/alerts"
HOLD_INTERVALS = 4
"""``endsAt`` of a firing alert: this many resend intervals ahead (Prometheus's factor)."""


def postable(
    alert: AlertMessage, *, now: datetime, hold: timedelta, external_url: str
) -> dict[str, Any]:
    """One alert of the ``postableAlerts`` body."""
    resolved = alert.event == "resolved"
    ends = (alert.ends_at or now) if resolved else now + hold * HOLD_INTERVALS
    body: dict[str, Any] = {
        "labels": {name: value for name, value in alert.labels.items() if value},
        "annotations": {name: value for name, value in alert.annotations.items() if value},
        "startsAt": rfc3339(alert.starts_at or now),
        "endsAt": rfc3339(ends),
    }
    if generator := alert.generator_url(external_url):
        body["generatorURL"] = generator
    return body


def auth_headers(config: AlertmanagerConfig) -> dict[str, str]:
    if config.username is not None and config.password is not None:
        pair = f"{config.username}:{config.password}".encode()
        return {"Authorization": "Basic " + base64.b64encode(pair).decode()}
    if config.bearer_token:
        return {"Authorization": f"Bearer {config.bearer_token}"}
    return {}


class AlertmanagerNotifier:
    def __init__(
        self,
        client: httpx.Client,
        *,
        eval_interval_s: float = 15.0,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.client = client
        self.eval_interval_s = eval_interval_s
        self.clock = clock

    def send(self, config: ReceiverConfig, message: GroupMessage) -> Outcome:
        """Every alert of the message to every Alertmanager in one request each; sent when one
        of them accepted it, as Prometheus counts a cluster (they gossip what they hold)."""
        assert isinstance(config, AlertmanagerConfig)
        now = self.clock()
        hold = timedelta(seconds=max(config.resend_interval_s, self.eval_interval_s))
        alerts = [
            postable(alert, now=now, hold=hold, external_url=message.external_url)
            for alert in message.alerts
        ]
        outcomes = [
            post_json(
                self.client,
                url + API_PATH,
                alerts,
                timeout_s=config.timeout_s,
                headers=auth_headers(config),
            )
            for url in config.urls
        ]
        for outcome in outcomes:
            if outcome.status == "sent":
                return outcome
        retry = [outcome for outcome in outcomes if outcome.status == "retry"]
        return retry[0] if retry else outcomes[0]
