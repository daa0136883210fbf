"""PagerDuty Events API v2: one ``trigger`` per firing alert and one ``resolve`` when it is
over, both with the same ``dedup_key`` (:attr:`AlertMessage.dedup_key`: the alert and when it
started firing), so PagerDuty opens one incident and closes it, however often a notification
is sent again. PagerDuty answers 202; 400 means the event
is invalid (not retried), 429 and 5xx are retried."""

from __future__ import annotations

from typing import Any

import httpx

from alerts.notifiers.base import AlertMessage, GroupMessage, Outcome, post_json, rfc3339
from alerts.notifiers.config import PagerDutyConfig, ReceiverConfig

SUMMARY_LIMIT = 1024
_SEVERITIES = {"critical": "critical", "error": "error", "warning": "warning", "info": "info"}


def event(alert: AlertMessage, config: PagerDutyConfig, external_url: str) -> dict[str, Any]:
    if alert.event == "resolved":
        return {
            "routing_key": config.routing_key,
            "event_action": "resolve",
            "dedup_key": alert.dedup_key,
        }
    labels = alert.labels
    summary = alert.annotations.get("summary") or labels.get("alertname", "alert")
    body: dict[str, Any] = {
        "routing_key": config.routing_key,
        "event_action": "trigger",
        "dedup_key": alert.dedup_key,
        "payload": {
            "summary": summary[:SUMMARY_LIMIT],
            "source": labels.get("Hostname")
            or labels.get("instance")
            or labels.get("job")
            or "tuneloop",
            "severity": _SEVERITIES.get(labels.get("severity", ""), "warning"),
            "timestamp": rfc3339(alert.starts_at),
            "class": labels.get("alertname", ""),
            "custom_details": {
                "labels": dict(labels),
                "annotations": dict(alert.annotations),
                "value": alert.value,
            },
        },
        "client": config.client,
    }
    if component := labels.get("gpu"):
        body["payload"]["component"] = f"gpu {component}"
    if group := labels.get("job"):
        body["payload"]["group"] = group
    client_url = config.client_url or external_url
    if client_url:
        body["client_url"] = client_url
    if runbook := alert.annotations.get("runbook_url"):
        body["links"] = [{"href": runbook, "text": "Runbook"}]
    return body


class PagerDutyNotifier:
    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    def send(self, config: ReceiverConfig, message: GroupMessage) -> Outcome:
        """One event per alert; the group's outcome is the worst of them (events already
        accepted are harmless to repeat: PagerDuty deduplicates on ``dedup_key``)."""
        assert isinstance(config, PagerDutyConfig)
        worst = Outcome.sent()
        for alert in message.alerts:
            outcome = post_json(
                self.client,
                config.url,
                event(alert, config, message.external_url),
                timeout_s=config.timeout_s,
            )
            if outcome.status == "failed":
                return outcome
            if outcome.status == "retry":
                worst = outcome
        return worst
