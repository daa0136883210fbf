"""Alertmanager's webhook payload, version 4: receivers written for Alertmanager work unchanged.

Fields as Alertmanager's ``notify/webhook`` sends them: ``version``, ``groupKey``,
``truncatedAlerts``, ``status``, ``receiver``, ``groupLabels``, ``commonLabels``,
``commonAnnotations``, ``externalURL`` and ``alerts`` (each with ``status``, ``labels``,
``annotations``, ``startsAt``, ``endsAt``, ``generatorURL`` and ``fingerprint``).

A message sent again (a sender that died before recording the outcome) carries the same
``Idempotency-Key`` header; each alert's ``fingerprint``, ``status`` and ``startsAt`` identify
its event in any case.
"""

from __future__ import annotations

from typing import Any

import httpx

from alerts.notifiers.base import GroupMessage, Outcome, post_json, rfc3339
from alerts.notifiers.config import ReceiverConfig, WebhookConfig


def payload(message: GroupMessage, max_alerts: int = 0) -> dict[str, Any]:
    alerts = list(message.alerts)
    truncated = 0
    if max_alerts and len(alerts) > max_alerts:
        truncated = len(alerts) - max_alerts
        alerts = alerts[:max_alerts]
    return {
        "version": "4",
        "groupKey": message.group_key,
        "truncatedAlerts": truncated,
        "status": message.status,
        "receiver": message.receiver,
        "groupLabels": dict(message.group_labels),
        "commonLabels": message.common_labels,
        "commonAnnotations": message.common_annotations,
        "externalURL": message.external_url,
        "alerts": [
            {
                "status": alert.event,
                "labels": dict(alert.labels),
                "annotations": dict(alert.annotations),
                "startsAt": rfc3339(alert.starts_at),
                "endsAt": rfc3339(alert.ends_at if alert.event == "resolved" else None),
                "generatorURL": alert.generator_url(message.external_url),
                "fingerprint": alert.fingerprint[:16],
            }
            for alert in alerts
        ],
    }


class WebhookNotifier:
    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    def send(self, config: ReceiverConfig, message: GroupMessage) -> Outcome:
        assert isinstance(config, WebhookConfig)
        headers = {"Idempotency-Key": message.idempotency_key}
        if config.bearer_token:
            headers["Authorization"] = f"Bearer {config.bearer_token}"
        return post_json(
            self.client,
            config.url,
            payload(message, config.max_alerts),
            timeout_s=config.timeout_s,
            headers=headers,
        )
